"""The sglang_venv role's filters against the inline Jinja they replaced (tasks/preflight.yml,
install.yml, switch.yml, prune.yml): the old expression, evaluated with Ansible's own filters, and
the filter give the same value for each case the old ternary branched on."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from jinja_old import expr, render
from plugins import load

F = load("roles/sglang_venv/filter_plugins/sglang_venv.py")

OLD_CAPTURE_ERROR = ("(r.stdout | from_json).message | default('') if r.stdout is match('^[{]')"
                     " else (r.stderr | trim)")


@pytest.mark.parametrize("result", [
    {"rc": 1, "stdout": json.dumps({"message": "file x differs"}), "stderr": ""},
    {"rc": 1, "stdout": json.dumps({"ok": False}), "stderr": "ignored"},
    {"rc": 1, "stdout": "", "stderr": "  Traceback: boom\n"},
    {"rc": 1, "stdout": " {not first}", "stderr": "said on stderr"},
])
def test_capture_error(result):
    assert F.capture_error(result) == expr(OLD_CAPTURE_ERROR, r=result)


OLD_PYTHON = "(p.stdout | from_json) if p.rc == 0 else {'full': 'missing', 'xy': '0.0'}"
OLD_NOTE = "(' (' ~ (p.stderr | default('') | trim) ~ ')') if p.rc != 0 else ''"


@pytest.mark.parametrize("probe", [
    {"rc": 0, "stdout": '{"full": "3.12.3", "xy": "3.12"}', "stderr": ""},
    {"rc": 2, "stdout": "", "stderr": " No such file or directory \n"},
    {"rc": 2, "msg": "[Errno 2] No such file"},
    {"rc": 1, "stdout": "", "stderr": ""},
])
def test_python_version_and_probe_note(probe):
    assert F.python_version(probe) == expr(OLD_PYTHON, p=probe)
    assert F.probe_note(probe) == expr(OLD_NOTE, p=probe)


def test_python_version_of_a_failed_probe_is_a_fresh_dict():
    first = F.python_version({"rc": 1})
    first["full"] = "changed"
    assert F.python_version({"rc": 1}) == {"full": "missing", "xy": "0.0"}


OLD_SPEC = """{{ (_capture_spec if capture | length > 0 else _set_spec) | to_json(sort_keys=true) }}"""


def _old_spec(capture, summary, offline, require_hashes, hashes_lines, index_url, extra):
    capture_spec = {"capture": expr("(s | default({})).archive_sha256 | default('')", s=summary), "python": "3.12.3"}
    set_spec = {
        "package_set": "rocm-gfx1100", "python": "3.12.3", "constraints": ["torch==2.9.1"],
        "steps": [{"name": "torch", "packages": ["torch"]}],
        "index_url": expr("'' if o else u", o=offline, u=index_url),
        "extra_index_urls": expr("[] if o else e", o=offline, e=extra),
        "wheelhouse": ["abc  x.whl"],
        "require_hashes": expr("h | default([]) if r | bool else false", h=hashes_lines, r=require_hashes),
    }
    return render(OLD_SPEC, capture=capture, _capture_spec=capture_spec, _set_spec=set_spec)


@pytest.mark.parametrize("capture,summary", [("", {}), ("/c/x.tar", {"archive_sha256": "f" * 64}), ("/c/y.tar", {})])
@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize("require_hashes", [True, False])
def test_release_spec_hashes_as_before(capture, summary, offline, require_hashes):
    lines = ["torch==2.9.1 --hash=sha256:aa"]
    set_spec = {
        "package_set": "rocm-gfx1100", "python": "3.12.3", "constraints": ["torch==2.9.1"],
        "steps": [{"name": "torch", "packages": ["torch"]}],
        "index_url": "INDEX-MAIN", "extra_index_urls": ["INDEX-EXTRA"],
        "wheelhouse": ["abc  x.whl"], "require_hashes": lines,
    }
    new = F.release_spec(set_spec, len(capture) > 0, summary, offline, require_hashes)
    old = _old_spec(capture, summary, offline, require_hashes, lines, "INDEX-MAIN", ["INDEX-EXTRA"])
    assert json.dumps(new, sort_keys=True) == old
    assert hashlib.sha256(json.dumps(new, sort_keys=True).encode()).hexdigest()


OLD_NAME = ("release or (version ~ '-' ~ (('capture-' ~ summary.name) if capture | length > 0 else package_set)"
            " ~ '-' ~ hash[:12])")


@pytest.mark.parametrize("release,capture,summary", [
    ("", "", {}), ("", "/c/x.tar", {"name": "engineer-box"}), ("mine", "/c/x.tar", {"name": "n"}), ("mine", "", {}),
])
def test_release_name(release, capture, summary):
    names = {"version": "0.5.23", "package_set": "rocm-gfx1100", "hash": "0123456789abcdef", "capture": capture,
             "summary": summary, "release": release}
    new = release or F.release_name("0123456789abcdef", "0.5.23", "rocm-gfx1100", len(capture) > 0, summary)
    assert new == expr(OLD_NAME, **names)


@pytest.mark.parametrize("stat", [
    {"exists": True, "islnk": True, "lnk_target": "/opt/sglang/venvs/a"},
    {"exists": True, "islnk": False, "isdir": True},
    {"exists": False},
])
def test_link_target(stat):
    assert F.link_target(stat) == expr("s.lnk_target if s.islnk | default(false) else ''", s=stat)


@pytest.mark.parametrize("exists", [True, False])
def test_marker_hash(exists):
    marker = {"content": base64.b64encode(b"  abc123\n").decode()} if exists else {"skipped": True}
    stat = {"stat": {"exists": exists}}
    old = expr("(m.content | b64decode | trim) if s.stat.exists else ''", m=marker, s=stat)
    assert F.marker_hash(marker, stat) == old


OLD_PLAN = ("Would build release {{ r }} at {{ p }} with {{ 'Python ' ~ v.full }}"
            " {{- ' offline from the wheelhouse ' ~ w if o else '' }}:"
            " {% for step in steps %}[{{ step.name }}{{ ' --no-deps' if step.no_deps else '' }}:"
            " {{ step.packages | join(' ') }}] {% endfor %}")
STEPS = [
    {"name": "torch", "packages": ["torch==2.9.1", "torchvision"], "no_deps": False, "index_url": "INDEX-Torch",
     "extra_index_url": []},
    {"name": "sglang", "packages": ["sglang==0.5.23"], "no_deps": True, "index_url": "", "extra_index_url": ["INDEX-A"]},
    {"name": "extra packages", "packages": ["x"], "no_deps": False, "index_url": "INDEX-torch",
     "extra_index_url": ["INDEX-B", "INDEX-C"]},
]


@pytest.mark.parametrize("steps", [STEPS, STEPS[1:2], []])
@pytest.mark.parametrize("offline,wheelhouse", [(True, "/srv/wh"), (False, "")])
def test_build_plan(steps, offline, wheelhouse):
    old = render(OLD_PLAN, r="0.5.23-set-abc", p="/opt/sglang/venvs/0.5.23-set-abc", v={"full": "3.12.3"},
                 w=wheelhouse, o=offline, steps=steps)
    new = F.build_plan(steps, "0.5.23-set-abc", "/opt/sglang/venvs/0.5.23-set-abc", "3.12.3", offline, wheelhouse)
    assert new == old


OLD_STEP_ARGV = """pip
 + (['--no-deps'] if item.no_deps else [])
 + ([] if offline
    else (['--index-url', item.index_url] if item.index_url else [])
         + (item.extra_index_url | map('regex_replace', '^', '--extra-index-url=') | list))
 + (['-c', path ~ '/.hicache-fleet-constraints.txt']
    if constraints | length > 0 else [])
 + item.packages"""
PIP = ["/v/bin/python", "-m", "pip", "install", "--no-input"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize("constraints", [[], ["torch==2.9.1"]])
def test_step_argv(step, offline, constraints):
    old = expr(OLD_STEP_ARGV, pip=PIP, item=step, offline=offline, path="/v", constraints=constraints)
    assert F.step_argv(step, PIP, offline, constraints, "/v") == old


OLD_LOCK = ("([] if offline else (steps | map(attribute='index_url') | select | unique"
            " | map('regex_replace', '^', '--extra-index-url=') | list))")


@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize("steps", [STEPS, STEPS[1:2], []])
def test_lock_index_args(steps, offline):
    new = F.lock_index_args(steps, offline)
    assert new == expr(OLD_LOCK, steps=steps, offline=offline)
    if steps == STEPS and not offline:
        assert new == ["--extra-index-url=INDEX-Torch"]  # the same index once, first spelling kept


OLD_SWITCH = ("([{'name': 'previous', 'target': cur}] if cur else [])"
              " + [{'name': 'current', 'target': path}]")


@pytest.mark.parametrize("current", ["", "/opt/sglang/venvs/old"])
def test_switch_links(current):
    assert F.switch_links(current, "/opt/sglang/venvs/new") == expr(OLD_SWITCH, cur=current, path="/opt/sglang/venvs/new")


@pytest.mark.parametrize("keep", [[], ["/opt/sglang/venvs/pinned"]])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_kept(keep, n):
    newest = ["/v/c", "/v/b", "/v/a"]
    old = expr("keep if keep | length > 0 else newest[:n | int]", keep=keep, newest=newest, n=n)
    assert F.kept(newest, keep, n) == old


def test_release_spec_leaves_an_index_password_out():
    """Issue 24: the spec is recorded (.hicache-fleet-packages.json, 0644) and hashed into the
    release name; an index URL's user:password is neither, and a rotated password is the same release."""
    def spec(password):
        return F.release_spec({
            "package_set": "rocm-gfx1100", "python": "3.12.3", "constraints": [],
            "steps": [{"name": "torch", "packages": ["torch"], "index_url": f"https://bob:{password}@wheels.example/rocm",
                       "extra_index_url": [f"https://bob:{password}@127.0.0.2:9/idx"]}],
            "index_url": f"https://bob:{password}@127.0.0.1:9/idx",
            "extra_index_urls": [f"https://tok-{password}@127.0.0.2:9/idx", "https://127.0.0.3:9/idx"],
            "wheelhouse": [], "require_hashes": [],
        }, False, {}, False, False)
    first = spec("pw-Venv-1")
    text = json.dumps(first, sort_keys=True)
    assert "pw-Venv-1" not in text
    assert "bob" not in text
    assert first["index_url"] == "https://127.0.0.1:9/idx"
    assert first["extra_index_urls"] == ["https://127.0.0.2:9/idx", "https://127.0.0.3:9/idx"]
    assert first["steps"][0]["index_url"] == "https://wheels.example/rocm"
    assert first["steps"][0]["extra_index_url"] == ["https://127.0.0.2:9/idx"]
    assert json.dumps(spec("pw-Venv-2"), sort_keys=True) == text


