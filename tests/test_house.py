"""House rules for the roles (issue 23): a role's interface is its meta/argument_specs.yml, and a
role reaches another only through that interface.

a. Every key of a role's defaults/main.yml is an option of the role (in at least one entry point of
   its meta/argument_specs.yml), or of a role that reads those defaults through a meta dependency;
   a key starting with '_' is private and has no place in defaults.
b. Every include_role/import_role (and `roles:` entry) with tasks_from names an entry point the
   target role declares; no include_tasks/import_tasks runs a file of another role's tasks/.
c. No task file of a role reads another role's files by climbing out of its role_path
   (`role_path }}/..`, `role_path ~ '/..'`, `role_path | dirname`).
d. Jinja for data, Python for logic: the task files, handlers and playbooks hold at most 10 inline
   ternaries per 1,000 lines (docs/conventions.md); logic goes into a role's filter_plugins.
e. A uri/get_url task that sends headers (a key) follows no redirect, unless listed with its reason.
f. After preflight: every include_role of the phase playbooks that run after it, and of the role
   task files they reach, leaves out its own argument validation once preflight checked every role's
   merged specs on the host (rolespec_validate reads preflight_specs_passed): one task less per include.

Each check is a plain function over the tree, so the negative self-checks below feed it a made-up
tree and make sure it does find the problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

INCLUDE_ROLE = {"include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role"}
INCLUDE_TASKS = {"include_tasks", "import_tasks", "ansible.builtin.include_tasks", "ansible.builtin.import_tasks"}


def _load(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _entry_points(role: Path) -> dict:
    spec = role / "meta" / "argument_specs.yml"
    if not spec.is_file():
        return {}
    return (_load(spec) or {}).get("argument_specs") or {}


# --- a. defaults are declared options -------------------------------------------------------------

def _dependencies(role: Path) -> list[str]:
    """The roles meta/main.yml names as dependencies (whose defaults this role reads)."""
    meta = role / "meta" / "main.yml"
    deps = ((_load(meta) or {}).get("dependencies") or []) if meta.is_file() else []
    return [str(d.get("role") or d.get("name")) if isinstance(d, dict) else str(d) for d in deps]


def defaults_findings(root: Path) -> list[str]:
    problems = []
    roles = sorted(p for p in root.glob("roles/*") if p.is_dir())
    for defaults in sorted(root.glob("roles/*/defaults/main.yml")):
        role = defaults.parent.parent
        declared: set[str] = set()
        # Its own entry points, and those of the roles that read its defaults through a meta
        # dependency (roles/rollout holds the settings of rollout_gate and rollout_router).
        for owner in [role] + [r for r in roles if role.name in _dependencies(r)]:
            for spec in _entry_points(owner).values():
                declared.update((spec or {}).get("options") or {})
        for key in _load(defaults) or {}:
            if str(key).startswith("_"):
                problems.append(f"{role.name}: {key} is private ('_') but set in defaults/main.yml")
            elif key not in declared:
                problems.append(f"{role.name}: {key} (defaults/main.yml) is no option of meta/argument_specs.yml")
    return problems


def test_every_default_is_a_declared_option():
    problems = defaults_findings(ROOT)
    assert not problems, "\n".join(problems)


def test_defaults_check_finds_an_undeclared_and_a_private_key(tmp_path):
    role = tmp_path / "roles" / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text("demo_a: 1\ndemo_b: 2\n_demo_c: 3\n")
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    short_description: x\n    options:\n      demo_a: {type: int}\n"
        "  other:\n    short_description: y\n")
    problems = defaults_findings(tmp_path)
    assert len(problems) == 2, problems
    assert any("demo_b" in p for p in problems), problems
    assert any("_demo_c" in p and "private" in p for p in problems), problems


# --- b. tasks_from names a declared entry point; no include of another role's task file -------------

def _yaml_files(root: Path) -> list[Path]:
    files = [root / "site.yml"] if (root / "site.yml").is_file() else []
    for top in ("playbooks", "roles", "molecule"):
        files += sorted(p for p in (root / top).rglob("*") if p.suffix in (".yml", ".yaml") and p.is_file())
    return files


def _walk(node) -> Iterator[tuple[str, object]]:
    """(keyword, value) of every include/import of a role or task file, and of `roles:` entries."""
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in INCLUDE_ROLE or key in INCLUDE_TASKS:
                yield key, value
            elif key == "roles" and isinstance(value, list):
                for entry in value:
                    if isinstance(entry, dict):
                        yield "roles", entry
            yield from _walk(value)


def _role_of(path: Path, root: Path) -> str | None:
    parts = path.relative_to(root).parts
    return parts[1] if len(parts) > 2 and parts[0] == "roles" else None


def entry_point_findings(root: Path) -> list[str]:
    problems = []
    for path in _yaml_files(root):
        try:
            data = _load(path)
        except yaml.YAMLError:
            continue  # not Ansible YAML (ansible-lint and the syntax check read those)
        rel = path.relative_to(root)
        own = _role_of(path, root)
        for key, value in _walk(data):
            if key in INCLUDE_TASKS:
                name = value if isinstance(value, str) else (value or {}).get("file", "")
                target = re.search(r"roles/([A-Za-z0-9_]+)/tasks/", str(name).replace("\\", "/"))
                climbs = own and re.search(r"\.\./([A-Za-z0-9_]+)/tasks/", str(name))
                for match in (target, climbs):
                    if match and match.group(1) != own:
                        problems.append(f"{rel}: {key} {name} runs a task file of the role {match.group(1)}")
                continue
            if not isinstance(value, dict):
                continue
            tasks_from = value.get("tasks_from")
            if tasks_from is None:
                continue
            role = value.get("name") or value.get("role")
            if "{{" in str(role) or "{{" in str(tasks_from):
                problems.append(f"{rel}: {key} {role} tasks_from {tasks_from} is templated; "
                                "name a declared entry point")
                continue
            point = re.sub(r"\.ya?ml$", "", str(tasks_from))
            if point != str(tasks_from):
                problems.append(f"{rel}: {key} {role} tasks_from {tasks_from}: "
                                f"name the entry point ({point}), not the file")
            points = _entry_points(root / "roles" / str(role))
            if point not in points:
                problems.append(f"{rel}: {key} {role} tasks_from {tasks_from}: no entry point '{point}' in "
                                f"roles/{role}/meta/argument_specs.yml ({', '.join(points) or 'none'})")
    return problems


def test_tasks_from_names_a_declared_entry_point():
    problems = entry_point_findings(ROOT)
    assert not problems, "\n".join(problems)


def test_entry_point_check_finds_an_undeclared_one_and_a_foreign_task_file(tmp_path):
    for role in ("one", "two"):
        (tmp_path / "roles" / role / "tasks").mkdir(parents=True)
        (tmp_path / "roles" / role / "meta").mkdir()
        (tmp_path / "roles" / role / "meta" / "argument_specs.yml").write_text(
            "argument_specs:\n  main:\n    short_description: x\n  plan:\n    short_description: y\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "p.yml").write_text(yaml.safe_dump([{"hosts": "all", "tasks": [
        {"ansible.builtin.include_role": {"name": "one", "tasks_from": "plan"}},   # fine
        {"ansible.builtin.include_role": {"name": "one", "tasks_from": "wait"}},   # undeclared
        {"ansible.builtin.import_role": {"name": "two", "tasks_from": "plan.yml"}},  # a file name
        {"ansible.builtin.include_tasks": "../roles/two/tasks/plan.yml"},          # another role's file
    ]}]))
    (tmp_path / "roles" / "one" / "tasks" / "main.yml").write_text(yaml.safe_dump([
        {"ansible.builtin.include_tasks": "plan.yml"},                              # its own: fine
        {"ansible.builtin.import_tasks": "{{ role_path }}/../two/tasks/plan.yml"},  # another role's
    ]))
    problems = entry_point_findings(tmp_path)
    assert len(problems) == 4, problems
    assert sum("runs a task file of the role two" in p for p in problems) == 2, problems


# --- c. no reach into another role's files ----------------------------------------------------------

# `role_path` followed by a way out of the role directory: "{{ role_path }}/..", role_path ~ '/..',
# role_path | dirname.
CLIMB = re.compile(r"role_path\s*(\}\}\s*/\s*\.\.|~\s*['\"]/?\.\.|\|\s*dirname)")

# Allowed, each for its reason (file, the line's text):
ALLOWED = {
    # The fast path's fingerprint of the whole toolkit: rollout_release_toolkit hashes every file of
    # site.yml, playbooks/, roles/, library/, ... from the project root, so that any change to the
    # toolkit walks every host through its phases once. It climbs to the project root (two
    # dirnames), not into roles/<other>/, and names no other role's file: a digest of the tree, not
    # a use of another role's defaults, tasks or files.
    ("roles/rollout/tasks/converged.yml",
     "_rollout_toolkit: \"{{ role_path | dirname | dirname | rollout_release_toolkit }}\""),
}

def reach_in_findings(root: Path) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(root.glob("roles/*/**/*")):
        if path.suffix not in (".yml", ".yaml", ".j2") or not path.is_file():
            continue
        rel = str(path.relative_to(root))
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("#"):
                continue
            if CLIMB.search(line):
                found.add((rel, line.strip()))
    return found


def test_no_role_reads_another_roles_files():
    problems = reach_in_findings(ROOT) - ALLOWED
    assert not problems, "\n".join(f"{f}: {line}" for f, line in sorted(problems))


def test_the_allowed_climbs_are_still_there():
    """An allowance for a line that is gone allows nothing: drop it."""
    found = reach_in_findings(ROOT)
    assert ALLOWED <= found, ALLOWED - found


# A role's own argument specs, read from its own role_path (its entry point argument_check).
OWN_SPECS = re.compile(r"role_path\s*(~\s*['\"]|\}\})/meta/argument_specs\.yml")


def argument_spec_readers(root: Path) -> set[tuple[str, str]]:
    """Lines of a role's files that read an argument_specs.yml other than the role's own."""
    found = set()
    for path in sorted(root.glob("roles/*/**/*")):
        if path.suffix not in (".yml", ".yaml", ".j2") or not path.is_file() or path.parent.name == "meta":
            continue
        rel = str(path.relative_to(root))
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("#") or "meta/argument_specs" not in line:
                continue
            if CLIMB.search(line) or not OWN_SPECS.search(line):
                found.add((rel, line.strip()))
    return found


def test_preflight_reads_no_other_roles_argument_specs():
    """Issue 23: each role validates its own variables (entry point argument_check, its own
    meta/argument_specs.yml); preflight imports those entry points and reads no other role's specs."""
    found = argument_spec_readers(ROOT)
    assert not found, "\n".join(f"{f}: {line}" for f, line in sorted(found))


