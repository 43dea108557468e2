#!/usr/bin/env python3
"""Start sglang-router from files instead of argv (hicache-fleet's router role).

    launch.py ARGS.json [WORKERS.json]      start the router
    launch.py --check ARGS.json             parse ARGS.json with the router's own parser, start nothing

ARGS.json is a JSON list of command-line words (mode 0640: it carries the api keys, which must not
show in /proc/PID/cmdline or `ps`); WORKERS.json a JSON list of worker URLs the router starts
with (the role adds and removes workers at runtime through the router's API, without a restart).
"""

from __future__ import annotations

import json
import sys


def read_list(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        words = json.load(handle)
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        sys.exit(f"sglang-router launch: {path} must hold a JSON list of strings")
    return words


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    check = bool(argv) and argv[0] == "--check"
    if check:
        argv = argv[1:]
    if not 1 <= len(argv) <= 2:
        sys.exit(__doc__)
    words = read_list(argv[0])
    workers = read_list(argv[1]) if len(argv) == 2 else []
    if workers:
        words = [*words, "--worker-urls", *workers]
    args = parse_router_args(words)  # argparse: exits 2 with its message on a bad word
    if check:
        print(f"sglang-router arguments OK: policy {args.policy}, {len(args.worker_urls)} workers")
        return
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
