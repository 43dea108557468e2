"""sglang-sim: a SIMULATOR (test double) of an SGLang 0.5.23 server with HiCache.

It speaks SGLang's HTTP API and models its prefix cache and prefill timing; it runs no model and
needs no GPU. Start it with ``python -m sglang_sim.launch_server <SGLang launch argv>``.
"""

SIM_VERSION = "0.1.0"
SGLANG_VERSION = "0.5.23"
LOG_TAG = "[sglang-sim]"

__version__ = SIM_VERSION