def test_argument_spec_check_finds_another_roles_specs(tmp_path):
    tasks = tmp_path / "roles" / "one" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- ansible.builtin.debug:\n"
        "    msg: \"{{ lookup('file', role_path ~ '/../' ~ item ~ '/meta/argument_specs.yml') }}\"\n"
        "- ansible.builtin.debug:\n    msg: \"{{ lookup('file', 'roles/two/meta/argument_specs.yml') }}\"\n"
        "- ansible.builtin.debug:\n    msg: \"{{ lookup('file', role_path ~ '/meta/argument_specs.yml') }}\"\n"
        "- ansible.builtin.include_vars:\n    file: \"{{ role_path }}/meta/argument_specs.yml\"\n"
        "# a comment about roles/two/meta/argument_specs.yml is not a read\n")
    found = argument_spec_readers(tmp_path)
    assert len(found) == 2, found
    assert all("/../" in line or "roles/two" in line for _, line in found), found


def test_reach_in_check_finds_each_way_out(tmp_path):
    tasks = tmp_path / "roles" / "one" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- ansible.builtin.include_vars:\n    file: \"{{ role_path }}/../two/defaults/main.yml\"\n"
        "- ansible.builtin.script:\n    cmd: \"{{ role_path }}/../two/files/x.py\"\n"
        "- ansible.builtin.debug:\n    msg: \"{{ lookup('file', role_path ~ '/../two/meta/x.yml') }}\"\n"
        "- ansible.builtin.debug:\n    msg: \"{{ role_path | dirname }}/two/files/y\"\n"
        "# a comment about {{ role_path }}/.. is not a read\n"
        "- ansible.builtin.debug:\n    msg: \"{{ role_path }}/files/own.py\"\n")
    assert len(reach_in_findings(tmp_path)) == 4, reach_in_findings(tmp_path)