OLD_STEPS = """
{%- set steps = [] -%}
{%- set extras = [] -%}
{%- if extra_packages | length > 0 -%}
{%-   set _ = extras.append({'name': 'extra packages', 'packages': extra_packages, 'no_deps': extra_no_deps}) -%}
{%- endif -%}
{%- for step in set_steps + extras -%}
{%-   set extra_urls = step.extra_index_url | default([]) -%}
{%-   set extra_urls = [extra_urls] if extra_urls is string else extra_urls -%}
{%-   set _ = steps.append({
        'name': step.name | default('step ' ~ loop.index),
        'packages': step.packages | list,
        'no_deps': step.no_deps | default(false) | bool,
        'index_url': step.index_url | default('') | string,
        'extra_index_url': extra_urls | select | list}) -%}
{%- endfor -%}
{{ steps | to_json }}
"""


@pytest.mark.parametrize("extra", [[], ["sglang-sim"]])
@pytest.mark.parametrize("extra_no_deps", [False, "yes"])
def test_normalize_steps_as_the_jinja_it_replaced(extra, extra_no_deps):
    set_steps = [
        {"name": "torch", "packages": ["torch==2.9.1"], "no_deps": False, "index_url": "https://127.0.0.1:9/rocm"},
        {"packages": ["sglang==0.5.19"], "no_deps": "true", "extra_index_url": "https://127.0.0.2:9/x"},
        {"name": "more", "packages": ["a", "b"], "extra_index_url": ["", "https://127.0.0.3:9/y"]},
    ]
    old = json.loads(render(OLD_STEPS, set_steps=set_steps, extra_packages=extra, extra_no_deps=extra_no_deps))
    assert F.normalize_steps(set_steps, extra, extra_no_deps) == old


