"""The sglang_service role's rendering, checked against the seed report.

The unit is rendered by Ansible itself (ansible-playbook on localhost runs the role's plan phase,
which templates the unit and env file), then its ExecStart is split with systemd's quoting rules:

- seed-validated + HiCache equals the report's section-6 command flag for flag (paths and names
  aside), in a deterministic order (profile order, then the HiCache args);
- seed-baseline equals section 5.2, and turning HiCache on adds exactly section 5.3's
  EXTRA_HICACHE_ARGS (the A/B toggles only HiCache);
- a model path with a space, quotes, `%` and `$` reaches the process unchanged.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import service_render
from plugins import load
from service_render import run_plan

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang_service"
SEED_REPORT = ROOT.parent / "shared" / "seed" / "hicache-7900xtx-report.zh.txt"

# Copy of the report's section-6 command, used when the report is not beside the checkout.
SECTION_6 = r"""
/home/didilc/sglang-qwen/.venv/bin/python -m sglang.launch_server \
  --model-path /home/didilc/models/vllm/Qwen3.8-27B-W4A16-AutoRound-GPTQ \
  --served-model-name qwen3.8-27b-w4a16-dflash2-hicache \
  --host 127.0.0.1 \
  --port 30004 \
  --tp-size 2 \
  --quantization gptq \
  --dtype bfloat16 \
  --mamba-ssm-dtype bfloat16 \
  --kv-cache-dtype bfloat16 \
  --attention-backend triton \
  --context-length 196608 \
  --mem-fraction-static 0.80 \
  --max-running-requests 3 \
  --max-mamba-cache-size 20 \
  --chunked-prefill-size 2048 \
  --enable-mixed-chunk \
  --cuda-graph-bs-decode 1 2 4 \
  --triton-attention-num-kv-splits 16 \
  --reasoning-parser qwen3 \
  --tool-call-parser qwen3_coder \
  --enable-cache-report \
  --enable-hierarchical-cache \
  --hicache-size 12 \
  --hicache-ratio 2.0 \
  --hicache-io-backend kernel \
  --hicache-host-memory-mode cache \
  --hicache-write-policy write_through \
  --speculative-algorithm DFLASH \
  --speculative-draft-model-path /home/didilc/models/Qwen3.8-27B-DFlash2-W4A16 \
  --speculative-draft-model-quantization compressed-tensors \
  --speculative-num-draft-tokens 8 \
  --speculative-draft-window-size 2048 \
  --stream-interval 1
