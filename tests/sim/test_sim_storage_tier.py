"""The simulator's L3 tier: SGLang 0.5.23's `--hicache-storage-backend file`, as real files."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

from simharness import SIM_DIR, SMALL_ENV, SMALL_HICACHE_ARGS

BPT = "64"  # bytes per token per rank in the page files (small, so tests write little)
NAME = re.compile(r"^[0-9a-f]{64}_(.+)_([01])_2\.bin$")


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(248_320) for _ in range(n)]


def _settle(sim) -> None:
    """Wait (bounded) until the simulator's L3 writer has written every queued page."""
    deadline = time.monotonic() + 20
    while sim.get_json("/get_server_info")["sglang_sim"].get("storage_pages_pending", 0):
        assert time.monotonic() < deadline, "L3 writes still pending after 20 s"
        time.sleep(0.01)


def _gen(sim, ids):
    out = _gen_only(sim, ids)
    _settle(sim)
    return out


def _gen_only(sim, ids):
    return sim.post_json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4,
                                                                  "temperature": 0}})


def _details(out):
    return out["meta_info"].get("cached_tokens_details")


def _start(sim_factory, store, extra_env=None, extra_args=()):
    env = {**SMALL_ENV, "SGLANG_SIM_STORAGE_BYTES_PER_TOKEN": BPT,
           "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(store), **(extra_env or {})}
    return sim_factory([*SMALL_HICACHE_ARGS, "--hicache-storage-backend", "file", *extra_args],
                       env)


def _du(store) -> int:
    return sum(os.path.getsize(store / f) for f in os.listdir(store) if f.endswith(".bin"))


def test_flushed_prefix_comes_back_from_storage(sim_factory, tmp_path, model_dir):
    store = tmp_path / "l3"
    sim = _start(sim_factory, store)
    ids = _ids(1, 1500)
    first = _gen(sim, ids)
    assert _details(first) is None
    files = sorted(os.listdir(store))
    assert files, "no page files written"
    model_name = "-".join(str(model_dir).split("/"))
    for f in files:
        m = NAME.match(f)
        assert m, f
        assert m.group(1) == model_name, f
    assert len([f for f in files if f.endswith("_0_2.bin")]) == len(files) // 2
    assert sim.request("POST", "/flush_cache")[0] == 200
    assert sorted(os.listdir(store)) == files  # flush_cache leaves L3 alone
    again = _gen(sim, ids)
    d = _details(again)
    assert d["device"] == 0
    assert d["host"] == 0
    assert d["storage"] > 1000
    assert d["storage_backend"] == "HiCacheFile"
    assert again["meta_info"]["cached_tokens"] == d["storage"]
    assert again["text"] == first["text"]
    metrics = sim.request("GET", "/metrics")[1].decode()
    line = [x for x in metrics.splitlines()
            if x.startswith("sglang:cached_tokens_total") and 'cache_source="storage"' in x]
    assert line
    assert float(line[0].rsplit(" ", 1)[1]) == d["storage"]
    third = _gen(sim, ids)  # now on device again
    assert _details(third)["device"] >= d["storage"]
    assert _details(third)["storage"] == 0


def test_storage_survives_a_restart_and_another_dir_reads_nothing(sim_factory, tmp_path):
    store = tmp_path / "l3"
    ids = _ids(2, 1200)
    sim = _start(sim_factory, store)
    _gen(sim, ids)
    sim.stop()
    assert sim.proc.poll() is not None
    again = _start(sim_factory, store)
    d = _details(_gen(again, ids))
    assert d["storage"] > 900
    assert d["device"] == 0
    assert d["host"] == 0
    again.stop()
    other = _start(sim_factory, tmp_path / "other")
    out = _gen(other, ids)
    assert _details(out) is None
    assert out["meta_info"]["cached_tokens"] == 0


def test_size_limit_holds_under_a_load_larger_than_it(sim_factory, tmp_path):
    store = tmp_path / "l3"
    cap = 200_000  # per rank, bytes ("200k" as human_readable_int reads it)
    sim = _start(sim_factory, store, {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "200k",
                                      "SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO": "0.5"})
    for seed in range(10, 20):  # 10 x 1000 tokens x 64 B = 640 kB per rank written
        _gen(sim, _ids(seed, 1000))
        assert _du(store) <= 2 * cap
    info = sim.get_json("/get_server_info")["sglang_sim"]
    assert info["storage_pages_evicted"] > 0
    assert _du(store) == 2 * info["storage_tracked_bytes_per_rank"]
    # the most recent prompt is still there, the first one is gone
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, _ids(19, 1000)))["storage"] > 0
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, _ids(10, 1000))) is None