def test_index_auth_writes_a_netrc_that_python_reads_with_decoded_passwords(tmp_path):
    """pip gets the index credentials from a netrc file (NETRC), read by Python's netrc module as
    requests reads it: one entry per host, the user and password percent-decoded as pip decodes a
    URL's userinfo, quoted so that spaces, quotes and backslashes survive; a token without a
    password is a login alone."""
    import netrc

    steps = F.normalize_steps([
        {"name": "torch", "packages": ["torch"], "index_url": "https://bob:p%40ss%20%22q%5C@127.0.0.7:8443/rocm"},
        {"name": "rest", "packages": ["x"], "extra_index_url": ["https://tok-only@127.0.0.8/idx",
                                                                 "https://127.0.0.9/idx"]},
    ], [], False)
    auth = F.index_auth(steps, "https://bob:p%40ss%20%22q%5C@127.0.0.7:8443/other", [], "s")
    assert auth["errors"] == []
    assert auth["hosts"] == ["127.0.0.7", "127.0.0.8"]
    (tmp_path / "netrc").write_text(auth["netrc"])
    parsed = netrc.netrc(str(tmp_path / "netrc"))
    assert parsed.authenticators("127.0.0.7") == ("bob", "", 'p@ss "q\\')
    assert parsed.authenticators("127.0.0.8") == ("tok-only", "", "")
    assert parsed.authenticators("127.0.0.9") is None
    # What pip's argv and the records hold instead.
    assert [s["index_url"] for s in F.steps_public(steps)] == ["https://127.0.0.7:8443/rocm", ""]
    assert F.steps_public(steps)[1]["extra_index_url"] == ["https://127.0.0.8/idx", "https://127.0.0.9/idx"]
    assert F.index_auth(F.normalize_steps([{"packages": ["x"]}], [], False), "", [], "s") == {
        "netrc": "", "hosts": [], "errors": []}