# --- d. Jinja for data, Python for logic ------------------------------------------------------------

# An inline ternary: the ternary filter, or a Jinja inline if/else on one line (a `{% if %}`
# statement has a '%' between its if and else, so it is not one).
TERNARY = re.compile(r"\bternary\(")
INLINE_IF = re.compile(r"\bif\b[^\n%]*?\belse\b")
TERNARIES_PER_1000_LINES = 10
TERNARY_GLOBS = ("roles/*/tasks/*.yml", "roles/*/handlers/*.yml", "playbooks/*.yml", "site.yml")


def ternary_counts(root: Path) -> dict[str, tuple[int, int]]:
    """{file: (inline ternaries, lines)} over the task files, handlers, playbooks and site.yml."""
    counts = {}
    for path in sorted({p for pattern in TERNARY_GLOBS for p in root.glob(pattern) if p.is_file()}):
        text = path.read_text(encoding="utf-8")
        counts[str(path.relative_to(root))] = (len(TERNARY.findall(text)) + len(INLINE_IF.findall(text)),
                                               text.count("\n"))
    return counts


def ternary_findings(root: Path) -> list[str]:
    counts = ternary_counts(root)
    ternaries = sum(n for n, _ in counts.values())
    lines = sum(n for _, n in counts.values())
    if ternaries * 1000 <= TERNARIES_PER_1000_LINES * lines:
        return []
    most = sorted(((n, f) for f, (n, _) in counts.items() if n), reverse=True)[:10]
    return [f"{ternaries} inline ternaries in {lines} lines = {1000 * ternaries / max(lines, 1):.1f} per 1,000 "
            f"(at most {TERNARIES_PER_1000_LINES}): move the logic into the role's filter_plugins; most in"] + \
        [f"  {f}: {n}" for n, f in most]