def test_a_backend_other_than_file_is_refused(model_dir):
    env = {**os.environ, **SMALL_ENV, "PYTHONPATH": str(SIM_DIR)}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model_dir),
         *SMALL_HICACHE_ARGS, "--port", "1", "--hicache-storage-backend", "mooncake"],
        env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "SIMULATOR: --hicache-storage-backend mooncake is not simulated" in proc.stderr


def test_a_restart_with_a_cap_adopts_and_trims_the_pages_already_there(sim_factory, tmp_path):
    store = tmp_path / "l3"
    sim = _start(sim_factory, store)  # no cap: unbounded, as 0.5.23 without MAX_SIZE
    for seed in range(30, 35):  # 5 x 1000 tokens x 64 B = 320 kB per rank
        _gen(sim, _ids(seed, 1000))
        time.sleep(0.02)  # distinct mtimes: the startup scan orders by mtime
    sim.stop()
    assert _du(store) > 2 * 300_000
    capped = _start(sim_factory, store, {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "200k",
                                         "SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO": "0.5"})
    # startup scan (oldest mtime first) finds 320 kB > 200 kB and evicts down to 100 kB
    assert _du(store) <= 2 * 100_000
    info = capped.get_json("/get_server_info")["sglang_sim"]
    assert info["storage_pages_evicted"] > 0
    assert "HiCacheFile eviction enabled: cap=200000 B" in capped.log()
    assert _details(_gen(capped, _ids(30, 1000))) is None  # the oldest prompt went first


def test_identity_is_model_path_and_tp_layout_only_as_in_0_5_23(sim_factory, tmp_path):
    """HiCacheFile keys a page by its token hash + _{model_path}_{tp_rank}_{tp_size}: nothing
    else. Another KV dtype (or model revision behind the same path) reads the old pages as
    valid; another TP size or page size reads nothing. The toolkit names the directory per
    identity because of this."""
    store = tmp_path / "l3"
    ids = _ids(3, 1200)
    sim = _start(sim_factory, store)
    _gen(sim, ids)
    sim.stop()
    fp8 = _start(sim_factory, store, extra_args=["--kv-cache-dtype", "fp8_e4m3"])
    assert _details(_gen(fp8, ids))["storage"] > 900  # the danger: read as if valid
    fp8.stop()
    paged = _start(sim_factory, store, extra_args=["--page-size", "16"])
    assert _details(_gen(paged, ids)) is None
    paged.stop()
    tp1 = _start(sim_factory, store, {"SGLANG_SIM_GPU_MEM_GB": "24,24"},
                 extra_args=["--tp-size", "1"])
    assert _details(_gen(tp1, ids)) is None


def test_storage_hit_ttft_is_between_host_hit_and_cold(sim_factory, tmp_path):
    sim = _start(sim_factory, tmp_path / "l3")
    ids = _ids(4, 2000)
    cold = _gen(sim, ids)["meta_info"]["sglang_sim"]
    sim.request("POST", "/flush_cache")
    storage = _gen(sim, ids)["meta_info"]["sglang_sim"]
    assert storage["storage_hit_tokens"] > 1800
    info = sim.get_json("/get_server_info")["sglang_sim"]
    n, hit = 2000, storage["storage_hit_tokens"]
    expected = ((n - hit) / info["prefill_rate_tokens_per_s"]
                + hit / info["load_rate_tokens_per_s"]
                + hit / info["storage_load_rate_tokens_per_s"])
    assert abs(storage["modelled_prefill_s"] - expected) < 1e-9
    host_hit = (n - hit) / info["prefill_rate_tokens_per_s"] + hit / info["load_rate_tokens_per_s"]
    assert host_hit < storage["modelled_prefill_s"] < cold["modelled_prefill_s"]


