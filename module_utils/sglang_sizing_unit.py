# hicache-fleet: the temporary systemd unit of one HiCache sizing candidate (library/sglang_sizing_unit.py).
# Runs on the managed host with its system Python: standard library only.
"""A sizing candidate runs from a temporary unit derived from the host's current release, so the
release itself (``<state>/<instance>/current -> releases/<id>/``) never changes.

The release directory holds ``unit`` (the exact text systemd runs for the real instance, rendered
from roles/sglang_service/templates/sglang.service.j2) and ``argv.json`` (SGLang's argv list). The
candidate unit is that text with:

- ExecStart rebuilt from argv.json with the overrides applied (a flag keeps its place, a new one is
  appended, ``None``/``False`` drop it), quoted exactly as the role's ``sglang_service_systemd_quote``
  quotes, one flag per continuation line as the template writes it, and the ``--config
  %d/secrets.yaml`` tail (with its LoadCredential=) kept when the release has one;
- ``Restart=no`` and ``RuntimeMaxSec=`` (replacing any the release has);
- ``Conflicts=`` and ``OnFailure=`` the real unit (starting the candidate stops the real instance;
  a crash or RuntimeMaxSec of the candidate starts it again);
- a Description naming it a sizing candidate, a header comment naming the release, and no
  [Install] section (a runtime unit nothing enables);

and every other line (User, sandboxing, EnvironmentFile, LimitMEMLOCK, paths, caches) unchanged.

The release's ExecStart must be what argv.json says (same words once systemd's quoting and the
``%d`` specifier are resolved): a unit edited by hand is refused, never guessed at.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile

UNIT_MODE = 0o644
FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9-]*$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?\.service$")
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# Flags a sizing candidate may not set: the api keys reach SGLang only through the secrets file the
# unit loads as a credential (--config %d/secrets.yaml), never argv.
FORBIDDEN_FLAGS = ("--config", "--api-key", "--admin-api-key")
CONFIG_TAIL = "--config %d/secrets.yaml"
INDENT = "    "
# Directives of the release's unit the candidate replaces (section, key).
REPLACED = {("Unit", "Description"), ("Service", "Restart"), ("Service", "RuntimeMaxSec")}


class SizingUnitError(Exception):
    """A refusal: the message names the option and the fix. Nothing was written."""


def systemd_quote(word):
    """One ExecStart word as roles/sglang_service/filter_plugins/sglang_service.py's systemd_quote writes it."""
    text = str(word)
    if "\n" in text or "\0" in text:
        raise SizingUnitError("a systemd ExecStart word may not contain a newline or NUL")
    text = text.replace("%", "%%").replace("$", "$$")
    if text == ";":
        return "\\;"
    if text and _PLAIN_WORD.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


_ESCAPES = {"\\": "\\", '"': '"', "'": "'", ";": ";", "n": "\n", "t": "\t", " ": " "}


def split_exec(value):
    """systemd's word splitting of an ExecStart value: [(raw word, unquoted word)] (quotes and backslash
    escapes resolved; specifiers and $ not yet). Raises ValueError on syntax it cannot read."""
    words, i, n = [], 0, len(value)
    while i < n:
        if value[i].isspace():
            i += 1
            continue
        start, out, quote = i, [], None
        while i < n and (quote or not value[i].isspace()):
            char = value[i]
            if char == "\\":
                if i + 1 >= n or value[i + 1] not in _ESCAPES:
                    raise ValueError(f"an escape this module does not read at {value[i:i + 2]!r}")
                out.append(_ESCAPES[value[i + 1]])
                i += 2
                continue
            if quote and char == quote:
                quote = None
            elif not quote and char in "\"'":
                quote = char
            else:
                out.append(char)
            i += 1
        if quote:
            raise ValueError("an unterminated quote")
        words.append((value[start:i], "".join(out)))
    return words


def resolve(word, credentials_dir):
    """A word's value as the process gets it: %% and $$ undoubled, %d the unit's credentials directory."""
    def specifier(match):
        if match.group(1) == "%":
            return "%"
        if match.group(1) == "d":
            return credentials_dir
        raise ValueError(f"the specifier %{match.group(1)} (this module expands only %d and %%)")

    def dollar(match):
        if match.group(0) == "$$":
            return "$"
        raise ValueError(f"the variable {match.group(0)} (ExecStart words must not expand variables)")

    text = re.sub(r"%(.)", specifier, word)
    return re.sub(r"\$\$|\$\{?[A-Za-z_]", dollar, text)