def test_few_inline_ternaries_in_tasks_and_playbooks():
    problems = ternary_findings(ROOT)
    assert not problems, "\n".join(problems)


def test_ternary_count_finds_filters_and_inline_ifs(tmp_path):
    tasks = tmp_path / "roles" / "one" / "tasks"
    tasks.mkdir(parents=True)
    (tmp_path / "playbooks").mkdir()
    (tasks / "main.yml").write_text(
        "- ansible.builtin.debug:\n    msg: \"{{ x | ternary('a', 'b') }} {{ 'a' if x else 'b' }}\"\n"
        "- ansible.builtin.debug:\n    msg: \"{% if x %}a{% else %}b{% endif %}\"\n"   # a statement: not one
        "- ansible.builtin.debug:\n    msg: >-\n      {{ 'a' if x\n         else 'b' }}\n")  # two lines: not one
    (tmp_path / "playbooks" / "p.yml").write_text("- hosts: all\n" + "  # filler\n" * 199)
    assert ternary_counts(tmp_path)["roles/one/tasks/main.yml"] == (2, 8)
    assert ternary_findings(tmp_path) == []  # 2 in 208 lines: 9.6 per 1,000
    (tmp_path / "site.yml").write_text("- hosts: \"{{ 'a' if b else 'c' }}\"\n")
    problems = ternary_findings(tmp_path)
    assert problems[0].startswith("3 inline ternaries in 209 lines = 14.4 per 1,000"), problems
    assert problems[1:] == ["  roles/one/tasks/main.yml: 2", "  site.yml: 1"], problems


