"""Issue 24: no key in what `ansible-playbook -vvv` prints. The role entry points a test can run on
localhost (the rollout's settings, the service's plan, its validation by preflight, the release
staged into a state directory under tmp, the fast path's fingerprints and record check) run at -vvv
with a fleet key, per-instance keys, the router's key, an HF token and an index URL with a password;
none of them is in the output, and the keys are where they must be: the release's secrets file (0600).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLEET, OWN, ADMIN, ROUTER, HF, PASSWORD = ("vv-fleet-Q1x", "vv-own-R2y", "vv-admin-S3z", "vv-router-T4w",
                                           "hf_vv-U5v", "vv-pw-V6u")
SECRETS = (FLEET, OWN, ADMIN, ROUTER, HF, PASSWORD)

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: rollout, tasks_from: settings}
    - ansible.builtin.include_role: {name: sglang_service, tasks_from: plan.yml}
    - ansible.builtin.include_role: {name: sglang_service, tasks_from: validate.yml}
    - ansible.builtin.include_role: {name: sglang_service, tasks_from: release.yml}
    - ansible.builtin.include_role: {name: rollout, tasks_from: converged.yml}
"""


def play(tmp_path: Path, fleet: str, own: str, admin: str, router: str, hf: str, password: str) -> str:
    """The entry points at -vvv with these secrets; the output."""
    state = tmp_path / "state"
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    variables = {
        "ansible_python_interpreter": sys.executable,
        "sglang_service_state_dir": str(state),
        "sglang_service_python": sys.executable,
        "sglang_service_model_path": "/srv/models/main",
        "sglang_service_draft_model_path": "/srv/models/draft",
        "sglang_service_hicache_enabled": False,
        "sglang_service_api_key": fleet,
        "sglang_service_instances": [
            {"name": "main", "port": 30004},
            {"name": "own", "port": 30005, "api_key": own, "admin_api_key": admin},
        ],
        "rollout_router_api_key": router,
        "rollout_converged_path": str(tmp_path / "converged.json"),
        "models_hf_token": hf,
        "sglang_venv_index_url": f"https://bob:{password}@127.0.0.1:9/idx",
    }
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-vvv", "-i", "localhost,",
         str(tmp_path / "play.yml"), "-e", f"@{tmp_path / 'vars.json'}"],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout + run.stderr


def fingerprints(output: str) -> list[str]:
    """The fast path's fingerprints as -v prints them (the release's and each install phase's)."""
    return re.findall(r"^\s+(?:_rollout_fingerprint|rocm|venv|models): ([0-9a-f]{64})$", output, re.M)


def test_minus_vvv_prints_no_key(tmp_path):
    state = tmp_path / "state"
    output = play(tmp_path, *SECRETS)
    # The run went through every entry point (their task names are in the output).
    for task in ("Settings | the router's key", "Plan | merge profile", "Checks | every finding of the plan",
                 "Release | keep the candidate", "Converged | the host's record"):
        assert task in output
    # The digest of what the service plan was rendered from covers the keys: never printed.
    assert "_sglang_service_planned_from" not in output
    for secret in SECRETS:
        assert secret not in output, f"{secret} printed:\n" + "\n".join(
            line for line in output.splitlines() if secret in line)
    # The keys are in the release's secrets file (root only), the fleet key in main's, the
    # instance's own keys in own's.
    main = list((state / "main" / "releases").glob("*/secrets.yaml"))
    own = list((state / "own" / "releases").glob("*/secrets.yaml"))
    assert len(main) == 1
    assert len(own) == 1
    assert json.loads(main[0].read_text()) == {"api-key": FLEET}
    assert json.loads(own[0].read_text()) == {"api-key": OWN, "admin-api-key": ADMIN}
    for path in (main[0], own[0]):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert FLEET not in path.with_name("env").read_text()
    # The printed fingerprints do not depend on a key (a hash over one would let a guess be tested):
    # the same after every secret rotated.
    printed = fingerprints(output)
    assert len(printed) == 4
    rotated = play(tmp_path, *(secret[::-1] for secret in SECRETS))
    assert fingerprints(rotated) == printed