def test_index_auth_refuses_what_a_netrc_cannot_hold_naming_the_variable_not_the_password():
    steps = F.normalize_steps([{"name": "torch", "packages": ["torch"], "index_url": "https://bob:pw-B@127.0.0.7/r"}],
                              [], False)
    auth = F.index_auth(steps, "https://bob:pw-A@127.0.0.7/idx", ["https://al:p/ss@127.0.0.6/x"], "rocm-gfx1100")
    assert auth["errors"] == [
        "sglang_venv_extra_index_urls[0] has an '@' after its host part: percent-encode the user and password "
        "(%40 for @, %2F for /, %3A for :)",
        "the index_url of step 'torch' in sglang_venv_package_sets['rocm-gfx1100'] and sglang_venv_index_url give "
        "different credentials for the host 127.0.0.7; pip's netrc holds one login per host: use one account for both",
    ]
    assert "pw-" not in json.dumps(auth["errors"])
    assert "p/ss" not in json.dumps(auth["errors"])


def test_sets_public_leaves_every_index_password_out():
    sets = {"rocm": {"steps": [{"name": "t", "packages": ["torch"], "index_url": "https://bob:pw-S@127.0.0.7/r",
                                "extra_index_url": ["https://bob:pw-S@127.0.0.8/x"]}],
                     "lock": {"torch_find_links": "https://bob:pw-S@127.0.0.7/r", "require_hashes": True}},
            "plain": {"steps": [{"packages": ["x"]}]}}
    public = F.sets_public(sets)
    assert "pw-S" not in json.dumps(public)
    assert public["rocm"]["lock"] == {"torch_find_links": "https://127.0.0.7/r", "require_hashes": True}
    assert public["plain"] == sets["plain"]
    assert "pw-S" in json.dumps(sets)  # the inventory's value is not changed