# --- e. a credential goes only where it was sent ----------------------------------------------------

HTTP_MODULES = {"uri", "ansible.builtin.uri", "get_url", "ansible.builtin.get_url"}
# Requests that carry a header and may follow a redirect, each with why: playbooks/model_manifest.yml
# on the controller, against the Hugging Face endpoint the operator named. Hugging Face answers a
# renamed repository and a file download with redirects to its own hosts (a file's to its CDN, with a
# signed URL); the token goes along (uri/get_url cannot drop it on a redirect).
REDIRECTS_ALLOWED = {
    ("roles/models/tasks/manifest.yml", "Manifest | list the revision's files with the tree API"),
    ("roles/models/tasks/manifest.yml", "Manifest | download the files kept in git (no sha256 in the listing)"),
}


def _tasks(node) -> Iterator[dict]:
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if any(key in HTTP_MODULES for key in node):
            yield node
        for value in node.values():
            yield from _tasks(value)


def redirect_findings(root: Path) -> list[str]:
    """uri/get_url tasks that send headers (an Authorization key) and follow redirects: a server, or
    anyone who can make it answer 3xx, gets the key sent to another place."""
    problems = []
    for path in _yaml_files(root):
        rel = str(path.relative_to(root))
        if rel.startswith("molecule/"):
            continue
        for task in _tasks(_load(path)):
            module = next(key for key in task if key in HTTP_MODULES)
            args = task[module] if isinstance(task[module], dict) else {}
            if "headers" in args and args.get("follow_redirects") != "none" \
                    and (rel, task.get("name")) not in REDIRECTS_ALLOWED:
                problems.append(f"{rel}: {task.get('name')!r} sends headers and follows redirects")
    return problems


def test_requests_with_a_key_follow_no_redirect():
    assert redirect_findings(ROOT) == []


def test_the_allowed_redirects_are_still_there():
    found = set()
    for rel, _name in REDIRECTS_ALLOWED:
        for task in _tasks(_load(ROOT / rel)):
            found.add((rel, task.get("name")))
    assert REDIRECTS_ALLOWED <= found


def test_redirect_check_finds_a_header_sent_through_redirects(tmp_path):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "p.yml").write_text(yaml.safe_dump([{"hosts": "all", "tasks": [
        {"name": "keyed", "ansible.builtin.uri": {"url": "http://x/", "headers": {"Authorization": "k"}}},
        {"name": "keyed, safe", "ansible.builtin.uri": {"url": "http://x/", "headers": {"A": "k"},
                                                        "follow_redirects": "none"}},
        {"name": "no key", "ansible.builtin.get_url": {"url": "http://x/", "dest": "/tmp/x"}},
    ]}]))
    assert redirect_findings(tmp_path) == ["playbooks/p.yml: 'keyed' sends headers and follows redirects"]


# --- f. one argument validation per host and run ---------------------------------------------------

SPECS_SKIP = "{{ not (preflight_specs_passed | default(false)) }}"
AFTER_PREFLIGHT = ("playbooks/run_lock.yml", "playbooks/run_unlock.yml", "playbooks/rocm.yml", "playbooks/venv.yml",
                   "playbooks/models.yml", "playbooks/rollout.yml", "roles/rollout_gate/tasks/prune.yml",
                   "roles/rollout_gate/tasks/rollback.yml", "roles/rollout_gate/tasks/main.yml",
                   "roles/rollout_gate/tasks/probe.yml",
                   "roles/sglang_service/tasks/validate.yml",
                   "roles/models/tasks/fetch.yml")


