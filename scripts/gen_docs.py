#!/usr/bin/env python3
"""Rewrite the generated parts of docs/architecture.md from the code.

Two blocks, each between `<!-- BEGIN generated: NAME -->` and `<!-- END generated -->`:

  phases        site.yml's import_playbook entries, in order, with their play names;
  entry points  every entry point of roles/*/meta/argument_specs.yml (its short_description)
                and every file of site.yml, playbooks/ and roles/*/tasks/ that calls it
                (include_role / import_role, with or without tasks_from, plays' `roles:`, and
                include_tasks / import_tasks of the file inside its own role),
                then the task files called from outside their role that have no argument spec.

    python scripts/gen_docs.py            rewrite the blocks
    python scripts/gen_docs.py --check    exit 1 when the file differs from what it would write
    python scripts/gen_docs.py --root DIR --file PATH   another checkout or document (tests)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = Path("docs/architecture.md")
END = "<!-- END generated -->"
ROLE_KEYS = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
TASK_KEYS = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's own tags (!unsafe, !vault) as plain values."""


def _any_tag(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)


_Loader.add_multi_constructor("!", _any_tag)


def load_yaml(path: Path) -> object:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)


def entry_points(root: Path) -> dict[tuple[str, str], str]:
    """(role, entry point) -> short_description, from every roles/*/meta/argument_specs.yml."""
    found: dict[tuple[str, str], str] = {}
    for spec in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        role = spec.parent.parent.name
        data = load_yaml(spec) or {}
        for name, body in (data.get("argument_specs") or {}).items():
            found[(role, name)] = " ".join(str((body or {}).get("short_description", "")).split())
    return found


def _stem(name: str) -> str:
    return re.sub(r"\.ya?ml$", "", name)


def _calls(node: object, own_role: str | None = None) -> list[tuple[str, str]]:
    """(role, entry point) of every include_role/import_role and play `roles:` under a YAML node, and,
    in a role's task file (own_role), of every include_tasks/import_tasks of a file of that role."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key in TASK_KEYS if own_role else ():
            args = node.get(key)
            target = args.get("file") if isinstance(args, dict) else args
            if isinstance(target, str) and "{{" not in target and "/" not in target:
                out.append((own_role, _stem(target)))
        for key in ROLE_KEYS:
            args = node.get(key)
            if isinstance(args, dict) and args.get("name"):
                tasks_from = str(args.get("tasks_from") or "main")
                out.append((str(args["name"]), _stem(tasks_from)))
        if "hosts" in node and isinstance(node.get("roles"), list):
            for role in node["roles"]:
                name = role.get("role") or role.get("name") if isinstance(role, dict) else role
                if name:
                    out.append((str(name), "main"))
        for value in node.values():
            out.extend(_calls(value, own_role))
    elif isinstance(node, list):
        for item in node:
            out.extend(_calls(item, own_role))
    return out


def callers(root: Path) -> dict[tuple[str, str], list[str]]:
    """(role, entry point) -> the files that call it (site.yml, playbooks/, roles/*/tasks/)."""
    files = [root / "site.yml", *sorted(root.glob("playbooks/**/*.yml")), *sorted(root.glob("roles/*/tasks/*.yml"))]
    found: dict[tuple[str, str], list[str]] = {}
    for path in files:
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        own_role = rel.split("/")[1] if rel.startswith("roles/") else None
        for call in _calls(load_yaml(path), own_role):
            found.setdefault(call, [])
            if rel not in found[call]:
                found[call].append(rel)
    return found


def phases(root: Path) -> str:
    rows = ["| # | play in `site.yml` | playbook |", "|---|---|---|"]
    for i, play in enumerate(load_yaml(root / "site.yml") or [], start=0):
        target = play.get("ansible.builtin.import_playbook") or play.get("import_playbook") or ""
        rows.append(f"| {i} | {play.get('name', '')} | [`{target}`](../{target}) |")
    return "\n".join(rows)


def entry_point_table(root: Path) -> str:
    specs = entry_points(root)
    calls = callers(root)
    rows = [
        "| role | entry point | what it does (its `short_description`) | called from (include_role, import_role, "
        "`roles:`; inside the role, include_tasks) |",
        "|---|---|---|---|",
    ]
    for (role, name), description in specs.items():
        by = ", ".join(f"`{f}`" for f in calls.get((role, name), [])) or "–"
        rows.append(f"| [`{role}`](../roles/{role}/README.md) | `{name}` | {description} | {by} |")
    unspecced = sorted(
        (key, files) for key, files in calls.items()
        if key not in specs and any(not f.startswith(f"roles/{key[0]}/") for f in files)
    )
    rows += [
        "",
        "Task files called from outside their role (`tasks_from`) that have no entry in its "
        "`roles/<role>/meta/argument_specs.yml`, so Ansible checks no inputs for them:",
        "",
    ]
    if unspecced:
        rows += ["| role | task file | called from |", "|---|---|---|"]
        for (role, name), files in unspecced:
            rows.append(f"| `{role}` | `tasks/{name}.yml` | {', '.join(f'`{f}`' for f in files)} |")
    else:
        rows.append("none.")
    return "\n".join(rows)


BLOCKS = {"phases": phases, "entry points": entry_point_table}


def render(text: str, root: Path) -> str:
    for name, build in BLOCKS.items():
        begin = f"<!-- BEGIN generated: {name} -->"
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(END), re.S)
        if not pattern.search(text):
            raise SystemExit(f"gen_docs: no block '{begin}' ... '{END}' in the document")
        body = f"{begin}\n<!-- written by scripts/gen_docs.py; edit the code, then run it -->\n{build(root)}\n{END}"
        text = pattern.sub(lambda _m, body=body: body, text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the document is not up to date")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--file", type=Path, help="the document (default: <root>/docs/architecture.md)")
    opts = parser.parse_args(argv)
    doc = opts.file or opts.root / DOC
    old = doc.read_text(encoding="utf-8")
    new = render(old, opts.root)
    if opts.check:
        if new != old:
            print(f"{doc}: the generated blocks are out of date; run: python scripts/gen_docs.py", file=sys.stderr)
            return 1
        print(f"{doc}: up to date")
        return 0
    if new != old:
        doc.write_text(new, encoding="utf-8")
        print(f"{doc}: rewritten")
    else:
        print(f"{doc}: unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
