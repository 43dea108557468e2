#!/usr/bin/env python3
"""Write SGLang's launch flag table as JSON, read off its own argparse parser.

Usage (with a python that can import the pinned SGLang, e.g. a test-minimal venv):
    <venv>/bin/python roles/sglang_service/files/dump_sglang_flags.py > roles/sglang_service/files/sglang-flags.json

Builds the parser exactly as `prepare_server_args` does (argparse.ArgumentParser(prog="sglang
serve") + ServerArgs.add_cli_args) and records, per option string: its destination, the kind of
value (switch, int, float, str, or the converter's name), choices, nargs and whether argparse's
abbreviation matching applies. the role's checks (sglang_service_argv_findings) check a rendered argv
against this table on the controller, before any host is touched.
"""

from __future__ import annotations

import argparse
import json
import sys

SWITCH_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
                  argparse._CountAction)


def _kind(action: argparse.Action) -> str:
    if isinstance(action, SWITCH_ACTIONS):
        return "switch"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "switch"
    converter = action.type
    if converter in (int, float, str):
        return converter.__name__
    if converter is None:
        return "str"
    return "callable:" + getattr(converter, "__name__", type(converter).__name__)


def _plain(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    return str(value)


def main() -> int:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags: dict[str, dict] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        entry = {
            "dest": action.dest,
            "kind": _kind(action),
            "choices": sorted(_plain(action.choices), key=str) if action.choices is not None else None,
            "nargs": action.nargs if isinstance(action.nargs, (str, int, type(None))) else str(action.nargs),
            "required": bool(action.required),
        }
        for option in action.option_strings:
            flags[option] = entry
    table = {
        "sglang_version": getattr(sglang, "__version__", "unknown"),
        "source": "argparse parser of sglang.srt.server_args.ServerArgs.add_cli_args (prepare_server_args)",
        "allow_abbrev": parser.allow_abbrev,
        "flags": dict(sorted(flags.items())),
    }
    json.dump(table, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