def specs_skip_findings(root: Path, files=AFTER_PREFLIGHT) -> list[str]:
    problems = []
    for rel in files:
        for key, value in _walk(_load(root / rel)):
            if key in INCLUDE_ROLE and "include" in key and isinstance(value, dict) \
                    and value.get("rolespec_validate") != SPECS_SKIP:
                problems.append(f"{rel}: include_role {value.get('name')} {value.get('tasks_from', 'main')} "
                                f"validates again (rolespec_validate: \"{SPECS_SKIP}\")")
    return problems


def test_includes_after_preflight_skip_the_validation_preflight_did():
    problems = specs_skip_findings(ROOT)
    assert not problems, "\n".join(problems)
    main = (ROOT / "roles/preflight/tasks/main.yml").read_text(encoding="utf-8")
    # Set only after the host's findings (argument specs among them) failed it or not, and only when
    # preflight_validate_roles covered every role.
    assert main.index("preflight_specs_passed:") > main.index("- name: Fail with every finding on this host")
    assert "| difference(preflight_validate_roles) | length == 0" in main


def test_specs_skip_check_finds_an_include_that_validates_again(tmp_path):
    (tmp_path / "p.yml").write_text(yaml.safe_dump([{"hosts": "all", "tasks": [
        {"name": "a", "ansible.builtin.include_role": {"name": "one", "rolespec_validate": SPECS_SKIP}},
        {"name": "b", "ansible.builtin.include_role": {"name": "two", "tasks_from": "plan"}}]}]))
    problems = specs_skip_findings(tmp_path, ("p.yml",))
    assert len(problems) == 1, problems
    assert "include_role two plan" in problems[0], problems


