#!/usr/bin/env python3
"""Writes the demo fleet's fixture models on the controller: a main model shaped like the field
report's 27B (config.json from the simulator's fixture writer, so its KV bytes per token are
realistic) and a tiny draft, each with a few MB of random weights and a sha256 manifest that
roles/models verifies on the hosts. Idempotent: existing files are kept.

    fixture_models.py OUT_DIR   ->  OUT_DIR/<name>/..., OUT_DIR/<name>.manifest.yml
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sim"))

from sglang_sim.fixture_model import write_model_dir  # noqa: E402

MODELS = {
    # name: (simulator profile, {weight file: size in KiB})
    "demo-27b-w4a16": (
        "seed-27b",
        {"model-00001-of-00002.safetensors": 2048, "model-00002-of-00002.safetensors": 1024},
    ),
    "demo-27b-dflash-draft": ("tiny", {"model.safetensors": 512}),
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(out: Path) -> None:
    for name, (profile, weights) in MODELS.items():
        model = out / name
        if not (model / "config.json").exists():
            write_model_dir(model, profile)
        for filename, kib in weights.items():
            path = model / filename
            if not path.exists():
                # Deterministic bytes, so a re-created fixture has the same manifest.
                seed = hashlib.sha256(f"{name}/{filename}".encode()).digest()
                blocks = (hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(kib * 32))
                path.write_bytes(b"".join(blocks))
        lines = [f"# {name}: every file with its sha256 and size (scripts/fixture_models.py)"]
        for path in sorted(p for p in model.rglob("*") if p.is_file()):
            rel = path.relative_to(model).as_posix()
            lines += [f"- path: {rel}", f"  sha256: {sha256(path)}", f"  size: {path.stat().st_size}"]
        (out / f"{name}.manifest.yml").write_text("\n".join(lines) + "\n")
        print(f"fixture model {model}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write(Path(sys.argv[1]))