"""

# Paths and names differ per deployment by design; every other flag must match the seed exactly.
PATHS_AND_NAMES = {"--model-path", "--speculative-draft-model-path", "--served-model-name"}
WEIRD_MODEL = '/srv/models/Qwen 27B "W4A16" 100% $HOME'


# --- reading the seed -----------------------------------------------------------------------------
def shell_commands(text: str) -> list[list[str]]:
    """Each `... -m sglang.launch_server ...` command of a shell snippet (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    return [shlex.split(line) for line in joined.splitlines() if "-m sglang.launch_server" in line]


def section(text: str, start: str, end: str | None) -> str:
    begin = text.index(start)
    finish = text.index(end, begin) if end else len(text)
    return text[begin:finish]


def seed_text() -> str | None:
    return SEED_REPORT.read_text(encoding="utf-8") if SEED_REPORT.is_file() else None


def seed_section_6() -> list[str]:
    text = seed_text()
    snippet = section(text, "\n6. ", None) if text else SECTION_6
    (command,) = shell_commands(snippet)
    return command


def as_mapping(argv: list[str]) -> dict[str, list[str]]:
    """Server argv → {flag: [values]} (switches map to [])."""
    mapping: dict[str, list[str]] = {}
    flag = None
    for word in argv:
        if word.startswith("--"):
            assert word not in mapping, f"{word} given twice"
            flag = word
            mapping[flag] = []
        else:
            assert flag is not None, f"value {word!r} before any flag"
            mapping[flag].append(word)
    return mapping


def server_args(command: list[str]) -> list[str]:
    index = command.index("-m")
    assert command[index + 1] in {"sglang.launch_server", "sglang_sim.launch_server"}
    return command[index + 2 :]


# --- systemd's ExecStart syntax (systemd.service(5), "Command lines") ----------------------------
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", " ": " ", ";": ";"}


def systemd_split(line: str) -> list[str]:
    """Split an ExecStart value as systemd does: quotes, C escapes, %% and $$ (no env present)."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word, quote = [], None
        if line[i] in "\"'":
            quote = line[i]
            i += 1
        while i < n:
            char = line[i]
            if quote and char == quote:
                i += 1
                break
            if not quote and char in " \t":
                break
            if char == "\\" and i + 1 < n:
                word.append(_ESCAPES.get(line[i + 1], line[i + 1]))
                i += 2
                continue
            if char in "%$" and i + 1 < n and line[i + 1] == char:
                word.append(char)
                i += 2
                continue
            assert char not in "%$", f"unescaped {char} in {line!r} would be expanded by systemd"
            word.append(char)
            i += 1
        words.append("".join(word))
    return words


def exec_start(unit: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", unit)
    (line,) = [line for line in joined.splitlines() if line.startswith("ExecStart=")]
    return systemd_split(line.removeprefix("ExecStart="))


# --- rendering through Ansible -------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return run_plan(tmp_path_factory.mktemp("render"), {
        "sglang_service_instances": [
            {"name": "main", "port": 30004},
            {"name": "baseline", "port": 30010, "profile": "seed-baseline", "hicache_enabled": False},
            {"name": "ab", "port": 30011, "profile": "seed-baseline", "hicache_enabled": True},
            {"name": "weird", "port": 30012, "args": {"--model-path": WEIRD_MODEL}},
            {"name": "homey", "port": 30013, "args": {"--model-path": "/home/ops/models/main"}},
        ],
    })


# What the toolkit adds to the seed's command lines (Prometheus metrics for roles/monitoring): the
# rendered unit must carry it; the comparisons with the seed below see the command without it.
TOOLKIT_SWITCHES = ("--enable-metrics",)


def rendered_args(rendered: Path, name: str) -> list[str]:
    argv = server_args(exec_start((rendered / f"sglang-{name}.service").read_text(encoding="utf-8")))
    for switch in TOOLKIT_SWITCHES:
        assert argv.count(switch) == 1, f"{switch} missing from sglang-{name}.service"
    return [word for word in argv if word not in TOOLKIT_SWITCHES]


# --- the tests -----------------------------------------------------------------------------------
def test_seed_validated_equals_section_6_flag_for_flag(rendered):
    seed = as_mapping(server_args(seed_section_6()))
    ours = as_mapping(rendered_args(rendered, "main"))
    assert set(ours) == set(seed), f"missing {set(seed) - set(ours)}, extra {set(ours) - set(seed)}"
    for flag, values in seed.items():
        if flag not in PATHS_AND_NAMES:
            assert ours[flag] == values, f"{flag}: rendered {ours[flag]} != seed {values}"
    assert ours["--model-path"] == ["/srv/models/main"]
    assert ours["--speculative-draft-model-path"] == ["/srv/models/draft"]


def test_render_order_is_profile_then_hicache(rendered):
    seed_flags = list(as_mapping(server_args(seed_section_6())))
    hicache = [flag for flag in seed_flags if flag.startswith(("--hicache-", "--enable-hierarchical-cache"))]
    expected = [flag for flag in seed_flags if flag not in hicache] + hicache
    assert list(as_mapping(rendered_args(rendered, "main"))) == expected


def test_seed_baseline_equals_section_5_2_and_hicache_adds_exactly_5_3(rendered):
    text = seed_text()
    if text is None:
        pytest.skip("seed report not beside the checkout (../shared/seed)")
    part_52 = section(text, "5.2 ", "5.3 ")
    part_53 = section(text, "5.3 ", "5.4 ")
    (baseline_cmd,) = shell_commands(part_52)
    baseline = as_mapping([w for w in server_args(baseline_cmd) if w != "$EXTRA_HICACHE_ARGS"])
    extra = re.search(r'EXTRA_HICACHE_ARGS="([^"]*)"', part_53, re.S)
    assert extra, "section 5.3 has no EXTRA_HICACHE_ARGS"
    hicache = as_mapping(shlex.split(extra.group(1).replace("\\\n", " ")))

    off = as_mapping(rendered_args(rendered, "baseline"))
    on = as_mapping(rendered_args(rendered, "ab"))
    variables = PATHS_AND_NAMES | {"--port"}  # "$MODEL_PATH", "$PORT"… in the report
    assert set(off) == set(baseline)
    for flag, values in baseline.items():
        if flag not in variables:
            assert off[flag] == values, flag
    assert {k: v for k, v in on.items() if k not in off} == hicache
    assert {k: v for k, v in on.items() if k in off and k != "--port"} == {
        k: v for k, v in off.items() if k != "--port"
    }


def test_path_with_space_quotes_percent_and_dollar_survives_systemd_quoting(rendered):
    unit = (rendered / "sglang-weird.service").read_text(encoding="utf-8")
    args = as_mapping(server_args(exec_start(unit)))
    assert args["--model-path"] == [WEIRD_MODEL]


def test_unit_carries_the_hardening_and_limits(rendered):
    unit = (rendered / "sglang-main.service").read_text(encoding="utf-8")
    assert unit.startswith("#\n# Ansible managed")
    for line in (
        "LimitMEMLOCK=infinity",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/kfd rw",
        "MemoryMax=90%",
        "TasksMax=8192",
        "Restart=on-failure",
        "EnvironmentFile=/etc/sglang/main.env",
        "User=sglang",
        "SupplementaryGroups=render video",
        "ProtectHome=yes",
    ):
        assert f"\n{line}\n" in unit, line
    # KMS card nodes only on request (sglang_service_allow_kms_nodes; tests/service/test_unit_confine.py).
    assert "DeviceAllow=char-drm" not in unit
    plan = {entry["name"]: entry for entry in json.loads((rendered / "plan.json").read_text())}
    cache = f"/var/lib/sglang/main/cache/{plan['main']['config_hash'][:12]}"
    assert f"\nReadWritePaths=/var/lib/sglang/main/home {cache}\n" in unit
    command = exec_start(unit)
    assert command[:3] == ["/opt/sglang/current/bin/python", "-m", "sglang.launch_server"]


def test_models_under_home_make_home_read_only(rendered):
    plan = {entry["name"]: entry for entry in json.loads((rendered / "plan.json").read_text())}
    assert plan["main"]["protect_home"] == "yes"
    assert plan["homey"]["protect_home"] == "read-only"
    assert "\nProtectHome=read-only\n" in (rendered / "sglang-homey.service").read_text(encoding="utf-8")
    assert len({entry["config_hash"] for entry in plan.values()}) == len(plan)


# --- the role's filters as plain functions -------------------------------------------------------
def _filters():
    return load(ROLE / "filter_plugins" / "sglang_service.py")


def test_argv_switches_lists_and_dropped_flags():
    filters = _filters()
    args = {"--a": True, "--b": False, "--c": None, "--d": [1, 2, 4], "--e": "0.80", "--f": 3}
    assert filters.argv(args) == ["--a", "--d", "1", "2", "4", "--e", "0.80", "--f", "3"]
    with pytest.raises(filters.AnsibleFilterError, match="not a long SGLang flag"):
        filters.argv({"tp-size": 2})
    with pytest.raises(filters.AnsibleFilterError, match="not a scalar"):
        filters.argv({"--x": {"nested": 1}})


@pytest.mark.parametrize("word", ["plain", "/a b/c", 'q"uote', "back\\slash", "50%", "$HOME", ";", "", "a'b"])
def test_systemd_quote_round_trips(word):
    assert systemd_split(_filters().systemd_quote(word)) == [word]


def test_host_pool_and_pruning():
    filters = _filters()
    assert filters.host_pool_gb({"--tp-size": 2, "--hicache-size": 12}) == 24
    assert filters.host_pool_gb({"--hicache-size": "3"}) == 3
    assert filters.host_pool_gb({"--tp-size": 2, "--hicache-size": 0.5}) == 0
    found = [{"path": f"r{i}", "mtime": i} for i in range(6)]
    assert load("module_utils/sglang_service_release.py").prune_releases(found, 3, ["r0"]) == ["r2", "r1"]


def test_fleet_args_override_the_profile_and_instances_override_them(tmp_path):
    """sglang_service_args (where a host class's measured sizing goes) applies to every instance after
    the profile and the HiCache args; an instance's own args still win; null drops a flag."""
    out = run_plan(tmp_path, {
        "sglang_service_args": {"--mem-fraction-static": "0.85", "--max-running-requests": None},
        "sglang_service_instances": [
            {"name": "main", "port": 30004},
            {"name": "own", "port": 30010, "args": {"--mem-fraction-static": "0.70"}},
        ],
    })
    main = as_mapping(rendered_args(out, "main"))
    assert main["--mem-fraction-static"] == ["0.85"]
    assert "--max-running-requests" not in main
    assert main["--hicache-size"] == ["12"]
    assert as_mapping(rendered_args(out, "own"))["--mem-fraction-static"] == ["0.70"]


# The unit is rendered once per instance (tasks/plan.yml, sglang_service_unit_release): the real cache
# directory takes the stand-in's place in the text whose hash names the release. Checked here against
# what the role did before, the template rendered a second time with the real directory, and the hash
# taken as hash('sha256') takes it; with the defaults (replaced) and a state dir that systemd must
# quote (a space, a %: rendered again).
UNIT_AS_BEFORE = """
    - name: The unit and the hash as two renders give them
      ansible.builtin.set_fact:
        _before: "{{ _before | default([]) + [{'name': item.name, 'unit': _unit, 'hash': _hash}] }}"
      vars:
        _tpl: "{{ unit_template }}"
        _standin: >-
          {{ lookup('ansible.builtin.template', _tpl,
                    template_vars={'instance': item | combine({'cache_dir': item.cache_root ~ '/release-id'})}) }}
        _digest: >-
          {{ _sglang_service_secret_contents[item.name]
             | sglang_service_secrets_digest(_sglang_service_salt | default(''), item.secrets_set) }}
        _hash: "{{ (_standin ~ _sglang_service_env_contents[item.name] ~ _digest) | hash('sha256') }}"
        _unit: "{{ lookup('ansible.builtin.template', _tpl, template_vars={'instance': item}) }}"
      loop: "{{ _sglang_service_plan }}"
    - name: The same unit and hash
      ansible.builtin.assert:
        that:
          - item.0.config_hash == item.1.hash
          - item.0.unit_content == item.1.unit
          - item.0.cache_dir == item.0.cache_root ~ '/' ~ item.1.hash[:12]
          - ('/cache/' ~ item.1.hash[:12] ~ '/') in item.0.unit_content
          - "'/release-id' not in item.0.unit_content"
        fail_msg: >-
          {{ item.0.name }}: hash {{ item.0.config_hash == item.1.hash }},
          unit {{ item.0.unit_content == item.1.unit }}, cache_dir {{ item.0.cache_dir }}
      loop: "{{ _sglang_service_plan | zip(_before) | list }}"
      loop_control:
        label: "{{ item.0.name }}"
    - name: Report
      ansible.builtin.debug:
        msg: "UNITS-CHECKED {{ _sglang_service_plan | length }}"
"""


@pytest.mark.parametrize("state_dir", [None, "/var/lib/sg lang%x"])
def test_one_render_gives_the_unit_and_hash_two_renders_gave(tmp_path, state_dir):
    playbook = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: sglang_service, tasks_from: plan.yml, public: true}
"""
    extra = {"sglang_service_instances": [
        {"name": "main", "port": 30004},
        {"name": "weird", "port": 30012, "args": {"--model-path": WEIRD_MODEL}, "api_key": "k-123"}]}
    extra["unit_template"] = str(service_render.ROOT / "roles/sglang_service/templates/sglang.service.j2")
    if state_dir:
        extra["sglang_service_state_dir"] = state_dir
    run = service_render.run_playbook(tmp_path, playbook + UNIT_AS_BEFORE, extra)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "UNITS-CHECKED 2" in run.stdout