# --- g. roles call one way ---------------------------------------------------------------------------
# A role's task files and handlers include other roles (include_role/import_role); those calls must
# not come back round to the caller: the test fails when any cycle appears.
def role_calls(root: Path) -> dict[str, set[str]]:
    """{role: the other roles its task files and handlers include}."""
    calls: dict[str, set[str]] = {}
    for path in sorted(root.glob("roles/*/*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        own = path.parent.parent.name
        for key, value in _walk(_load(path)):
            if key in INCLUDE_ROLE and isinstance(value, dict) and value.get("name") not in (None, own):
                calls.setdefault(own, set()).add(str(value["name"]))
    # A meta dependency is a call too (the dependency's defaults and tasks come with the role).
    for role in sorted(p for p in root.glob("roles/*") if p.is_dir()):
        for dep in _dependencies(role):
            calls.setdefault(role.name, set()).add(dep)
    return calls


def role_cycles(calls: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Each set of roles that reach each other (a strongly connected group of two or more), sorted."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for callee in calls.get(todo.pop(), ()):
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return seen

    reached = {role: reach(role) for role in set(calls) | {c for callees in calls.values() for c in callees}}
    groups = set()
    for role, seen in reached.items():
        group = tuple(sorted({role} | {other for other in seen if role in reached[other]}))
        if len(group) > 1:
            groups.add(group)
    return groups


def test_roles_call_one_way():
    calls = role_calls(ROOT)
    assert calls, "no include_role found: the walk is broken"
    # No cycle at all: sglang_service owns the checks of its config (its entry point check, which
    # preflight calls), so no role calls back into a role that called it.
    assert role_cycles(calls) == set(), {group: sorted(calls.get(group[0], ())) for group in role_cycles(calls)}
    assert "preflight" not in calls.get("sglang_service", set())
    # The models role checks its disk with the module (library/fleet_free_disk.py), not preflight's tasks.
    assert "preflight" not in calls.get("models", set())
    # The rollout split by what it does: the run (rollout) calls neither its gate nor the router
    # membership; both read the run's settings through their meta dependency on it.
    assert not calls.get("rollout", set()) & {"rollout_gate", "rollout_router"}, calls.get("rollout")
    assert {"rollout", "rollout_router"} <= calls["rollout_gate"], calls.get("rollout_gate")


def test_cycle_check_finds_a_cycle_of_three_and_not_a_chain(tmp_path):
    def role(name: str, *callees: str) -> None:
        (tmp_path / "roles" / name / "tasks").mkdir(parents=True)
        tasks = [{"name": f"call {c}", "ansible.builtin.include_role": {"name": c, "tasks_from": "x"}} for c in callees]
        (tmp_path / "roles" / name / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks))

    role("a", "b")
    role("b", "c")
    role("c", "a", "d")
    role("d")
    role("e", "a")
    assert role_cycles(role_calls(tmp_path)) == {("a", "b", "c")}
    (tmp_path / "roles" / "c" / "tasks" / "main.yml").write_text(yaml.safe_dump(
        [{"name": "d only", "ansible.builtin.include_role": {"name": "d"}}]))
    assert role_cycles(role_calls(tmp_path)) == set()


# --- h. task names: `Step | what it does` (docs/conventions.md) ----------------------------------------
# ansible-lint checks that every task has a name, upper-case first and Jinja only at its end; the
# `Step | ` prefix it cannot check (its name[prefix] wants the file stem in lower case). Here: every
# task and handler name of a task file has the prefix, but in the files below, which predate the
# convention and move to it when they are edited anyway. A file that has moved leaves the list (the
# test says so), and no new file joins it.
NAME_PREFIX = re.compile(r"^[A-Z][A-Za-z0-9/ -]*? \| \S")
UNPREFIXED_FILES = {
    "playbooks/capture_venv.yml",
    "playbooks/demo_prepare.yml",
    "playbooks/first_host.yml",
    "playbooks/model_manifest.yml",
    "playbooks/models.yml",
    "playbooks/rocm.yml",
    "playbooks/venv.yml",
    "playbooks/wheelhouse.yml",
    "roles/first_host/tasks/main.yml",
    "roles/models/tasks/current.yml",
    "roles/models/tasks/fetch-hf.yml",
    "roles/models/tasks/fetch-http.yml",
    "roles/models/tasks/fetch-sync.yml",
    "roles/models/tasks/fetch.yml",
    "roles/models/tasks/hf-tool.yml",
    "roles/models/tasks/main.yml",
    "roles/models/tasks/model.yml",
    "roles/models/tasks/preflight.yml",
    "roles/models/tasks/verify-staging.yml",
    "roles/monitoring/handlers/main.yml",
    "roles/preflight/tasks/main.yml",
    "roles/rocm/handlers/main.yml",
    "roles/rocm/tasks/activate.yml",
    "roles/rocm/tasks/current.yml",
    "roles/rocm/tasks/fetch.yml",
    "roles/rocm/tasks/gpu_check.yml",
    "roles/rocm/tasks/install.yml",
    "roles/rocm/tasks/main.yml",
    "roles/rocm/tasks/preflight.yml",
    "roles/rocm/tasks/reboot_state.yml",
    "roles/rocm/tasks/release.yml",
    "roles/rocm/tasks/repository.yml",
    "roles/rocm/tasks/service_ready.yml",
    "roles/rocm/tasks/stage.yml",
    "roles/rocm/tasks/state.yml",
    "roles/rocm/tasks/users.yml",
    "roles/router/handlers/main.yml",
    "roles/sglang_service/handlers/main.yml",
    "roles/sglang_service/tasks/main.yml",
    "roles/sglang_venv/tasks/current.yml",
    "roles/sglang_venv/tasks/install.yml",
    "roles/sglang_venv/tasks/main.yml",
    "roles/sglang_venv/tasks/preflight.yml",
    "roles/sglang_venv/tasks/resolve.yml",
    "roles/sglang_venv/tasks/setup-Debian.yml",
    "roles/sglang_venv/tasks/setup-default.yml",
    "roles/sglang_venv/tasks/switch.yml",
    "roles/sglang_venv/tasks/verify.yml",
    "roles/sglang_venv/tasks/wheelhouse-digest.yml",
}


def _task_names(node, found: list[str]) -> None:
    """The names of tasks, handlers and blocks in a parsed task file or playbook (not of plays)."""
    if isinstance(node, list):
        for item in node:
            _task_names(item, found)
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str) and "hosts" not in node and "import_playbook" not in node:
            found.append(node["name"])
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            _task_names(node.get(key), found)


def task_name_findings(root: Path, legacy=frozenset()) -> list[str]:
    problems = []
    files = [*root.glob("roles/*/tasks/*.yml"), *root.glob("roles/*/handlers/*.yml"), *root.glob("playbooks/*.yml"),
             *root.glob("playbooks/tasks/*.yml")]
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        names: list[str] = []
        _task_names(_load(path), names)
        bare = [name for name in names if not NAME_PREFIX.match(name)]
        if bare and rel not in legacy:
            problems.append(f"{rel}: {len(bare)} task name(s) without a 'Step | ' prefix, e.g. {bare[0]!r}")
        elif rel in legacy and not bare:
            problems.append(f"{rel}: every name has its prefix now; take the file off UNPREFIXED_FILES")
    problems += [f"{rel}: listed in UNPREFIXED_FILES but not there" for rel in sorted(legacy)
                 if not (root / rel).is_file()]
    return problems


def test_task_names_have_their_step_prefix():
    problems = task_name_findings(ROOT, UNPREFIXED_FILES)
    assert not problems, "\n".join(problems)


def test_task_name_check_finds_a_bare_name_and_a_stale_listing(tmp_path):
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "tasks" / "new.yml").write_text(yaml.safe_dump(
        [{"name": "New | one", "block": [{"name": "install it", "ansible.builtin.debug": {}}]}]))
    (tmp_path / "roles" / "r" / "tasks" / "old.yml").write_text(yaml.safe_dump([{"name": "Old | fine now"}]))
    problems = task_name_findings(tmp_path, frozenset({"roles/r/tasks/old.yml", "roles/r/tasks/gone.yml"}))
    assert len(problems) == 3, problems
    assert "roles/r/tasks/new.yml: 1 task name(s) without a 'Step | ' prefix, e.g. 'install it'" in problems[0]
    assert "take the file off UNPREFIXED_FILES" in problems[1]
    assert "gone.yml: listed in UNPREFIXED_FILES but not there" in problems[2]


