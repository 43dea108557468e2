"""Issue 24, "Done when" 2, on the A/B's fleet: where the keys are after every run of the scenario.

The fleet carries three api keys (secret-keys.json, written by side_effect_secrets.yml, 0600):
`instance`, main's own key (scenario.yml); `vault`, the fleet's key (vault.yml, ansible-vault), which
aux serves with; `extra`, a random key given with -e sglang_service_api_key to a run refused by a
live lock holder and to a --check --diff run. After the whole rollout (converge), the refused run,
a site.yml whose probe gate fails and is rolled back (gate_fault.yml), --check --diff, the failed
A/B, the A/B at -v and idempotence (and the whole run after the failed gate), each key is searched for:
- in the runs' outputs (each at -v; the check run with --diff);
- in every file of the test host (a whole-filesystem grep, /proc, /sys and /dev left out): only the
  instances' root-only secrets files (and release copies of them) may hold one; journald's own files
  are allowed, root and systemd-journal only;
- in the journal as journalctl shows it: to a user in neither systemd-journal nor adm (nothing), and
  to root, where systemd 252 (no LogFilterPatterns=) would keep a key SGLang logs with its ServerArgs:
  one may come only from its instance's own unit (the simulator here logs none: found none);
- in what the runs wrote on the controller: the ephemeral directory (inventory, rollout reports,
  the router's log, the outputs), the A/B reports, the fact cache, the scenario logs, and the
  files of /tmp and ~/.ansible written since the scenario's hosts were created.
The search itself: molecule/resources/secret_search.py (shared with molecule/sglang_service). A
summary (paths and key names, never a key) goes to <ephemeral dir>/secret-search.json.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

# The secrets search, shared by the scenarios' verify files.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resources"))
import secret_search

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

SCENARIO = Path(__file__).resolve().parents[1]
PROJECT = SCENARIO.parents[1]
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY") or Path(inventory).resolve().parents[1])
REPORTS = PROJECT / ".cache" / "ab-benchmark-reports"
HOST = "ab-benchmark-1"
ADDRESS = "127.0.18.1"
PORTS = {"main": 30004, "aux": 30010}
# Which key each instance serves with (scenario.yml, vault.yml).
SERVES = {"main": "instance", "aux": "vault"}
OUTSIDER = "nobody"
# The runs' outputs (side_effect_secrets.yml, side_effect.yml), each at -v.
OUTPUTS = {
    "refused second run": "secrets-refused.log",
    "failed gate": "secrets-gate.log",
    "whole run after it": "secrets-after-gate.log",
    "--check --diff": "secrets-check-diff.log",
    "A/B": "ab-verbose.log",
}
SUMMARY = EPHEMERAL / "secret-search.json"


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    path = EPHEMERAL / "secret-keys.json"
    assert path.exists(), f"{path} is missing: run `molecule side-effect -s ab_benchmark` before verify"
    return json.loads(path.read_text())


def named(keys: dict[str, str], text: str) -> list[str]:
    """The names of the keys in `text` (a failure message never shows a key)."""
    return sorted(name for name, key in keys.items() if key in text)


def summarize(part: str, value) -> None:
    summary = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    summary[part] = value
    SUMMARY.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def status(port: int, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{ADDRESS}:{port}/get_model_info",
                                                           headers=headers), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_three_keys_and_the_vault_one_is_encrypted_in_the_repository(keys):
    assert sorted(keys) == ["extra", "instance", "vault"]
    assert len(set(keys.values())) == 3
    assert all(re.fullmatch(r"[A-Za-z0-9-]{16,}", key) for key in keys.values())
    vault = (SCENARIO / "inventory" / "group_vars" / "sglang_hosts" / "vault.yml").read_text()
    assert "sglang_service_api_key: !vault |" in vault
    assert "$ANSIBLE_VAULT;1.1;AES256" in vault
    # Neither the vault key nor the -e key is written in the scenario's files.
    plain = secret_search.controller_hits([SCENARIO], [keys["vault"], keys["extra"]])
    assert not plain, list(plain)


@pytest.mark.parametrize("name", PORTS)
def test_each_instance_serves_with_its_key_only(name, keys):
    """The keys reached the servers (so the search below looks for keys that are there)."""
    port, own = PORTS[name], keys[SERVES[name]]
    assert status(port, None) == 401
    for other in sorted(set(keys) - {SERVES[name]}):
        assert status(port, keys[other]) == 401, other
    assert status(port, own) == 200


def failures(output: str, keys: dict[str, str]) -> str:
    """What a run's output says went wrong (its fatal, unreachable and recap lines, at most 12), each
    key replaced by its name: an assertion's message shows why a run failed some other way."""
    lines = [line for line in output.splitlines()
             if re.search(r"fatal:|UNREACHABLE|FAILED!|ERROR|ROLLOUT|: ok=\d+", line)][-12:]
    text = "\n".join(line[:300] for line in lines)
    for name, key in keys.items():
        text = text.replace(key, f"<{name} key>")
    return text


