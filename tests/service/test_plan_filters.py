"""The sglang_service filters that replaced inline ternaries in tasks/plan.yml, verify.yml and
wait.yml, each against the old expression (evaluated with Ansible's own filters) for every case the
old ternary branched on."""

from __future__ import annotations

import json

import pytest
from jinja_old import expr, render
from plugins import load

F = load("roles/sglang_service/filter_plugins/sglang_service.py")

PROFILE = {"--model-path": "/srv/models/m", "--tp-size": 2, "--mem-fraction-static": 0.8}
HICACHE = {"--enable-hierarchical-cache": True, "--hicache-size": 48, "--mem-fraction-static": 0.7}
OLD_ARGS = ("profile | combine(hicache_args if hicache_on else {}) | combine(overrides)"
            " | combine({'--host': bind, '--port': port})")


@pytest.mark.parametrize("hicache_on", [True, False])
@pytest.mark.parametrize("overrides", [{}, {"--tp-size": 1, "--port": 1, "--context-length": 131072}])
def test_launch_args_keep_the_order_and_values(hicache_on, overrides):
    names = {"profile": PROFILE, "hicache_args": HICACHE, "hicache_on": hicache_on, "overrides": overrides,
             "bind": "127.0.0.1", "port": 30004}
    new = F.launch_args(PROFILE, HICACHE, hicache_on, overrides, "127.0.0.1", 30004)
    old = expr(OLD_ARGS, **names)
    assert new == old
    assert list(new) == list(old)  # the argv follows the mapping's order
    assert F.argv(new) == F.argv(old)


@pytest.mark.parametrize("hicache_on", [True, False])
@pytest.mark.parametrize("args", [{"--hicache-size": 48, "--tp-size": 2}, {"--hicache-size": 0}, {}])
def test_host_pool_gb_is_0_with_hicache_off(hicache_on, args):
    old = F.host_pool_gb(args) if hicache_on else 0
    assert F.host_pool_gb(args, hicache_on) == old


@pytest.mark.parametrize("deny", [True, False])
@pytest.mark.parametrize("bind", ["127.0.0.1", "10.0.0.7", "0.0.0.0", "not-an-address"])  # noqa: S104
def test_ip_allow_without_deny_is_empty_and_checks_nothing(deny, bind):
    if not deny:
        assert F.ip_allow(bind, "http://10.0.0.1:29000", [], 24, False) == []
    elif bind == "not-an-address":
        with pytest.raises(F.AnsibleFilterError):
            F.ip_allow(bind, "http://10.0.0.1:29000", [], 24, deny)
    else:
        url = "http://10.0.0.1:29000"
        assert F.ip_allow(bind, url, [], 24, deny) == F.ip_allow(bind, url, [], 24)


@pytest.mark.parametrize("secrets_set", [True, False])
def test_config_args(secrets_set):
    argv = ["-m", "sglang.launch_server", "--context-length", "None"]  # flatten drops a 'None' word, as before
    old = expr("[argv, (['--config', path] if secrets_set else [])] | flatten",
               argv=argv, path="/p", secrets_set=secrets_set)
    new = expr("[argv, extra] | flatten", argv=argv, extra=F.config_args(secrets_set, "/p"))
    assert new == old


OLD_PROTECT = "setting if setting != 'auto' else ('read-only' if home | length > 0 else 'yes')"


@pytest.mark.parametrize("setting", ["auto", "yes", "read-only", "tmpfs", "no"])
@pytest.mark.parametrize("home", [[], ["/home/eng/models/m"]])
def test_protect_home(setting, home):
    assert F.protect_home(setting, home) == expr(OLD_PROTECT, setting=setting, home=home)


@pytest.mark.parametrize("secrets_set", [True, False])
def test_secrets_digest(secrets_set):
    content = json.dumps({"api-key": "k"}, indent=4)
    old = expr("((salt ~ content) | hash('sha256')) if secrets_set else ''", salt="s4lt", content=content,
               secrets_set=secrets_set)
    assert F.secrets_digest(content, "s4lt", secrets_set) == old


OLD_PARSE = (
    "{{ item.item.unit }}: {{ 'SGLang is not importable with ' ~ sglang_service_python"
    " if (_result.import_error | default(false)) else 'SGLang rejects the launch arguments of profile '"
    " ~ item.item.profile ~ ' (HiCache ' ~ ('on' if item.item.hicache else 'off') ~ ')' }}:"
    " {{ _result.message | default((item.stderr | default('') | trim) or item.msg | default('no output'), true) }}."
    " {{ 'Install the venv (roles/sglang_venv) or set sglang_service_python.'"
    " if (_result.import_error | default(false)) else 'Fix the flag in sglang_service_profiles['"
    " ~ item.item.profile ~ '], sglang_service_hicache_args or the instance args.' }}"
    " Nothing was installed; the running service was left alone."
)
OLD_RESULT = ("item.stdout | default('{}', true) | from_json"
              " if (item.stdout | default('') | trim).startswith('{') else {}")
