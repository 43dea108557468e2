"""Unit tests of the simulator's pieces: pool sizing, argv parsing, tokenizer, prefix cache."""

from __future__ import annotations

import pytest
from sglang_sim.args import UsageError, parse_argv
from sglang_sim.cache import PrefixCache
from sglang_sim.engine import modelled_wait
from sglang_sim.model import read_model, size_pools
from sglang_sim.settings import SettingsError, load_settings
from sglang_sim.tokenizer import (
    IdsFormatError,
    OutOfVocabError,
    canonical,
    canonical_to_ids,
    first_out_of_vocab,
    ids_segment_to_canonical,
    tokenize,
)

SEED_BASE = ["--tp-size", "2", "--mem-fraction-static", "0.80", "--context-length", "196608"]
SEED_HICACHE = ["--enable-hierarchical-cache", "--hicache-size", "12", "--hicache-ratio", "2.0",
                "--hicache-io-backend", "kernel", "--hicache-host-memory-mode", "cache",
                "--hicache-write-policy", "write_through"]


def _sizes(model_dir, extra, env=None):
    args = parse_argv(["--model-path", str(model_dir), *SEED_BASE, *extra])
    return size_pools(read_model(str(model_dir)), args.values, load_settings(env or {}))


def test_seed_capacities_are_the_calibration_targets(model_dir):
    off = _sizes(model_dir, [])
    on = _sizes(model_dir, SEED_HICACHE)
    assert off.kv_bytes_per_token == 16 * 2 * 2 * 256 * 2  # 16 full-attn layers, 2 KV heads/rank
    assert off.device_tokens == 233_207
    assert on.device_tokens == 159_692
    assert round(1 - on.device_tokens / off.device_tokens, 3) == 0.315
    # --hicache-size is GB (1e9 bytes) per rank, plus SGLang's one padding page.
    assert on.host_tokens == 12 * 10**9 // 32_768 + 1
    assert off.host_tokens == 0


def test_host_pool_from_ratio_and_page_alignment(model_dir):
    sizes = _sizes(model_dir, ["--enable-hierarchical-cache", "--hicache-ratio", "1.5",
                               "--page-size", "64"])
    assert sizes.device_tokens % 64 == 0
    assert sizes.host_tokens == (int(sizes.device_tokens * 1.5) // 64 + 1) * 64


def test_device_tokens_env_and_gpu_size_change_capacity(model_dir):
    assert _sizes(model_dir, [], {"SGLANG_SIM_DEVICE_TOKENS": "5000"}).device_tokens == 5000
    small = _sizes(model_dir, [], {"SGLANG_SIM_GPU_MEM_GB": "20,20"}).device_tokens
    assert 0 < small < 233_207


def test_seed_section6_command_parses_and_reports_ignored_flags(model_dir):
    argv = ["--model-path", str(model_dir), "--served-model-name", "m", "--host", "127.0.0.1",
            "--port", "30004", *SEED_BASE, "--quantization", "gptq", "--dtype", "bfloat16",
            "--mamba-ssm-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
            "--attention-backend", "triton", "--max-running-requests", "3",
            "--max-mamba-cache-size", "20", "--chunked-prefill-size", "2048",
            "--enable-mixed-chunk", "--cuda-graph-bs-decode", "1", "2", "4",
            "--triton-attention-num-kv-splits", "16", "--reasoning-parser", "qwen3",
            "--tool-call-parser", "qwen3_coder", "--enable-cache-report", *SEED_HICACHE,
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
            "--speculative-draft-model-quantization", "compressed-tensors",
            "--speculative-num-draft-tokens", "8", "--speculative-draft-window-size", "2048",
            "--stream-interval", "1"]
    args = parse_argv(argv)
    assert args.values["hicache_size"] == 12
    assert args.values["cuda_graph_bs_decode"] == [1, 2, 4]
    assert args.values["enable_mixed_chunk"] is True
    assert args.unknown_flags == []
    assert "--speculative-algorithm" in args.ignored_flags
    assert "--hicache-size" not in args.ignored_flags
    assert len(args.ignored_flags) == len(set(args.ignored_flags))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--hicache-size", "0.5"], "argument --hicache-size: invalid int value: '0.5'"),
        (["--hicache-write-policy", "foo"], "invalid choice: 'foo'"),
        (["--hicache-host-memory-mode", "disk"], "invalid choice: 'disk'"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
        (["--cuda-graph-bs", "1"], "ambiguous option: --cuda-graph-bs"),
        (["--page-size", "0"], "--page-size"),
        (["--enable-cache-report=yes"], "ignored explicit argument"),
        (["stray"], "unrecognized arguments: stray"),
    ],
)
def test_invalid_values_are_usage_errors(model_dir, extra, message):
    with pytest.raises(UsageError) as err:
        parse_argv(["--model-path", str(model_dir), *extra])
    assert message in str(err.value)