# --- Test helpers are imported by unique module names, never from a conftest.py --------------------
# Every tests/ directory without __init__.py has its conftest.py imported as the module `conftest`,
# the last one loaded winning: `from conftest import X` works in a whole run and breaks when a run
# names directories in another order (`pytest tests/probe/test_warm_set.py tests/sim` imported
# tests/sim's). Shared helpers live in tests/plugins.py, tests/procs.py or a uniquely named module.
_CONFTEST_IMPORT = re.compile(r"^\s*(from\s+conftest\s+import|import\s+conftest\b)", re.M)


def conftest_imports(root: Path) -> list[str]:
    """Each Python file under root/tests that imports from a conftest module, with the line."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in _CONFTEST_IMPORT.finditer(text):
            found.append(f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}")
    return found


def test_no_test_imports_from_a_conftest():
    assert conftest_imports(ROOT) == []


def test_conftest_import_check_finds_both_forms(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_x.py").write_text("import os\nfrom conftest import REPO\n")
    (tmp_path / "tests" / "test_y.py").write_text("import conftest\n")
    (tmp_path / "tests" / "test_z.py").write_text("from conftests import nothing  # another module\n")
    assert conftest_imports(tmp_path) == ["tests/a/test_x.py:2", "tests/test_y.py:1"]
