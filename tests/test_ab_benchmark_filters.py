"""playbooks/ab_benchmark.yml reads the live release's interpreter and model paths with these filters."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja_old import expr, render
from plugins import load

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    return load(path, name)


AB = _load("ab_benchmark_filters", ROOT / "playbooks" / "filter_plugins" / "ab_benchmark.py")
SERVICE = _load("sglang_service_filters_ab", ROOT / "roles" / "sglang_service" / "filter_plugins" / "sglang_service.py")

UNIT = """# Ansible managed
[Service]
Type=exec
Environment=PYTHONUNBUFFERED=1
ExecStart={python} -m sglang.launch_server \\
    --model-path /srv/models/m \\
    --port 30004
Restart=on-failure
"""


@pytest.mark.parametrize(
    "python",
    ["/opt/sglang/releases/test-minimal-3c9f/bin/python", "/opt/my venv/bin/python", "/opt/50%/$x/bin/py\"thon"],
)
def test_exec_python_reads_what_the_role_wrote(python):
    unit = UNIT.format(python=SERVICE.systemd_quote(python))
    assert SERVICE.exec_python(unit) == python


def test_exec_python_without_execstart_fails():
    with pytest.raises(SERVICE.AnsibleFilterError, match="no ExecStart"):
        SERVICE.exec_python("[Service]\nType=exec\nExecStart=\n")


def test_flag_value():
    argv = ["--model-path", "/srv/models/m", "--enable-cache-report", "--speculative-draft-model-path=/d", "--x"]
    assert SERVICE.argv_value(argv, "--model-path") == "/srv/models/m"
    assert SERVICE.argv_value(argv, "--speculative-draft-model-path") == "/d"
    assert SERVICE.argv_value(argv, "--enable-cache-report") == ""
    assert SERVICE.argv_value(argv, "--x") == ""
    assert SERVICE.argv_value(argv, "--absent") == ""


# --- the filters that replaced inline ternaries: each against the old expression -------------------

INSTANCES = [{"name": "main", "port": 30004}, {"name": "second", "port": 30005}, {"name": "main", "port": 1}]
OLD_INSTANCE = ("(instances | selectattr('name', 'equalto', ab_instance) | first)"
                " if ab_instance is defined else instances | first")


@pytest.mark.parametrize("name", ["main", "second", None])
def test_instance(name):
    names = {"instances": INSTANCES} | ({} if name is None else {"ab_instance": name})
    assert AB.instance(INSTANCES, name) == expr(OLD_INSTANCE, **names)


def test_instance_not_found_fails():
    # The play's first assert refuses an ab_instance that is not among the instances.
    with pytest.raises(AB.AnsibleFilterError, match="no instance 'other'"):
        AB.instance(INSTANCES, "other")


OLD_URL = ("'http://' ~ ('[' ~ host ~ ']' if ':' in host else host) ~ ':' ~ port")
OLD_HOST = "'127.0.0.1' if bind in ['0.0.0.0', '', '*'] else ('::1' if bind == '::' else bind)"


@pytest.mark.parametrize("bind", ["0.0.0.0", "", "*", "::", "127.0.0.1", "10.0.0.7", "fd00::7", "gpu1.lan"])  # noqa: S104
@pytest.mark.parametrize("port", [30004, "30005"])
def test_probe_url(bind, port):
    host = expr(OLD_HOST, bind=bind)
    assert AB.probe_url(bind, port) == expr(OLD_URL, host=host, port=port)


@pytest.mark.parametrize("stat", [{"exists": True, "islnk": True, "lnk_source": "/var/lib/sglang/main/releases/a"},
                                  {"exists": True, "islnk": False}, {"exists": False}])
def test_link_source(stat):
    assert SERVICE.link_source(stat) == expr("s.lnk_source if s.islnk | default(false) else ''", s=stat)


def _figures(tag):
    return {key: f"{tag}-{key}" for key in AB._CASE_FIGURES}


PROBES = {
    "baseline": {"cold": _figures("b-cold"), "warm": {"device": _figures("b-dev"), "host": _figures("b-host")},
                 "server": {"max_total_num_tokens": 233207}},
    "hicache": {"cold": _figures("h-cold"), "warm": {"device": _figures("h-dev"), "host": _figures("h-host")},
                "server": {"max_total_num_tokens": 159692}},
}
OLD_ROW = {
    "name": "{{ ('HiCache' if item.hicache else 'baseline') ~ ' · ' ~ item.label }}",
    "hicache": "{{ item.hicache }}", "tier": "{{ item.tier }}",
    **{key: "{{ _figures." + key + " }}" for key in AB._CASE_FIGURES},
    "max_total_num_tokens": "{{ _probe.server.max_total_num_tokens }}",
}


@pytest.mark.parametrize("hicache", [False, True])
@pytest.mark.parametrize("tier", ["cold", "device", "host"])
def test_case(hicache, tier):
    item = {"arm": "HiCache" if hicache else "baseline", "hicache": hicache, "tier": tier, "label": "lbl"}
    probe = expr("_ab_probe_hicache if item.hicache else _ab_probe_baseline", item=item,
                 _ab_probe_hicache=PROBES["hicache"], _ab_probe_baseline=PROBES["baseline"])
    figures = expr("_probe.cold if item.tier == 'cold' else _probe.warm[item.tier]", _probe=probe, item=item)
    old = {key: expr(text[3:-3], item=item, _figures=figures, _probe=probe) for key, text in OLD_ROW.items()}
    assert AB.case(item, PROBES["baseline"], PROBES["hicache"]) == old
    assert render("{{ 'HiCache' if item.hicache else 'baseline' }} {{ item.tier }}", item=item) == \
        render("{{ item.arm }} {{ item.tier }}", item=item)


OLD_FAILURE = ("(_failed_items | first).msg if _failed_items | length > 0"
               " else ansible_failed_result.msg | default('no detail')")


@pytest.mark.parametrize("result", [
    {"failed": True, "msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine"}, {"skipped": True}, {"failed": True, "msg": "item two broke"},
        {"failed": True, "msg": "item three broke"}]},
    {"failed": True, "msg": "the task broke"},
    {"failed": True, "results": []},
    {"failed": True, "msg": "no item failed", "results": [{"failed": False, "msg": "x"}]},
])
def test_failure(result):
    items = expr("r.results | default([]) | selectattr('failed', 'defined') | selectattr('failed') | list", r=result)
    assert AB.failure(result) == expr(OLD_FAILURE, _failed_items=items, ansible_failed_result=result)


@pytest.mark.parametrize("exists", [True, False])
@pytest.mark.parametrize("draft", ["", "/srv/models/d"])
def test_message_fragments_read_as_before(exists, draft):
    # fail_msg and the release's debug message: the inline if/else became {% if %} blocks.
    names = {"exists": exists, "draft": draft}
    old = render("in R/unit{{ '; the file exists but is not executable' if exists else '' }}). model M"
                 " {{- (', draft ' ~ draft) if draft | length > 0 else '' }}.", **names)
    new = render("in R/unit{% if exists %}; the file exists but is not executable{% endif %}). model M"
                 "{% if draft | length > 0 %}, draft {{ draft }}{% endif %}.", **names)
    assert new == old
