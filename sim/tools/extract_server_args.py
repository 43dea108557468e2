"""Regenerate sglang_sim/data/server_args.json from an unpacked SGLang wheel.

Usage (when the SGLang pin moves):
    pip download --no-deps sglang==X -d SRC && (cd SRC && unzip -q *.whl)
    python sim/tools/extract_server_args.py SRC X > sim/sglang_sim/data/server_args.json

Reads the field declarations of sglang/srt/arg_groups/fields/*.py with the ast module (nothing
is imported or executed) and records, per ServerArgs field, its default, and per command-line
flag, its destination field, kind (bool/int/float/str/list), choices and nargs. Flags that
server_args.py registers by hand are listed in MANUAL_FLAGS below.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys

MANUAL_FLAGS = {
    "--sampling-backend": {"dest": "sampling_backend", "kind": "str"},
    "--reasoning-parser": {"dest": "reasoning_parser", "kind": "str"},
    "--tool-call-parser": {"dest": "tool_call_parser", "kind": "str"},
    "--kv-canary-real-data": {"dest": "kv_canary_real_data", "kind": "str"},
    "--config": {"dest": "config", "kind": "str"},
    "--disable-cuda-graph": {"dest": "disable_cuda_graph", "kind": "bool"},
    "--enable-dp-attention": {"dest": "enable_dp_attention", "kind": "bool"},
    "--monokernel-backend": {"dest": "enable_amd_monokernel", "kind": "str", "choices": ["amd"]},
    "--enable-flashinfer-allreduce-fusion": {
        "dest": "enable_flashinfer_allreduce_fusion",
        "kind": "bool",
    },
}
# Flags whose nargs sits in Arg(action_kwargs=...), which is not a plain literal.
NARGS_FROM_ACTION_KWARGS = {"--lora-paths": "*"}


def _literal(node: ast.AST | None) -> tuple[object, bool]:
    if node is None:
        return None, True
    try:
        return ast.literal_eval(node), True
    except (ValueError, TypeError, SyntaxError):
        return None, False


def _kind(inner: str, action: object) -> str:
    bare = inner.removeprefix("Optional[").removesuffix("]")
    if isinstance(action, str) and "BooleanOptionalAction" in action:
        return "bool_optional"
    if action is not None:
        return "str"
    if bare == "bool":
        return "bool"
    if bare.lower().startswith("list"):
        return "list"
    if bare in ("int", "float"):
        return bare
    return "str"


def extract(src: pathlib.Path) -> dict:
    fields: dict[str, object] = {}
    flags: dict[str, dict] = {}
    for path in sorted((src / "sglang/srt/arg_groups/fields").glob("*.py")):
        tree = ast.parse(path.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for st in cls.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    continue
                name = st.target.id
                if name.startswith("_NS") or name in fields:
                    continue
                default, _ = _literal(st.value)
                fields[name] = default
                ann = st.annotation
                if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "A"):
                    continue
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                if len(elts) < 2:
                    continue
                meta: dict[str, object] = {}
                if isinstance(elts[1], ast.Call):
                    for kw in elts[1].keywords:
                        value, ok = _literal(kw.value)
                        meta[kw.arg] = value if ok else ast.unparse(kw.value)
                if meta.get("no_cli"):
                    continue
                kind = _kind(ast.unparse(elts[0]), meta.get("action"))
                choices = meta.get("choices") if isinstance(meta.get("choices"), list) else None
                names = [meta.get("cli_name") or "--" + name.replace("_", "-")]
                names += list(meta.get("aliases") or [])
                for flag in names:
                    flags[flag] = {"dest": name, "kind": kind, "choices": choices,
                                   "nargs": meta.get("nargs")}
                    if kind == "bool_optional":
                        flags["--no-" + flag[2:]] = {"dest": name, "kind": "bool_false",
                                                     "choices": None, "nargs": None}
    for flag, nargs in NARGS_FROM_ACTION_KWARGS.items():
        flags[flag]["nargs"] = nargs
    for flag, spec in MANUAL_FLAGS.items():
        flags.setdefault(flag, {"choices": None, "nargs": None, **spec})
        fields.setdefault(spec["dest"], None)
    return {"fields": fields, "flags": flags}


def main() -> None:
    src, version = pathlib.Path(sys.argv[1]), sys.argv[2]
    data = {"sglang_version": version, **extract(src)}
    json.dump(data, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
