"""Issue 27 item 2: which tier the gate probes with the L3 tier on, and when it asks a prefix served
before the restart back from storage (only under the cache identity the instance was validated with)."""

from plugins import load

rollout = load("roles/rollout/filter_plugins/rollout.py", "rollout_filters")

L3 = {"name": "main", "hicache": True, "l3": {"id": "abc123", "dir": "/var/lib/sglang/l3/main/abc123"}}


def test_the_tier_is_all_with_the_l3_tier_both_with_hicache_device_without():
    assert rollout.rollout_gate_tier(L3) == "all"
    assert rollout.rollout_gate_tier({"hicache": True}) == "both"
    assert rollout.rollout_gate_tier({"hicache": False}) == "device"
    assert rollout.rollout_gate_tier(L3, "host") == "host"


def test_the_restart_read_is_required_only_under_the_validated_identity():
    same = {"instances": {"main": {"l3_id": "abc123"}}}
    other = {"instances": {"main": {"l3_id": "fff000"}}}
    assert rollout.rollout_gate_restart_storage(L3, same, 0.8) == 0.8
    assert rollout.rollout_gate_restart_storage(L3, other, 0.8) is None  # a new identity starts empty
    assert rollout.rollout_gate_restart_storage(L3, {"instances": {}}, 0.8) is None  # never validated
    assert rollout.rollout_gate_restart_storage({"name": "main"}, same, 0.8) is None  # no L3 tier now


def test_the_validated_record_keeps_the_identity():
    summary = rollout.rollout_gate_summary({"item": L3, "warm": {}, "server": {}})
    assert summary["l3_id"] == "abc123"
    assert rollout.rollout_gate_summary({"item": {"name": "main"}})["l3_id"] == ""