def test_unknown_flags_are_accepted_with_their_values(model_dir):
    args = parse_argv(["--model-path", str(model_dir), "--some-plugin-flag", "a", "b",
                       "--tp-size", "2"])
    assert args.unknown_flags == ["--some-plugin-flag"]
    assert args.values["tp_size"] == 2


def test_settings_reject_unknown_fault():
    with pytest.raises(SettingsError, match="unknown fault"):
        load_settings({"SGLANG_SIM_FAULT": "explode"})


def test_tokenizer_is_deterministic_and_dense():
    text = "The quick brown fox jumps over the lazy dog. " * 10
    ids = tokenize(text, 248_320)
    assert list(ids) == list(tokenize(text, 248_320))
    assert len(ids) == (len(text.encode()) + 3) // 4
    assert all(0 <= i < 248_320 for i in ids)
    assert list(tokenize("abcd", 1 << 40)) == [int.from_bytes(b"abcd", "little")]


def _ids(start: int, n: int) -> bytes:
    return canonical(range(start, start + n))


def test_canonical_ids_from_json_text_match_canonical_from_ints():
    ids = [0, 7, 248_319, 12, 5]
    assert canonical(ids) == b"0,7,248319,12,5,"
    assert ids_segment_to_canonical(b" 0, 7,248319 ,\n12,5") == canonical(ids)
    assert canonical_to_ids(canonical(ids)) == ids
    for bad in (b"1,,2", b"1,-2", b"1.5", b"01,2", b"1,2,", b"true"):
        with pytest.raises(IdsFormatError):
            ids_segment_to_canonical(bad)


def test_first_out_of_vocab_finds_the_first_id_at_or_above_vocab_size():
    vocab = 248_320
    assert first_out_of_vocab(canonical([0, 5, 248_319, 99_999]), vocab) is None
    assert first_out_of_vocab(canonical([0, 248_320, 7]), vocab) == 248_320  # same width, greater
    assert first_out_of_vocab(canonical([3, 999_999, 1_000_000, 248_321]), vocab) == 999_999
    assert first_out_of_vocab(canonical([1, 12_345_678]), vocab) == 12_345_678  # more digits
    assert first_out_of_vocab(canonical([31_999, 9]), 32_000) is None
    assert first_out_of_vocab(canonical([99_999]), 100_000) is None  # all-nines bound
    assert first_out_of_vocab(canonical([100_000]), 100_000) == 100_000
    assert first_out_of_vocab(b"", vocab) is None


def test_negative_ids_are_out_of_vocabulary_not_malformed():
    with pytest.raises(OutOfVocabError) as err:
        ids_segment_to_canonical(b"4, -12 ,7")
    assert err.value.token_id == -12
    with pytest.raises(OutOfVocabError):
        canonical([4, -1])
    for malformed in (b"-0", b"1.5,-2", b"--3"):
        with pytest.raises(IdsFormatError) as err:
            ids_segment_to_canonical(malformed)
        assert not isinstance(err.value, OutOfVocabError)


def test_modelled_wait_subtracts_the_time_spent_before_modelling():
    # 192 modelled seconds at time scale 0.01 = 1.92 s of wall time; 0.3 s already went on
    # reading and parsing the body, so only 1.62 s are left to sleep.
    assert modelled_wait(192.0, 0.01, 0.3) == pytest.approx(1.62)
    assert modelled_wait(192.0, 0.01, 0.0) == pytest.approx(1.92)
    # Never below 0: a warm hit modelled shorter than the parse is answered at once.
    assert modelled_wait(0.001, 0.01, 0.3) == 0.0
    assert modelled_wait(2.65, 0.0, 0.3) == 0.0
    # A clock that steps back counts as no time spent.
    assert modelled_wait(1.0, 1.0, -0.5) == pytest.approx(1.0)