def test_extra_config_sets_dir_and_cap_and_bad_json_fails_startup(sim_factory, tmp_path,
                                                                  model_dir):
    store = tmp_path / "from-extra"
    cfg = json.dumps({"file_storage_path": str(store), "max_size": "100k"})
    sim = sim_factory([*SMALL_HICACHE_ARGS, "--hicache-storage-backend", "file",
                       "--hicache-storage-backend-extra-config", cfg],
                      {**SMALL_ENV, "SGLANG_SIM_STORAGE_BYTES_PER_TOKEN": BPT})
    for seed in range(40, 44):
        _gen(sim, _ids(seed, 1000))
    assert 0 < _du(store) <= 2 * 100_000
    info = sim.get_json("/get_server_info")["sglang_sim"]
    assert info["storage_dir"] == str(store)
    assert info["storage_max_size_bytes_per_rank"] == 100_000
    env = {**os.environ, **SMALL_ENV, "PYTHONPATH": str(SIM_DIR)}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model_dir),
         *SMALL_HICACHE_ARGS, "--port", "1", "--hicache-storage-backend", "file",
         "--hicache-storage-backend-extra-config", "{not json"],
        env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "--hicache-storage-backend-extra-config" in proc.stderr


def test_a_storage_hit_below_the_prefetch_threshold_is_not_used(sim_factory, tmp_path):
    """cache_controller: fewer than prefetch_threshold (256) hit tokens are not prefetched."""
    sim = _start(sim_factory, tmp_path / "l3")
    ids = _ids(5, 300)  # two whole blocks (~146 tokens each) in storage, only one usable
    _gen(sim, ids)
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, ids)) is None
    longer = _ids(6, 700)
    _gen(sim, longer)
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, longer))["storage"] >= 256


def test_clear_endpoint_removes_every_file_in_the_dir(sim_factory, tmp_path):
    """HiCacheFile.clear removes every regular file in the directory, any identity's."""
    store = tmp_path / "l3"
    sim = _start(sim_factory, store)
    ids = _ids(7, 1000)
    _gen(sim, ids)
    (store / "other-identity_x_0_1.bin").write_bytes(b"x")
    assert len(os.listdir(store)) > 1
    status, body, _ = sim.request("POST", "/hicache/storage-backend/clear")
    assert status == 200
    assert body == b"Hierarchical cache storage backend cleared.\n"
    assert os.listdir(store) == []
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, ids)) is None


def test_storage_backend_without_hicache_writes_nothing(sim_factory, tmp_path):
    store = tmp_path / "l3"
    sim = sim_factory(["--enable-cache-report", "--hicache-storage-backend", "file"],
                      {**SMALL_ENV, "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(store)})
    ids = _ids(8, 1000)
    _gen(sim, ids)
    sim.request("POST", "/flush_cache")
    assert _details(_gen(sim, ids)) is None
    assert not store.exists()
    assert "--hicache-storage-backend is ignored without --enable-hierarchical-cache" in sim.log()


def test_prefetch_policy_decides_how_much_of_a_storage_hit_arrives(sim_factory, tmp_path):
    """0.5.23: wait_complete waits for all; timeout (the default) for at most 1 s + 0.25 s per
    1024 requested tokens; best_effort does not wait (nothing arrives on an idle server)."""
    store = tmp_path / "l3"
    slow = {"SGLANG_SIM_STORAGE_LOAD_RATE": "500"}  # 1,400 tokens take 2.8 modelled s
    ids = _ids(9, 1500)
    seen = {}
    for policy in ("wait_complete", "timeout", "best_effort"):
        sim = _start(sim_factory, store, slow,
                     extra_args=["--hicache-storage-prefetch-policy", policy])
        _gen(sim, ids)
        sim.request("POST", "/flush_cache")
        seen[policy] = _details(_gen(sim, ids))
        sim.stop()
    full = seen["wait_complete"]["storage"]
    assert full > 1300
    assert seen["timeout"]["storage"] == int((1 + 0.25 * full / 1024) * 500)
    assert seen["best_effort"] is None
