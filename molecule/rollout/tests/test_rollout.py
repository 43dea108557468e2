"""After the good rollout, the broken change and the good re-run: every host serves the good
config, validated by its probe gate, on its own address."""

import json
import os

import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("sglang_hosts")

UNIT = "sglang-main.service"


def journal(host) -> str:
    return host.run(f"journalctl -u {UNIT} -n 30 --no-pager").stdout


def test_service_runs_and_listens_on_own_address(host):
    address = host.ansible.get_variables()["ansible_host"]
    assert host.service(UNIT).is_running, journal(host)
    assert host.socket(f"tcp://{address}:30004").is_listening, journal(host)


def test_served_config_is_the_good_one(host):
    env = host.file("/etc/sglang/main.env")
    assert env.mode == 0o600
    assert "SGLANG_SIM_FAULT" not in host.run("cat /etc/sglang/main.env").stdout


def test_validated_record_matches_the_running_config(host):
    record = json.loads(host.file("/var/lib/hicache-fleet/validated.json").content_string)
    main = record["instances"]["main"]
    assert main["probe"]["gate"]["passed"] is True
    current = host.run("readlink -f /var/lib/sglang/main/current").stdout.strip()
    release = json.loads(host.file(f"{current}/release.json").content_string)
    assert release["config_hash"] == main["config_hash"]


def test_host_tier_was_proven(host):
    record = json.loads(host.file("/var/lib/hicache-fleet/validated.json").content_string)
    warm_host = record["instances"]["main"]["probe"]["warm"]["host"]
    assert warm_host["host_cached_fraction"] >= 0.8


def test_router_routes_to_the_host_and_finds_it_healthy(host):
    """The real sglang-router on the controller lists this host's instance, healthy: it joined on
    the first rollout and came back after the broken change's rollback."""
    from urllib.request import urlopen

    variables = host.ansible.get_variables()
    with urlopen(f"{variables['rollout_router_url']}/workers", timeout=10) as answer:
        workers = json.load(answer)["workers"]
    mine = [w for w in workers if w["url"] == f"http://{variables['ansible_host']}:30004"]
    assert len(mine) == 1, workers
    assert mine[0]["is_healthy"] is True