ENTRY = {"unit": "sglang-main.service", "profile": "seed-validated", "hicache": True}


@pytest.mark.parametrize("result", [
    {"rc": 2, "stdout": json.dumps({"ok": False, "message": "unrecognized arguments: --bogus"}), "stderr": ""},
    {"rc": 3, "stdout": json.dumps({"ok": False, "import_error": True, "message": "No module named sglang"}),
     "stderr": "x"},
    {"rc": 3, "stdout": json.dumps({"ok": False, "import_error": True}), "stderr": "  Traceback ...\n"},
    {"rc": 1, "stdout": "", "stderr": "boom\n"},
    {"rc": 1, "stdout": "not json", "stderr": "", "msg": "non-zero return code"},
    {"rc": 1, "stdout": "", "stderr": ""},
    {"rc": 1, "stdout": "  " + json.dumps({"message": ""}), "stderr": "", "msg": "m"},
])
@pytest.mark.parametrize("hicache", [True, False])
def test_parse_refusal(result, hicache):
    item = {**result, "item": {**ENTRY, "hicache": hicache}}
    old_result = expr(OLD_RESULT, item=item)
    old = render(OLD_PARSE, item=item, _result=old_result, sglang_service_python="/opt/sglang/current/bin/python")
    assert F.parse_refusal(item, "/opt/sglang/current/bin/python") == old


OLD_ANALYZE = (
    "{{ item.item.unit }}: systemd-analyze verify {{ 'failed' if item.rc != 0 else 'warns' }}:"
    " {{ _mine | join(' | ') if _mine | length > 0 else (item.stderr | trim) }}."
    " Fix the template input (sglang_service_unit_extra, sglang_service_device_allow, paths)."
    " Nothing was installed."
)
OLD_MINE = ("(item.stdout_lines + item.stderr_lines)"
            " | select('search', item.item.unit | regex_escape ~ '|' ~ item.item.staging_dir | regex_escape) | list")


@pytest.mark.parametrize("rc", [0, 1])
@pytest.mark.parametrize("stderr", ["/run/s/sglang-main.service:12: Unknown key name 'Foo'\nother", "  unrelated  \n"])
def test_analyze_complaint(rc, stderr):
    item = {"rc": rc, "stdout_lines": [], "stderr": stderr, "stderr_lines": stderr.splitlines(),
            "item": {"unit": "sglang-main.service", "staging_dir": "/run/s"}}
    mine = expr(OLD_MINE, item=item)
    assert F.analyze_complaint(item, mine) == render(OLD_ANALYZE, item=item, _mine=mine)


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1", "fd00::7", "gpu1.lan"])
def test_url_host(bind):
    assert F.url_host(bind) == expr("'[' ~ b ~ ']' if ':' in b else b", b=bind)


OLD_JOURNAL = ("_log.stdout | default('') if _log.rc | default(1) == 0"
               " else 'journalctl failed: ' ~ _log.stderr | default('')")


@pytest.mark.parametrize("log", [
    {"rc": 0, "stdout": "line 1\nline 2", "stderr": ""},
    {"rc": 0},
    {"rc": 1, "stdout": "", "stderr": "No journal files were found."},
    {"rc": 1},
    {"skipped": True},
])
def test_journal(log):
    assert F.journal(log) == expr(OLD_JOURNAL, _log=log)


def test_not_running_lists_the_instances_whose_release_is_not_the_running_one():
    """tasks/verify.yml runs SGLang's checks only for these (a running release was checked when installed)."""
    plan = [{"name": "main", "release_dir": "/r/main/aaa"}, {"name": "draft", "release_dir": "/r/draft/bbb"}]
    assert F.not_running(plan, {"main": "/r/main/aaa", "draft": "/r/draft/bbb"}) == []
    assert F.not_running(plan, {"main": "/r/main/aaa", "draft": "/r/draft/old"}) == [plan[1]]
    # A host without any release yet (no `current` link): every instance.
    assert F.not_running(plan, {"main": "", "draft": ""}) == plan
    assert F.not_running(plan, {}) == plan
    assert F.not_running([], {"main": "/r/main/aaa"}) == []
