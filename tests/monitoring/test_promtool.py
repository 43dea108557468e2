"""roles/monitoring's generated files through the real promtool: the scrape configuration and the
rules pass `promtool check`, and the alert rules' unit tests (rules_test.yml: series that must fire
and series that must not) pass `promtool test rules`. Also what the generated files say."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from monitoring_inputs import HOSTS, promtool

HERE = Path(__file__).resolve().parent


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *argv], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_config_and_rules(rendered):
    config = run("check", "config", "etc/prometheus.yml", cwd=rendered)
    assert config.returncode == 0, config.stdout + config.stderr
    assert "SUCCESS: 2 rule files found" in config.stdout + config.stderr
    rules = run("check", "rules", "etc/hicache-fleet/rules.yml", "etc/hicache-fleet/validated.yml", cwd=rendered)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 6 rules found" in rules.stdout + rules.stderr


def unit_tests(rendered: Path, text: str) -> str:
    """rules_test.yml with each expected alert's static description taken from the rendered rules
    (promtool compares annotations too; the summaries, which template labels, are written out)."""
    rules = yaml.safe_load((rendered / "etc" / "hicache-fleet" / "rules.yml").read_text())
    described = {r["alert"]: r["annotations"].get("description") for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load(text)
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            for alert in check["exp_alerts"]:
                notes = alert.setdefault("exp_annotations", {})
                if "description" not in notes and described.get(check["alertname"]):
                    notes["description"] = described[check["alertname"]]
    return yaml.safe_dump(tests, sort_keys=False)


def test_alert_rule_unit_tests(rendered):
    (rendered / "rules_test.yml").write_text(unit_tests(rendered, (HERE / "rules_test.yml").read_text()))
    result = run("test", "rules", "rules_test.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_test_can_fail(rendered, tmp_path):
    """The unit tests are not vacuous: expecting h1 (healthy) instead of h2 fails."""
    indent = "\n              "
    broken = (HERE / "rules_test.yml").read_text().replace(
        f"instance: 127.0.22.2:30004{indent}fleet_host: h2", f"instance: 127.0.22.1:30004{indent}fleet_host: h1", 1)
    (rendered / "broken_test.yml").write_text(unit_tests(rendered, broken))
    result = run("test", "rules", "broken_test.yml", cwd=rendered)
    assert result.returncode != 0
    assert "HiCacheHostTierStopped" in result.stdout + result.stderr


def test_scrape_targets_come_from_the_inventory(rendered):
    config = yaml.safe_load((rendered / "etc" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sglang = [(sc["targets"], sc["labels"]) for sc in jobs["sglang"]["static_configs"]]
    assert sglang == [([f"{addr}:30004"], {"fleet_host": host, "sglang_instance": "main"})
                      for host, addr in HOSTS.items()]
    assert jobs["sglang-router"]["static_configs"] == [{"targets": ["127.0.22.9:29000"]}]


def test_validated_figures_only_for_validated_hosts(rendered):
    groups = yaml.safe_load((rendered / "etc" / "hicache-fleet" / "validated.yml").read_text())["groups"]
    rules = groups[0]["rules"]
    cold = {r["labels"]["fleet_host"]: r["expr"] for r in rules
            if r["record"] == "hicache_fleet:validated_cold_ttft_seconds"}
    assert cold == {"h1": "vector(1.0)", "h3": "vector(1.0)"}


def test_dashboard_has_the_panels_and_the_hosts(rendered):
    board = json.loads((rendered / "grafana" / "hicache-fleet.json").read_text())
    titles = " | ".join(p["title"] for p in board["panels"])
    for word in ("TTFT", "by tier", "host pool", "Queue", "Restarts", "Router"):
        assert word in titles, titles
    hosts = next(v for v in board["templating"]["list"] if v["name"] == "fleet_host")
    assert hosts["query"] == "h1,h2,h3"
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert any('cache_source' in e for e in exprs)
