"""The benchmarks' `--record` (a helper, not a benchmark: `make bench` runs it and it only says so).

A benchmark run with --record tees what it prints and, when it ends without an error, rewrites its
own block of docs/benchmarks.md with that output, the date, the machine's load average before and
after, and its core count. Only that block changes:

    <!-- BEGIN recorded: NAME -->
    ...
    <!-- END recorded: NAME -->

Used by each benchmark's `if __name__ == "__main__":` line: sys.exit(record.run(main, "NAME")).
A benchmark that cannot measure here (the fleet it needs is not up) raises Skipped("why"): the run
prints why and exits 0, and its block is left as it was (`make bench` goes on with the next one).
"""

from __future__ import annotations

import io
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
FLAG = "--record"


class Skipped(Exception):
    """Raised by a benchmark's main() that cannot measure here: exit 0, nothing recorded."""


def block(name: str, output: str, when: str, load_before: tuple, load_after: tuple, cores: int | None) -> str:
    """The recorded block of one benchmark: the markers, who wrote it and when, the machine, the output."""
    load = " → ".join(", ".join(f"{x:.2f}" for x in la) for la in (load_before, load_after))
    return (
        f"<!-- BEGIN recorded: {name} -->\n"
        f"Written by `benchmarks/{name}.py --record` on {when} ({cores or '?'} cores, {platform.machine()}; "
        f"load average 1/5/15 min before → after: {load}):\n\n"
        f"```text\n{output.rstrip()}\n```\n"
        f"<!-- END recorded: {name} -->"
    )


def write_block(doc: Path, name: str, body: str) -> None:
    """Replace the block of benchmark NAME in doc with body (a whole block, markers included)."""
    text = doc.read_text(encoding="utf-8")
    pattern = re.compile(
        rf"<!-- BEGIN recorded: {re.escape(name)} -->\n.*?<!-- END recorded: {re.escape(name)} -->", re.S
    )
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{doc}: expected exactly one block '<!-- BEGIN recorded: {name} -->' ... END")
    doc.write_text(pattern.sub(lambda _m: body, text, count=1), encoding="utf-8")


class _Tee(io.TextIOBase):
    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


def run(main: Callable[[], int | None], name: str, doc: Path = DOC, argv: list[str] | None = None) -> int:
    """Run a benchmark's main(); with --record in argv (default sys.argv), record what it printed."""
    args = sys.argv[1:] if argv is None else argv
    if FLAG not in args:
        try:
            return main() or 0
        except Skipped as why:
            print(f"{name}: skipped: {why}")
            return 0
    before = os.getloadavg()
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        code = main() or 0
    except Skipped as why:
        print(f"{name}: skipped: {why}")
        print(f"record: {name} measured nothing; {doc} left as it was", file=sys.stderr)
        return 0
    finally:
        sys.stdout = tee.stream
    if code != 0:
        print(f"record: {name} exited {code}; {doc} left as it was", file=sys.stderr)
        return code
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_block(doc, name, block(name, tee.copy.getvalue(), when, before, os.getloadavg(), os.cpu_count()))
    print(f"record: {name}'s figures written to {doc}")
    return 0


if __name__ == "__main__":
    print("benchmarks/record.py is the other benchmarks' --record helper, not a benchmark: nothing to measure")
