"""Filters of playbooks/ab_benchmark.yml: read what a host's live SGLang release runs.

Plain functions (testable without Ansible) exposed as Jinja filters:

- ``ab_benchmark_exec_python(unit_text)``: the interpreter of a systemd unit's ExecStart (its first
  word, unquoted as systemd does), e.g. ``/opt/sglang/releases/<name>/bin/python`` from the unit that
  roles/sglang_service keeps in each release directory.
- ``ab_benchmark_flag_value(argv, flag)``: the value that follows ``flag`` in an argv list (the
  release's argv.json), ``""`` when the flag is absent or has no value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", ";": ";", " ": " "}


def _first_word(line: str) -> str:
    """The first word of an ExecStart value, as systemd splits it (quotes, escapes, %% and $$)."""
    text = line.lstrip(" \t")
    while text[:1] in ("-", "@", ":", "+", "!"):  # systemd's ExecStart prefixes
        text = text[1:]
    word: list[str] = []
    quote = text[0] if text[:1] in ("'", '"') else None
    i = 1 if quote else 0
    while i < len(text):
        char = text[i]
        if quote and char == quote:
            break
        if not quote and char in " \t":
            break
        if char == "\\" and i + 1 < len(text):
            word.append(_ESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        if char in "%$" and text[i + 1 : i + 2] == char:
            i += 1
        word.append(char)
        i += 1
    return "".join(word)


def exec_python(unit_text: str) -> str:
    """The interpreter (first word) of the unit's ExecStart line."""
    for line in str(unit_text).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ExecStart" and value.strip():
            word = _first_word(value)
            if word:
                return word
    raise AnsibleFilterError("the unit has no ExecStart line with a command")


def flag_value(argv: Sequence[Any], flag: str) -> str:
    """The word after `flag` in argv (`--flag value`), or `--flag=value`; "" when absent."""
    words = [str(word) for word in argv]
    for index, word in enumerate(words):
        if word == flag:
            following = words[index + 1] if index + 1 < len(words) else ""
            return "" if following.startswith("--") else following
        if word.startswith(flag + "="):
            return word[len(flag) + 1 :]
    return ""


class FilterModule:
    """Jinja filters of playbooks/ab_benchmark.yml."""

    def filters(self) -> dict[str, Any]:
        return {
            "ab_benchmark_exec_python": exec_python,
            "ab_benchmark_flag_value": flag_value,
        }