def test_the_runs_ran_at_v_and_did_what_they_say(keys):
    text = {run: (EPHEMERAL / log).read_text() for run, log in OUTPUTS.items()}
    for run, output in text.items():
        assert re.search(r"^Using .*ansible\.cfg as config file$", output, re.M), f"{run}: not run at -v"
    refused, gate = text["refused second run"], text["failed gate"]
    assert "ROLLOUT REFUSED: another run holds the lock" in refused, failures(refused, keys)
    assert f"ROLLOUT STOPPED at {HOST}" in gate, failures(gate, keys)
    assert "SIMULATOR fault generate_500" in gate, failures(gate, keys)
    assert "check mode: would take out aux" in text["--check --diff"]  # the -e key changes aux's release
    for run in ("whole run after it", "--check --diff", "A/B"):
        assert re.search(rf"^{HOST} +: ok=\d+ +changed=\d+ +unreachable=0 +failed=0 ", text[run], re.M), run


def test_no_key_in_the_runs_outputs(keys):
    found = {run: named(keys, (EPHEMERAL / log).read_text()) for run, log in OUTPUTS.items()}
    summarize("outputs", found)
    assert not any(found.values()), f"keys in the runs' -v/--diff output: {found}"


def test_no_key_in_any_file_of_the_host_but_its_secrets_files(host, keys):
    hits = secret_search.host_hits(host, keys.values())
    by_key = {key: name for name, key in keys.items()}
    summarize("host files", {hit.path: [f"{hit.mode:o} {hit.owner}:{hit.group}",
                                        sorted(by_key[key] for key in hit.keys)] for hit in hits})
    # The search finds what is there: each instance's secrets file holds the key it serves with.
    held = {hit.path: {by_key[key] for key in hit.keys} for hit in hits}
    for name, key in SERVES.items():
        assert key in held.get(f"/etc/sglang/{name}.secrets.yaml", set()), (name, sorted(held))
    wrong = secret_search.misplaced(hits)
    assert not wrong, "a key in files other than its secrets files: " + ", ".join(
        f"{hit} holds {sorted(by_key[key] for key in hit.keys)}" for hit in wrong)


def test_the_journal_shows_no_key_to_another_user_and_to_root_only_the_instances_own_lines(host, keys):
    groups = set(host.check_output(f"id -nG {OUTSIDER}").split())
    assert not groups & {"systemd-journal", "adm", "wheel", "root"}, groups
    as_outsider = secret_search.journal_as(host, OUTSIDER)
    assert not named(keys, as_outsider), f"keys in the journal as {OUTSIDER}: {named(keys, as_outsider)}"
    # As root: what systemd 252 stores (roles/sglang_service/README.md, "Where secrets live").
    version = int(host.check_output("systemctl --version").split()[1])
    by_key = {key: name for name, key in keys.items()}
    found = {unit or "(no unit)": {by_key[key]: number for key, number in counts.items()}
             for unit, counts in secret_search.journal_keys(host, keys.values()).items()}
    summarize("journal as root", {"systemd": version, "messages with a key, by unit": found})
    if version >= 253:
        assert not found, found  # LogFilterPatterns= drops the lines with a key
        return
    # SGLang's ServerArgs line at each start (here the simulator's), in its own unit, with its own key.
    own = {f"sglang-{name}.service": {SERVES[name]} for name in SERVES}
    wrong = {unit: counts for unit, counts in found.items() if set(counts) - own.get(unit, set())}
    assert not wrong, f"journal messages with a key outside the instance's own unit, or another key: {found}"


def test_no_key_in_what_the_runs_wrote_on_the_controller(keys):
    config = EPHEMERAL / "instance_config.yml"
    since = config.stat().st_mtime if config.exists() else time.time() - 3 * 3600
    tmp = Path("/tmp")
    # Not this machine's own job directories (they are not the toolkit's).
    skip = [EPHEMERAL / "secret-keys.json", *tmp.glob("bash_jobs.*"), *tmp.glob("bash_tool_*")]
    roots = [EPHEMERAL, REPORTS, REPORTS.with_name(REPORTS.name + "-failed"), PROJECT / ".cache" / "facts",
             PROJECT / ".cache" / "logs"]
    found = secret_search.controller_hits(roots, keys.values(), skip=skip)
    found |= secret_search.controller_hits([tmp, Path.home() / ".ansible"], keys.values(), since=since, skip=skip)
    by_key = {key: name for name, key in keys.items()}
    leaked = {path: sorted(by_key[key] for key in held) for path, held in found.items()}
    summarize("controller files", leaked)
    assert not leaked, f"keys in files the runs wrote on the controller: {leaked}"