def test_cache_device_hit_then_host_hit_after_eviction():
    cache = PrefixCache(device_capacity=1000, host_capacity=3000, page_size=1, block_tokens=64)
    a, b = _ids(0, 800), _ids(10_000, 800)
    assert cache.match(a).cached_tokens == 0
    cache.insert(a)
    hit = cache.match(a)
    assert (hit.device_tokens, hit.host_tokens) == (799, 0)  # the last token is always computed
    cache.insert(b)  # pushes a out of the device pool; write_through kept a host copy
    hit = cache.match(a)
    assert hit.device_tokens < 799
    assert hit.cached_tokens == 799
    assert hit.host_tokens > 0
    cache.insert(a, hit.path)  # loaded back to the device
    assert cache.match(a).device_tokens == 799
    assert cache.device_used <= 1000
    assert cache.host_used <= 3000


def test_cache_without_host_tier_forgets_evicted_pages():
    cache = PrefixCache(device_capacity=1000, host_capacity=0, page_size=1, block_tokens=64,
                        use_host=False)
    a, b = _ids(0, 800), _ids(10_000, 800)
    cache.insert(a)
    cache.insert(b)
    hit = cache.match(a)
    assert hit.host_tokens == 0
    assert hit.cached_tokens < 799


def test_cache_write_back_copies_on_eviction_only():
    cache = PrefixCache(device_capacity=1000, host_capacity=3000, page_size=1, block_tokens=64,
                        write_policy="write_back")
    a, b = _ids(0, 800), _ids(10_000, 800)
    cache.insert(a)
    assert cache.host_used == 0
    cache.insert(b)
    assert cache.host_used > 0
    assert cache.match(a).cached_tokens == 799


def test_cache_partial_block_match_is_token_exact():
    cache = PrefixCache(device_capacity=10_000, host_capacity=0, page_size=1, block_tokens=64,
                        use_host=False)
    cache.insert(_ids(0, 1000))
    other = list(range(1000))
    other[700] = 999_999
    assert cache.match(canonical(other)).cached_tokens == 700


def test_cache_page_size_rounds_hits_down_to_pages():
    cache = PrefixCache(device_capacity=10_000, host_capacity=0, page_size=16, block_tokens=64,
                        use_host=False)
    cache.insert(_ids(0, 1000))
    other = list(range(1000))
    other[700] = 999_999
    assert cache.match(canonical(other)).cached_tokens == 688
    assert cache.match(_ids(0, 1000)).cached_tokens == 992


def test_cache_flush_clears_both_tiers():
    cache = PrefixCache(device_capacity=1000, host_capacity=3000, page_size=1, block_tokens=64)
    cache.insert(_ids(0, 800))
    cache.insert(_ids(10_000, 800))
    assert cache.host_used > 0
    cache.flush()
    assert (cache.device_used, cache.host_used) == (0, 0)
    assert cache.match(_ids(0, 800)).cached_tokens == 0


def test_host_pool_lru_evicts_its_oldest():
    cache = PrefixCache(device_capacity=1000, host_capacity=1700, page_size=1, block_tokens=64)
    for start in (0, 10_000, 20_000):
        cache.insert(_ids(start, 800))
    assert cache.host_used <= 1700
    assert cache.match(_ids(0, 800)).cached_tokens < 799  # oldest gone from both tiers
    assert cache.match(_ids(20_000, 800)).cached_tokens == 799


def test_wheel_builds_offline_with_the_in_tree_backend(tmp_path):
    import importlib.util
    import zipfile
    from pathlib import Path

    backend_path = Path(__file__).resolve().parents[2] / "sim" / "_build" / "sim_build_backend.py"
    spec = importlib.util.spec_from_file_location("sim_build_backend", backend_path)
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    assert backend.get_requires_for_build_wheel() == []
    name = backend.build_wheel(str(tmp_path))
    assert name == "sglang_sim-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as wheel:
        names = set(wheel.namelist())
        assert {"sglang_sim/launch_server.py", "sglang_sim/data/server_args.json",
                "sglang_sim-0.1.0.dist-info/RECORD"} <= names
        entry_points = wheel.read("sglang_sim-0.1.0.dist-info/entry_points.txt").decode()
        assert "sglang_sim.launch_server:main" in entry_points


