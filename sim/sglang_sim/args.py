"""SGLang 0.5.23's launch command line, parsed without importing SGLang.

The flag table (data/server_args.json) is extracted from the SGLang 0.5.23 wheel by
sim/tools/extract_server_args.py. Every flag in it is parsed as argparse would (type, choices,
nargs, unique-prefix abbreviations, ambiguous prefixes); a flag missing from the table is
accepted with whatever values follow it and reported as unknown. Flags the simulator does not act
on are collected so the server can log them once.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

PROG = "sglang serve"

# Flags whose values change what the simulator does (the list).
MODELLED_FLAGS = frozenset(
    {
        "host", "port", "model_path", "served_model_name", "tp_size", "context_length",
        "mem_fraction_static", "max_running_requests", "page_size", "enable_cache_report",
        "enable_metrics", "api_key", "enable_hierarchical_cache", "hicache_ratio",
        "hicache_size", "hicache_write_policy", "hicache_host_memory_mode", "tokenizer_path",
        "hicache_storage_backend", "disable_radix_cache", "log_level", "kv_cache_dtype", "dtype",
        # the hybrid model's Mamba device pool, which takes its share of --hicache-size (model.py)
        "max_mamba_cache_size", "mamba_ssm_dtype", "speculative_num_draft_tokens",
        # the L3 file storage (storage.py)
        "hicache_storage_backend_extra_config", "hicache_storage_prefetch_policy",
        "file_storage_path",
    }
)

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class UsageError(Exception):
    """A command-line error; argparse reports these with exit status 2."""


@dataclass
class LaunchArgs:
    values: dict[str, Any]  # every ServerArgs field, defaults overlaid with the command line
    given: list[str]  # destinations set on the command line, in order
    ignored_flags: list[str] = field(default_factory=list)  # in the table, not modelled
    unknown_flags: list[str] = field(default_factory=list)  # not in 0.5.23's table
    launch_command: str = ""

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def _table() -> dict[str, Any]:
    text = resources.files("sglang_sim").joinpath("data/server_args.json").read_text()
    return json.loads(text)


_TABLE: dict[str, Any] | None = None


def table() -> dict[str, Any]:
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    return _TABLE


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


def _resolve(name: str, flags: dict[str, Any]) -> tuple[str | None, dict | None]:
    if name in flags:
        return name, flags[name]
    if name.startswith("--"):
        matches = sorted(f for f in flags if f.startswith(name))
        if len(matches) == 1:
            return matches[0], flags[matches[0]]
        if len(matches) > 1:
            raise UsageError(
                f"ambiguous option: {name} could match {', '.join(matches)}"
            )
    return None, None


def _convert(flag: str, kind: str, raw: str, choices: list | None) -> Any:
    try:
        if kind == "int":
            value: Any = int(raw)
        elif kind == "float":
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise UsageError(f"argument {flag}: invalid {kind} value: {raw!r}") from None
    if choices is not None and value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise UsageError(f"argument {flag}: invalid choice: {raw!r} (choose from {listed})")
    return value


def merge_config(argv: list[str], flags: dict[str, Any]) -> list[str]:
    """``--config FILE.yaml`` as SGLang 0.5.23 merges it (srt/utils/server_args_config_parser.py).

    One --config only; the file must end in .yaml/.yml, exist and hold a mapping. Its keys become
    flags placed before the rest of argv (so the command line wins): a true switch adds the flag, a
    false one drops it, a list is an nargs flag, a mapping is passed as JSON. Parsed with PyYAML
    when installed, else as JSON (which is YAML); the process command line keeps only --config FILE.
    """
    where = [i for i, word in enumerate(argv) if word == "--config"]
    if not where:
        return argv
    if len(where) > 1:
        raise UsageError("Multiple config files specified! Only one allowed.")
    if where[0] == len(argv) - 1:
        raise UsageError("No config file specified after --config flag!")
    path = argv[where[0] + 1]
    if not path.lower().endswith((".yaml", ".yml")):
        raise UsageError(f"Config file must be YAML format, got: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise UsageError(f"Config file not found: {path} ({err.strerror})") from None
    try:
        import yaml  # type: ignore[import-untyped]

        data = yaml.safe_load(text)
    except ImportError:
        data = json.loads(text) if text.strip() else None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UsageError("Config file must contain a dictionary at root level")
    merged: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if flags.get(flag, {}).get("kind") == "bool":
                merged += [flag] if value else []
            else:
                merged += [flag, str(value).lower()]
        elif isinstance(value, list):
            merged += [flag, *(str(item) for item in value)] if value else []
        elif isinstance(value, dict):
            merged += [flag, json.dumps(value)]
        else:
            merged += [flag, str(value)]
    return merged + argv[: where[0]] + argv[where[0] + 2 :]


def parse_argv(argv: list[str]) -> LaunchArgs:
    data = table()
    flags: dict[str, Any] = data["flags"]
    argv = merge_config(argv, flags)
    values: dict[str, Any] = dict(data["fields"])
    given: list[str] = []
    ignored: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not _looks_like_flag(token):
            raise UsageError(f"unrecognized arguments: {' '.join(argv[i:])}")
        inline: str | None = None
        name = token
        if "=" in token:
            name, inline = token.split("=", 1)
        canonical, spec = _resolve(name, flags)
        i += 1
        follow: list[str] = []
        while i + len(follow) < len(argv) and not _looks_like_flag(argv[i + len(follow)]):
            follow.append(argv[i + len(follow)])
        if spec is None:
            unknown.append(name)
            i += 0 if inline is not None else len(follow)
            continue
        dest, kind, nargs = spec["dest"], spec["kind"], spec.get("nargs")
        choices = spec.get("choices")
        if kind in ("bool", "bool_optional", "bool_false"):
            if inline is not None:
                raise UsageError(f"argument {canonical}: ignored explicit argument {inline!r}")
            value: Any = kind != "bool_false"
        elif kind == "list" or nargs in ("*", "+"):
            raw = [inline] if inline is not None else follow
            if not raw and nargs != "*":
                raise UsageError(f"argument {canonical}: expected at least one argument")
            elem = "str" if kind == "list" else kind
            value = [_convert(canonical, elem, r, choices) for r in raw]
            if kind == "list":
                value = [_maybe_number(v) for v in value]
            i += 0 if inline is not None else len(raw)
        elif nargs == "?":
            raw_one = inline if inline is not None else (follow[0] if follow else None)
            value = None if raw_one is None else _convert(canonical, kind, raw_one, choices)
            i += 0 if inline is not None or raw_one is None else 1
        else:
            if inline is not None:
                raw_one = inline
            elif follow:
                raw_one = follow[0]
                i += 1
            else:
                raise UsageError(f"argument {canonical}: expected one argument")
            value = _convert(canonical, kind, raw_one, choices)
        values[dest] = value
        if dest not in given:
            given.append(dest)
        if dest not in MODELLED_FLAGS and canonical not in ignored:
            ignored.append(canonical)
        # Tokens after a single-valued flag that are not flags are errors in argparse.
        while i < len(argv) and not _looks_like_flag(argv[i]):
            raise UsageError(f"unrecognized arguments: {' '.join(argv[i:])}")
    args = LaunchArgs(values=values, given=given, ignored_flags=ignored, unknown_flags=unknown,
                      launch_command=shlex.join(argv))
    _check_modelled(args)
    return args


def _maybe_number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _check_modelled(args: LaunchArgs) -> None:
    v = args.values
    if not v.get("model_path"):
        raise UsageError("the following arguments are required: --model-path")

    def need(cond: bool, flag: str, message: str) -> None:
        if not cond:
            raise UsageError(f"argument {flag}: {message}")

    need(1 <= int(v["port"]) <= 65535, "--port", f"invalid port: {v['port']}")
    need(int(v["tp_size"]) >= 1, "--tp-size", "must be >= 1")
    if v.get("mem_fraction_static") is not None:
        mfs = float(v["mem_fraction_static"])
        need(0.0 < mfs < 1.0, "--mem-fraction-static", f"must be in (0, 1), got {mfs}")
    if v.get("page_size") is not None:
        need(int(v["page_size"]) >= 1, "--page-size", "must be >= 1")
    if v.get("max_running_requests") is not None:
        need(int(v["max_running_requests"]) >= 1, "--max-running-requests", "must be >= 1")
    if v.get("context_length") is not None:
        need(int(v["context_length"]) >= 1, "--context-length", "must be >= 1")
    need(int(v["hicache_size"]) >= 0, "--hicache-size", "must be >= 0")
    if v.get("hicache_ratio") is not None:
        need(float(v["hicache_ratio"]) > 0, "--hicache-ratio", "must be > 0")
    if v.get("enable_hierarchical_cache"):
        need(not v.get("disable_radix_cache"), "--enable-hierarchical-cache",
             "not allowed with --disable-radix-cache")
        if v.get("hicache_host_memory_mode") == "buffer_only":
            need(bool(v.get("hicache_storage_backend")), "--hicache-host-memory-mode",
                 "buffer_only requires --hicache-storage-backend")


def usage_exit(error: UsageError) -> None:
    """Print an argparse-style usage error and exit 2, as SGLang's parser does."""
    sys.stderr.write(f"usage: {PROG} [-h] [--model-path MODEL_PATH] [--port PORT] ...\n")
    sys.stderr.write(f"{PROG}: error: {error}\n")
    sys.exit(2)
