"""``python -m sglang_sim.launch_server <SGLang 0.5.23 launch argv>``: the SIMULATOR's entry point.

A foreground process that logs to stderr and exits cleanly (status 0) on SIGTERM or SIGINT, so
the systemd unit that runs ``python -m sglang.launch_server`` can run it with only the module name
swapped. Exit status 2: a command-line error (as SGLang's argparse); 1: a startup failure.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from . import LOG_TAG, SGLANG_VERSION, SIM_VERSION
from .args import LaunchArgs, UsageError, parse_argv, usage_exit
from .engine import Engine, StorageError
from .model import StartupError, check_host_memory, read_model, size_pools
from .server import SimState, make_server, serve_in_thread
from .settings import Settings, SettingsError, load_settings

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class Logger:
    def __init__(self, level: str = "info") -> None:
        self.threshold = _LEVELS.get(str(level).lower(), 20)
        self.lock = threading.Lock()

    def __call__(self, message: str, level: str = "info") -> None:
        if _LEVELS.get(level, 20) < self.threshold:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        tag = "" if level == "info" else f" {level.upper()}"
        with self.lock:
            sys.stderr.write(f"[{stamp}] {LOG_TAG}{tag} {message}\n")
            sys.stderr.flush()


def _fail(log: Logger, message: str) -> int:
    log("SIMULATOR startup failed (as SGLang would, with a traceback):", level="error")
    sys.stderr.write("Traceback (most recent call last):\n  File \"sglang_sim\", simulated\n")
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()
    return 1


def _log_flags(log: Logger, args: LaunchArgs) -> None:
    if args.ignored_flags:
        log("SIMULATOR accepts but does not model these SGLang flags: "
            + " ".join(args.ignored_flags))
    if args.unknown_flags:
        log("SIMULATOR: flags not in SGLang 0.5.23's flag table (the real server would exit 2): "
            + " ".join(args.unknown_flags), level="warning")


def run(argv: list[str], settings: Settings | None = None) -> int:
    try:
        args = parse_argv(argv)
    except UsageError as err:
        usage_exit(err)
    log = Logger(args.values.get("log_level") or "info")
    try:
        settings = settings or load_settings()
    except SettingsError as err:
        log(f"SIMULATOR settings error: {err}", level="error")
        return 1
    log(f"SIMULATOR sglang-sim {SIM_VERSION} standing in for SGLang {SGLANG_VERSION} "
        "(a test double: no model runs, no GPU is used)")
    _log_flags(log, args)
    stop = threading.Event()

    def on_signal(signum: int, _frame) -> None:
        log(f"SIMULATOR received {signal.Signals(signum).name}; shutting down")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        model = read_model(args.model_path)
        v = args.values
        if v.get("context_length") is None:
            v["context_length"] = model.max_position_embeddings
        if v.get("page_size") is None:
            v["page_size"] = 1
        if v.get("mem_fraction_static") is None:
            v["mem_fraction_static"] = 0.8
        if v.get("served_model_name") is None:
            v["served_model_name"] = v["model_path"]
        if v.get("tokenizer_path") is None:
            v["tokenizer_path"] = v["model_path"]
        if v.get("enable_hierarchical_cache") and v.get("hicache_ratio") is None:
            v["hicache_ratio"] = 1.2 if v.get("hicache_host_memory_mode") == "buffer_only" else 2.0
        if (v.get("enable_hierarchical_cache") and v.get("hicache_host_memory_mode") == "buffer_only"
                and v.get("hicache_write_policy") == "write_back"):
            # hicache_hook.validate_hicache_host_memory_mode: buffer_only has no host tier
            v["hicache_write_policy"] = "write_through"
            log("--hicache-host-memory-mode buffer_only resolves --hicache-write-policy "
                "write_back to write_through (SIMULATOR, as SGLang 0.5.23)")
        sizes = size_pools(model, v, settings)
    except StartupError as err:
        return _fail(log, str(err))
    try:
        engine = Engine(v, model, sizes, settings, log)
    except StorageError as err:
        return _fail(log, f"ValueError: Failed to create storage backend: {err}")
    if v.get("max_running_requests") is None:
        v["max_running_requests"] = engine.max_running
    state = SimState(args, model, sizes, settings, engine, log)
    try:
        server = make_server(state, v["host"], int(v["port"]))
    except OSError as err:
        return _fail(log, f"OSError: [Errno {err.errno}] can't bind {v['host']}:{v['port']}: "
                          f"{err.strerror}")
    serve_in_thread(server)
    log(f"SIMULATOR listening on http://{v['host']}:{v['port']} (health answers 503 while "
        f"the model loads, {settings.load_delay_s:g} s)")
    t0 = time.monotonic()
    log(f"Load weight begin. model={v['model_path']} tp_size={v['tp_size']} (SIMULATED)")
    if "startup_exit" in settings.faults:
        stop.wait(settings.load_delay_s / 2)
        server.shutdown()
        return _fail(log, "ValueError: Not enough host memory available. Requesting "
                          "24.00 GB but only have 11.50 GB free. Please reduce the size of the "
                          "hierarchical cache. [sglang-sim SIMULATOR fault startup_exit]")
    if stop.wait(settings.load_delay_s):
        server.shutdown()
        return 0
    if sizes.host_tokens:
        try:
            check_host_memory(sizes, int(v["tp_size"]), settings)
        except StartupError as err:
            server.shutdown()
            return _fail(log, str(err))
        log(f"Allocating HiCache host pool: {sizes.host_tokens} tokens per rank, "
            f"{sizes.host_bytes_requested_per_rank / 1e9:.2f} GB per rank (SIMULATED: "
            "no memory is pinned)")
    log(f"KV Cache is allocated. #tokens: {sizes.device_tokens}, "
        f"kv bytes/token/rank: {sizes.kv_bytes_per_token} (SIMULATED)")
    log(
        f"max_total_num_tokens={sizes.device_tokens}, "
        f"chunked_prefill_size={v.get('chunked_prefill_size')}, "
        f"max_prefill_tokens={v.get('max_prefill_tokens')}, "
        f"max_running_requests={engine.max_running}, context_len={engine.context_len}, "
        f"available_gpu_mem={sizes.available_gpu_gb:.2f} GB"
    )
    state.startup_time = time.monotonic() - t0
    if "never_healthy" in settings.faults:
        log("SIMULATOR fault never_healthy: /health will keep answering 503", level="warning")
    else:
        state.status = "up"
        log("The server is fired up and ready to roll!")
    if settings.faults:
        log(f"SIMULATOR faults active: {settings.fault}", level="warning")
    stop.wait()
    server.shutdown()
    server.server_close()
    log("SIMULATOR stopped")
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