def unit_lines(text):
    """The unit's lines, with each ExecStart's continuation lines joined: [(start, end, line)] (end
    exclusive, in physical line indices)."""
    physical = text.split("\n")
    joined, i = [], 0
    while i < len(physical):
        start, line = i, physical[i]
        while line.endswith("\\") and not line.lstrip().startswith(("#", ";")) and i + 1 < len(physical):
            i += 1
            line = line[:-1] + " " + physical[i]
        i += 1
        joined.append((start, i, line))
    return physical, joined


def read_release(release_dir, unit):
    """The release's unit text and argv list; SizingUnitError naming what is missing or wrong."""
    texts = {}
    for name in ("unit", "argv.json"):
        path = os.path.join(release_dir, name)
        try:
            with open(path, encoding="utf-8") as handle:
                texts[name] = handle.read()
        except FileNotFoundError:
            raise SizingUnitError(
                f"release_dir {release_dir!r} has no {name}: point release_dir at a release the sglang_service role "
                "staged (<state>/<instance>/current or releases/<id>), which holds unit and argv.json") from None
        except OSError as exc:
            raise SizingUnitError(f"release_dir {release_dir!r}: cannot read {name}: {exc}") from None
    try:
        argv = json.loads(texts["argv.json"])
    except ValueError as exc:
        raise SizingUnitError(f"release_dir {release_dir!r}: argv.json is not JSON ({exc}); restage the release "
                              "with the sglang_service role") from None
    if not isinstance(argv, list) or not all(isinstance(word, str) for word in argv):
        raise SizingUnitError(f"release_dir {release_dir!r}: argv.json is not a list of strings; restage the release "
                              "with the sglang_service role")
    record_path = os.path.join(release_dir, "release.json")
    if os.path.exists(record_path):
        try:
            with open(record_path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            record = {}
        recorded = record.get("unit") if isinstance(record, dict) else None
        if recorded and recorded != unit:
            raise SizingUnitError(f"release_dir {release_dir!r} is a release of {recorded}, not of unit {unit}: "
                                  "pass the unit and the release of the same instance")
    return texts["unit"], argv


def parse_exec(unit_text, argv, unit, release_dir):
    """Where the ExecStart is and what it runs: (first line, end line, python, module, config tail?).

    Refuses when the ExecStart's SGLang words are not argv.json's (the unit was edited)."""
    joined = unit_lines(unit_text)[1]
    execs = [(start, end, line) for start, end, line in joined if line.startswith("ExecStart=")]
    if len(execs) != 1:
        raise SizingUnitError(f"release_dir {release_dir!r}: its unit has {len(execs)} ExecStart= lines, not one; "
                              "restage the release with the sglang_service role")
    start, end, line = execs[0]
    mismatch = (f"release_dir {release_dir!r}: the unit's ExecStart does not run what argv.json says "
                "(the unit was edited by hand?); refusing to guess. Restage the release with the sglang_service "
                "role (site.yml) so that unit and argv.json agree")
    credentials = f"/run/credentials/{unit}"
    try:
        words = [(raw, resolve(value, credentials)) for raw, value in split_exec(line[len("ExecStart="):])]
    except ValueError as exc:
        raise SizingUnitError(f"{mismatch}: it uses {exc}") from None
    if len(words) < 3 or words[1][1] != "-m":
        raise SizingUnitError(f"{mismatch}: it is not '<python> -m <module> <args>'")
    rest = words[3:]
    tail = [word[0] for word in rest[-2:]] == CONFIG_TAIL.split(" ")
    values = [word[1] for word in rest]
    if values != argv:
        raise SizingUnitError(f"{mismatch}: ExecStart has {values}, argv.json {argv}")
    return start, end, words[0][1], words[2][1], tail


def groups_of(argv):
    """argv as one group per flag (a flag and the words up to the next flag)."""
    groups = []
    for word in argv:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def _value_words(flag, value):
    if isinstance(value, (list, tuple)):
        if not value:
            raise SizingUnitError(f"args[{flag!r}]: an nargs list may not be empty; give values or null to drop it")
        items = list(value)
    else:
        items = [value]
    words = []
    for item in items:
        if isinstance(item, bool) or item is None or isinstance(item, (dict, list, tuple, set)):
            raise SizingUnitError(f"args[{flag!r}]: value {item!r} is not a scalar; use true for a switch, null to "
                                  "drop the flag, a list for an nargs flag, a string or a number otherwise")
        text = str(item)
        if "\n" in text or "\r" in text or "\0" in text:
            raise SizingUnitError(f"args[{flag!r}]: a value may not contain a newline or NUL")
        words.append(text)
    return words


def check_overrides(args):
    """Refuse a malformed override before anything is read or written."""
    if not isinstance(args, dict):
        raise SizingUnitError("args must be a mapping of SGLang flag to value, e.g. {'--hicache-size': 16}")
    for flag, value in args.items():
        if not isinstance(flag, str) or not FLAG.match(flag):
            raise SizingUnitError(f"args: {flag!r} is not a long SGLang flag; write it as a string starting with "
                                  "'--', e.g. '--hicache-size'")
        if flag in FORBIDDEN_FLAGS:
            raise SizingUnitError(f"args: {flag} may not be overridden (the api keys reach SGLang only through the "
                                  "release's secrets file); drop it from args")
        if value is not None and value is not False and value is not True:
            _value_words(flag, value)


def apply_overrides(argv, args):
    """argv with the overrides: a flag in place, a new one appended, None/False drop it, True a switch."""
    groups = groups_of(argv)
    for flag, value in args.items():
        if value is None or value is False:
            group = None
        elif value is True:
            group = [flag]
        else:
            group = [flag, *_value_words(flag, value)]
        places = [i for i, existing in enumerate(groups) if existing[0] == flag]
        if places:
            if group is None:
                groups = [existing for i, existing in enumerate(groups) if i not in places]
            else:
                groups[places[0]] = group
                groups = [existing for i, existing in enumerate(groups) if i not in places[1:]]
        elif group is not None:
            groups.append(group)
    return groups


def default_name(unit):
    """<stem>-sizing.service for unit <stem>.service."""
    stem = unit[: -len(".service")] if unit.endswith(".service") else unit
    return f"{stem}-sizing.service"


def _exec_lines(python, module, groups, tail):
    lines = [f"ExecStart={systemd_quote(python)} -m {systemd_quote(module)} \\"]
    for index, group in enumerate(groups):
        more = index < len(groups) - 1 or tail
        lines.append(INDENT + " ".join(systemd_quote(word) for word in group) + (" \\" if more else ""))
    if tail:
        lines.append(INDENT + CONFIG_TAIL)
    return lines


def _section_and_key(line, section):
    stripped = line.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        return stripped[1:-1], None
    if not stripped or stripped.startswith(("#", ";")) or "=" not in stripped:
        return section, None
    return section, stripped.split("=", 1)[0].strip()


def render(unit_text, argv, unit, name, args, runtime_max_sec, release_dir):
    """The candidate unit's text and the argv it runs (``--config`` resolved for the candidate unit)."""
    start, end, python, module, tail = parse_exec(unit_text, argv, unit, release_dir)
    base = argv[:-2] if tail else list(argv)
    groups = apply_overrides(base, args)
    physical = unit_lines(unit_text)[0]
    description = next((line.split("=", 1)[1] for line in physical if line.startswith("Description=")), unit)
    out = [
        f"# HiCache sizing candidate of {unit}: a temporary unit (playbooks/hicache_sizing.yml), written by",
        "# library/sglang_sizing_unit.py from the release below with the candidate's flags; the release",
        "# itself is unchanged. Starting it stops the real unit (Conflicts=); when it fails or runs",
        f"# longer than RuntimeMaxSec={runtime_max_sec}, systemd starts the real unit again (OnFailure=).",
        f"# Release: {os.path.realpath(release_dir)}",
    ]
    section, index = None, 0
    while index < len(physical):
        line = physical[index]
        if index == start:
            out.extend(_exec_lines(python, module, groups, tail))
            index = end
            continue
        section, key = _section_and_key(line, section)
        if key is None and line.strip() == "[Install]":
            # A runtime unit nothing enables: drop [Install] and what follows it to the next section.
            index += 1
            while index < len(physical) and not physical[index].strip().startswith("["):
                index += 1
            continue
        if (section, key) in REPLACED:
            index += 1
            continue
        out.append(line)
        if key is None and line.strip() == "[Unit]":
            out.extend([
                f"Description=HiCache sizing candidate of {unit} (temporary): {description}",
                f"Conflicts={unit}",
                f"OnFailure={unit}",
            ])
        elif key is None and line.strip() == "[Service]":
            out.extend(["Restart=no", f"RuntimeMaxSec={int(runtime_max_sec)}"])
        index += 1
    text = "\n".join(out).rstrip("\n") + "\n"
    applied = [word for group in groups for word in group]
    if tail:
        applied += ["--config", f"/run/credentials/{name}/secrets.yaml"]
    return text, applied


def _read(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        raise SizingUnitError(f"{path} exists and is not a regular file (a symlink?); remove it or choose another "
                              "name")
    with open(path, encoding="utf-8") as handle:
        return handle.read(), st


def _write(path, text):
    directory = os.path.dirname(path)
    handle, temp = tempfile.mkstemp(prefix=".sizing-", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, UNIT_MODE)
        os.rename(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def check_names(unit, name):
    if not UNIT_NAME.match(unit or ""):
        raise SizingUnitError(f"unit {unit!r} is not a service unit name; give the real unit, e.g. sglang-main.service")
    if not UNIT_NAME.match(name or ""):
        raise SizingUnitError(f"name {name!r} is not a service unit name; leave it out for {default_name(unit)}")
    if name == unit:
        raise SizingUnitError(f"name {name} is the real unit: the candidate would replace it; leave name out for "
                              f"{default_name(unit)}")


def ensure(params, check_mode):
    """Write (state=present) or remove (state=absent) the candidate unit. Returns the module's result
    without running anything; ``reload`` says whether systemd must reload its units."""
    unit = params["unit"]
    name = params.get("name") or default_name(unit)
    check_names(unit, name)
    unit_dir = params.get("unit_dir") or "/run/systemd/system"
    if not os.path.isabs(unit_dir):
        raise SizingUnitError(f"unit_dir {unit_dir!r} is not an absolute path; leave it out for /run/systemd/system")
    path = os.path.join(unit_dir, name)
    before, st = _read(path)
    result = {"path": path, "name": name, "changed": False, "reload": False}
    if params.get("state", "present") == "absent":
        if before is not None:
            result.update(changed=True, reload=True)
            if not check_mode:
                os.unlink(path)
        result["diff"] = {"before": before or "", "after": "", "before_header": path, "after_header": path}
        return result
    args = params.get("args") or {}
    check_overrides(args)
    runtime = params.get("runtime_max_sec")
    if isinstance(runtime, bool) or not isinstance(runtime, int) or runtime <= 0:
        raise SizingUnitError(f"runtime_max_sec {runtime!r} must be a whole number of seconds above 0: the bound "
                              "after which systemd stops a candidate and starts the real unit again")
    release_dir = params.get("release_dir")
    if not release_dir or not os.path.isabs(release_dir):
        raise SizingUnitError(f"release_dir {release_dir!r} is not an absolute path; give the instance's "
                              "<state>/<instance>/current")
    if not os.path.isdir(unit_dir):
        raise SizingUnitError(f"unit_dir {unit_dir} does not exist: systemd's runtime unit directory is "
                              "/run/systemd/system (is systemd running on this host?)")
    unit_text, argv = read_release(release_dir, unit)
    text, applied = render(unit_text, argv, unit, name, args, runtime, release_dir)
    result.update(argv=applied, unit_sha1=hashlib.sha1(text.encode("utf-8")).hexdigest())  # noqa: S324 (an id)
    result["diff"] = {"before": before or "", "after": text, "before_header": path, "after_header": path}
    mode_wrong = st is not None and stat.S_IMODE(st.st_mode) != UNIT_MODE
    if before != text or mode_wrong:
        result["changed"] = True
        result["reload"] = before != text
        if not check_mode:
            if before == text:
                os.chmod(path, UNIT_MODE)
            else:
                _write(path, text)
    return result
