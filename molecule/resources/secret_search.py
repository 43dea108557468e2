"""Where a scenario's secrets are after its runs (issue 24): one search, shared by the scenarios'
verify files (molecule/sglang_service, molecule/ab_benchmark).

- every file of a test host: one fixed-string grep over the whole filesystem but /proc, /sys and
  /dev (the top-level ones only: a directory of that name elsewhere is searched; symlinks are not
  followed, so each file is read once), then, for each file it names, which keys it holds, its
  mode and owner;
- the rule a hit must follow there (`misplaced`): a secrets file (`secrets`, `secrets.yaml`,
  `*.secrets.yaml`) owned by root (or systemd's copy under /run/credentials/), not readable by
  others; or a journal file (root, group root, systemd-journal or adm, not readable by others);
- the journal as `journalctl` shows it, to root (by the unit that logged each key) and to another
  user (journald may compress a long entry, so a grep of its files does not see every key it holds);
- files on the controller: every file under the given directories (optionally only those modified
  since a time), reading each one whole.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Never searched: the kernel's and the devices' pseudo files.
PSEUDO = ("/proc", "/sys", "/dev")
JOURNAL_DIRS = ("/var/log/journal/", "/run/log/journal/")
JOURNAL_GROUPS = ("root", "systemd-journal", "adm")
# On the test host, never searched (/dev), root 0600: the keys for grep -f.
PATTERNS = "/dev/shm/secret-search.patterns"  # noqa: S108


@dataclass(frozen=True)
class Hit:
    path: str
    mode: int
    owner: str
    group: str
    keys: frozenset[str]

    def __str__(self) -> str:
        return f"{self.path} ({self.mode:o} {self.owner}:{self.group})"


def secrets_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name in ("secrets", "secrets.yaml") or name.endswith(".secrets.yaml")


def _pattern_file(host, keys: Iterable[str]) -> str:
    """The keys, one a line, in a file under /dev/shm on the host (root 0600; /dev is never searched),
    for grep -f. The keys travel base64-encoded: the command line that writes them, which Ansible's
    module logs to the host's journal (testinfra's ansible backend), does not hold one."""
    keys = sorted(set(keys))
    assert keys, "no key to search for"
    assert all(key and "\n" not in key for key in keys), "a key must be one non-empty line"
    encoded = base64.b64encode(("\n".join(keys) + "\n").encode()).decode()
    host.check_output(f"umask 077 && echo {encoded} | base64 -d > {PATTERNS}")
    return PATTERNS


def host_hits(host, keys: Iterable[str], exclude: Iterable[str] = ()) -> list[Hit]:
    """Every file of the test host (testinfra `host`) that holds one of `keys`, with the keys it holds.
    `exclude`: more top-level directories to leave out (say why where it is used)."""
    patterns = _pattern_file(host, keys)
    skip = {*PSEUDO, *exclude}
    # The top-level directories (not /bin -> usr/bin and the like: grep follows a symlink it is given).
    tops = host.check_output("find / -mindepth 1 -maxdepth 1 ! -type l").splitlines()
    roots = " ".join(shlex.quote(top) for top in sorted(tops) if top not in skip)
    # grep -l names each file once; the second grep lists which keys it holds (-a: a binary file's
    # matches too; -o: only the match).
    script = (
        f"grep -rlF -f {patterns} -- {roots} 2>/dev/null | while IFS= read -r f; do "
        f"printf '%s\\t%s\\t' \"$f\" \"$(stat -c '%a %U %G' -- \"$f\")\"; "
        f"grep -aohF -f {patterns} -- \"$f\" | sort -u | tr '\\n' '\\t'; echo; done; rm -f {patterns}"
    )
    found = host.run(script)
    assert found.rc == 0, found.stderr
    hits = []
    for line in found.stdout.splitlines():
        path, stat, *held = line.rstrip("\t").split("\t")
        mode, owner, group = stat.split()
        hits.append(Hit(path, int(mode, 8), owner, group, frozenset(held)))
    return hits


def misplaced(hits: Iterable[Hit]) -> list[Hit]:
    """The hits outside a root-only secrets file or journald's own files."""
    wrong = []
    for hit in hits:
        other_can_read = hit.mode & 0o004
        if hit.path.startswith(JOURNAL_DIRS):
            ok = hit.owner == "root" and hit.group in JOURNAL_GROUPS and not other_can_read
        else:
            ok = secrets_file(hit.path) and not other_can_read and (
                hit.owner == "root" or hit.path.startswith("/run/credentials/"))
        if not ok:
            wrong.append(hit)
    return wrong


def journal_keys(host, keys: Iterable[str]) -> dict[str, dict[str, int]]:
    """As root: how often each key is in the journal's messages, by the unit that logged them
    ({unit: {key: count}}; "" holds the messages of no unit): `journalctl -a -o cat`, the messages as
    journald stores them (decompressed, unprintable ones whole), once for the whole journal and once
    per unit (_SYSTEMD_UNIT=)."""
    keys = sorted(set(keys))
    patterns = _pattern_file(host, keys)
    count = f"grep -aoF -f {patterns} | sort | uniq -c"
    script = (
        f"echo '*'; journalctl --no-pager -q -a -o cat | {count}; "
        "for u in $(journalctl -q -F _SYSTEMD_UNIT); do echo \"=$u\"; "
        f"journalctl --no-pager -q -a -o cat _SYSTEMD_UNIT=\"$u\" | {count}; done"
    )
    result = host.run(script)
    host.run(f"rm -f {PATTERNS}")
    assert result.rc == 0, result.stderr
    total: dict[str, int] = {}
    by_unit: dict[str, dict[str, int]] = {}
    section = total
    for line in result.stdout.splitlines():
        if line == "*":
            section = total
        elif line.startswith("="):
            section = by_unit.setdefault(line[1:], {})
        elif line.strip():
            number, key = line.split(None, 1)
            section[key] = section.get(key, 0) + int(number)
    # What no unit logged: the whole journal's count less the units' (kernel, sessions without one).
    rest = {key: total.get(key, 0) - sum(unit.get(key, 0) for unit in by_unit.values()) for key in keys}
    found = {unit: counts for unit, counts in by_unit.items() if counts}
    if any(rest.values()):
        found[""] = {key: number for key, number in rest.items() if number}
    return found


def journal_as(host, user: str) -> str:
    """The whole journal as `user` is shown it by journalctl (stdout and stderr)."""
    result = host.run("runuser -u %s -- journalctl --no-pager -q -o cat", user)
    return result.stdout + result.stderr


def controller_hits(roots: Iterable[Path], keys: Iterable[str], since: float | None = None,
                    skip: Iterable[Path] = ()) -> dict[str, list[str]]:
    """Files under `roots` on the controller (symlinks not followed) that hold a key: {path: keys}.
    `since`: only files modified at or after that time; `skip`: files and directories left out."""
    keys = sorted(set(keys))
    skipped = [Path(p).resolve() for p in skip]
    hits: dict[str, list[str]] = {}
    for root in roots:
        root = Path(root)
        if not root.exists():
            continue
        files = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        for path in files:
            resolved = path.resolve()
            if any(resolved == s or s in resolved.parents for s in skipped):
                continue
            try:
                if since is not None and path.stat().st_mtime < since:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            held = [key for key in keys if key.encode() in data]
            if held:
                hits[str(path)] = held
    return hits