# ---------------------------------------------------------------- output.py
def test_tail_ids_is_the_last_ids_wherever_the_window_cuts():
    import random

    from sglang_sim.output import REPEAT_WINDOW, tail_ids

    rng = random.Random(5)
    for n in (1, 2, REPEAT_WINDOW - 1, REPEAT_WINDOW, REPEAT_WINDOW + 1, 40_000):
        ids = [rng.randrange(248_320) for _ in range(n)]
        assert tail_ids(canonical(ids)) == ids[-REPEAT_WINDOW:], n
    # ids padded so the byte window starts exactly after a comma (no partial id to drop)
    wide = [10 ** 19 + i for i in range(REPEAT_WINDOW + 3)]
    assert tail_ids(canonical(wide)) == wide[-REPEAT_WINDOW:]


def test_repeated_block_finds_the_shortest_block_up_to_half_the_window():
    import random

    from sglang_sim.output import REPEAT_WINDOW, Output, repeated_block, tail_ids

    rng = random.Random(6)
    noise = [rng.randrange(248_320) for _ in range(50_000)]
    assert repeated_block(tail_ids(canonical(noise))) is None
    assert repeated_block([1, 2, 3, 3]) == [3]
    big = [rng.randrange(248_320) for _ in range(REPEAT_WINDOW // 2)]
    assert repeated_block(tail_ids(canonical(noise + big * 2))) == big
    too_big = [*big, 7]
    assert repeated_block(tail_ids(canonical(noise + too_big * 2))) is None
    # ids stay inside a small vocabulary, greedy output is reproducible
    out = Output(canonical(noise), 1000)
    ids = [out.token(i)[0] for i in range(50)]
    assert all(0 <= t < 1000 for t in ids)
    assert ids == [Output(canonical(noise), 1000).token(i)[0] for i in range(50)]


# The seed profile's launch (roles/sglang_service/defaults/main.yml seed-validated): the hybrid's Mamba pool.
SEED_MAMBA_ARGS = ["--max-running-requests", "3", "--max-mamba-cache-size", "20", "--mamba-ssm-dtype", "bfloat16",
                   "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
                   "--speculative-num-draft-tokens", "8"]


@pytest.mark.parametrize(("size_gb", "expected"), [("8", 174_728), ("12", 262_091)])
def test_hybrid_host_pool_is_split_with_the_mamba_pool_as_the_plan_expects(model_dir, size_gb, expected):
    """Two implementations of SGLang 0.5.23's _split_hicache_size (hybrid_pool_assembler.py): the
    simulator's and module_utils/sglang_pool_plan.py's, for the demo (8 GB) and the seed (12 GB)."""
    from plugins import load

    plan = load("module_utils/sglang_pool_plan.py", "sglang_pool_plan_sim_check")
    hicache = [a if a != "12" else size_gb for a in SEED_HICACHE]
    sizes = _sizes(model_dir, [*SEED_MAMBA_ARGS, *hicache])
    assert sizes.device_tokens == 159_692  # the calibration holds
    assert sizes.host_tokens == expected
    args = parse_argv(["--model-path", str(model_dir), *SEED_BASE, *SEED_MAMBA_ARGS, *hicache]).values
    model = read_model(str(model_dir))
    mamba = plan.mamba_device_bytes(model.config, args, sizes.device_tokens)
    low, high, _ = plan.expected_host_range(model.config, 2, sizes.device_tokens, 1, int(size_gb), 2.0,
                                            mamba_device_bytes=mamba[:2])
    assert low == high == sizes.host_tokens
    # pool_mismatch halves it (before the padding page): the plan's figure no longer matches.
    bad = size_pools(model, args, load_settings({"SGLANG_SIM_FAULT": "pool_mismatch"}))
    assert bad.host_tokens == (expected - 1) // 2 + 1
    assert plan.compare("host", bad.host_tokens, low, high, plan.POOL_TOLERANCE, "x")
    # Without --max-mamba-cache-size (auto-sized Mamba pool) all GB stay with the KV pool, as before.
    auto = [a for a in SEED_MAMBA_ARGS if a not in ("--max-mamba-cache-size", "20")]
    assert _sizes(model_dir, [*auto, *hicache]).host_tokens == int(int(size_gb) * 10**9 // 32_768) + 1


@pytest.mark.parametrize(("raw", "expected"), [
    ("200G", 200 * 10**9), ("1Gi", 2**30), ("25.6k", 25_600), ("1048576", 1_048_576),
    ("0", 0), ("", 0), (None, 0), ("1.5Gi", 0), ("lots", 0), ("1g", 0),
])
def test_file_backend_sizes_parse_as_human_readable_int(raw, expected):
    from sglang_sim.storage import parse_size

    assert parse_size(raw) == expected


@pytest.mark.parametrize(("raw", "expected"), [("0.5", 0.5), ("1", 1.0), ("0", 0.9),
                                               ("1.5", 0.9), ("x", 0.9)])
def test_file_backend_eviction_ratio_falls_back_to_0_9(tmp_path, raw, expected):
    from sglang_sim.storage import FileStorage

    st = FileStorage(file_path=str(tmp_path / "d"), model_path="/m", tp_size=1, page_size=1,
                     bytes_per_token=8, extra={},
                     env={"SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO": raw,
                          "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1k"},
                     log=lambda *a: None)
    assert st.eviction_ratio == expected
    assert st.max_size_bytes == 1000


def test_l3_backup_runs_off_the_request_path(tmp_path):
    """A request does not wait for its pages to reach the disk (0.5.23 backs up in a thread):
    insert returns while the storage writer is still blocked; the pages land afterwards."""
    import threading

    from sglang_sim.storage import FileStorage

    st = FileStorage(file_path=str(tmp_path / "d"), model_path="/m", tp_size=1, page_size=1,
                     bytes_per_token=8, extra={}, env={}, log=lambda *a: None)
    gate = threading.Event()
    real_set = st.set

    def slow_set(*args):
        assert gate.wait(10)
        return real_set(*args)

    st.set = slow_set
    cache = PrefixCache(device_capacity=10_000, host_capacity=10_000, page_size=1,
                        block_tokens=4, storage=st)
    data = canonical(list(range(1000, 1040)))
    done = threading.Event()
    worker = threading.Thread(target=lambda: (cache.insert(data), done.set()), daemon=True)
    worker.start()
    assert done.wait(5), "insert waited for the L3 write"
    assert st.pending
    assert not [f for f in (tmp_path / "d").iterdir() if f.suffix == ".bin"]
    gate.set()
    for _ in range(500):
        if not st.pending:
            break
        threading.Event().wait(0.01)
    assert not st.pending
    assert len([f for f in (tmp_path / "d").iterdir() if f.suffix == ".bin"]) >= 5


def test_l3_min_free_space_refuses_a_write_that_would_undercut_it(tmp_path):
    from sglang_sim.storage import FileStorage

    logs = []
    st = FileStorage(file_path=str(tmp_path / "d"), model_path="/m", tp_size=2, page_size=1,
                     bytes_per_token=8, extra={},
                     env={"SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE": "1000Ti"},
                     log=lambda msg, *a: logs.append(msg))
    assert st.min_free_bytes == 1000 * 2**40
    assert st.set("ab" * 32, b"1,2,3,", 3) is False
    assert list((tmp_path / "d").iterdir()) == []
    assert any("would fall below min_free" in m and "SIMULATOR" in m for m in logs)
    roomy = FileStorage(file_path=str(tmp_path / "e"), model_path="/m", tp_size=2, page_size=1,
                        bytes_per_token=8, extra={"min_free_space": "1k"}, env={},
                        log=lambda *a: None)
    assert roomy.set("ab" * 32, b"1,2,3,", 3) is True
    assert sorted(f.name for f in (tmp_path / "e").iterdir()) == [
        "ab" * 32 + "_-m_0_2.bin", "ab" * 32 + "_-m_1_2.bin"]
    assert (tmp_path / "e" / ("ab" * 32 + "_-m_0_2.bin")).stat().st_size == 24
