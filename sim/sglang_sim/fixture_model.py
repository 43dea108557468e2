"""Write a small fixture model directory for the simulator and for tests that need a model path.

``write_model_dir(path, profile="seed-27b")`` writes config.json shaped like the seed's model (a
27B hybrid: 64 layers of which every 4th is full attention, 4 KV heads of dim 256, bf16 KV, GPTQ
4-bit weights) so the KV bytes per token are realistic, plus a tiny tokenizer_config.json and a
README saying it is a fixture. It holds no weights.

CLI: ``python -m sglang_sim.fixture_model PATH [--profile seed-27b|tiny]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_SEED_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "full_attention_interval": 4,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rope_theta": 10000000,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 248044,
    "eos_token_id": 248046,
    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
}

_TINY: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

PROFILES: dict[str, dict[str, Any]] = {"seed-27b": _SEED_27B, "tiny": _TINY}

_TOKENIZER_CONFIG = {
    "tokenizer_class": "SglangSimTokenizer",
    "model_max_length": None,
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "chat_template": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}

_README = (
    "# sglang-sim fixture model ({profile})\n\n"
    "A FIXTURE for the SGLang SIMULATOR (sglang_sim): a config.json shaped like a real model so\n"
    "the simulator's KV-cache arithmetic is realistic, and no weights. A real SGLang server\n"
    "cannot load it.\n"
)


def write_model_dir(path: str | Path, profile: str = "seed-27b") -> Path:
    """Write the fixture model directory and return its path."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; one of {', '.join(PROFILES)}")
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    config = dict(PROFILES[profile])
    tokenizer = dict(_TOKENIZER_CONFIG, model_max_length=config["max_position_embeddings"])
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    (target / "README.md").write_text(_README.format(profile=profile))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_sim.fixture_model",
        description="Write a fixture model directory (config only, no weights) for sglang-sim.",
    )
    parser.add_argument("path")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="seed-27b")
    args = parser.parse_args(argv)
    print(write_model_dir(args.path, args.profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
