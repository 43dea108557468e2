# hicache-fleet: how many distinct prefixes of the probe's length the server's cache holds (issue 26).
# Plain functions, unit-tested in tests/probe; library/sglang_cache_probe.py runs them after its
# cold/warm rounds when capacity_max_prefixes is not 0.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ansible.module_utils.sglang_probe_client import (
    ProbeError,
    SGLangClient,
    flush_cache,
    generate_body,
    generate_ids,
)
from ansible.module_utils.sglang_probe_gate import required_cached_tokens, round_down_to_page

# capacity_max_prefixes: 0 = off, N > 0 = fill and re-read N prefixes, -1 or "auto" = the pool plan's
# prediction + 2 (capacity_auto_prefixes), so the fill goes past what the pools can hold.
CAPACITY_AUTO = -1
# The most prefixes one measurement fills (an explicit value above it is an error; auto is capped at it).
CAPACITY_MAX_PREFIXES = 1000
CAPACITY_AUTO_MARGIN = 2


def capacity_option(value: Any) -> int:
    """capacity_max_prefixes as an int (CAPACITY_AUTO for auto); ValueError with the sentence to show."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return CAPACITY_AUTO
    if value is None:
        return 0
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"capacity_max_prefixes must be a whole number or 'auto' (got {value!r}): 0 is off, "
                         "N fills and re-reads N prefixes, auto (or -1) takes the host pool's size.") from None
    if number < CAPACITY_AUTO:
        raise ValueError(f"capacity_max_prefixes must not be negative (got {number}); 0 is off, -1 or 'auto' "
                         "predicts it from the host pool, N > 0 fills N prefixes.")
    if number > CAPACITY_MAX_PREFIXES:
        raise ValueError(f"capacity_max_prefixes must be at most {CAPACITY_MAX_PREFIXES} (got {number}); "
                         "raise input_len instead, or use auto.")
    return number


def validate_capacity_params(p: dict) -> list[str]:
    errors = []
    try:
        capacity_option(p.get("capacity_max_prefixes"))
    except ValueError as exc:
        errors.append(str(exc))
    timeout = p.get("capacity_timeout_s")
    if timeout is not None and not timeout > 0:
        errors.append(f"capacity_timeout_s must be greater than 0 seconds (got {timeout:g}), e.g. 3600.")
    return errors


def prefix_tokens(input_len: int, page_size: int) -> int:
    """Tokens one prefix of input_len ids takes in a pool: whole pages only (SGLang caches page-aligned
    keys; with page size 1 that is the whole prompt, its last token included once the request is done)."""
    return max(round_down_to_page(input_len, page_size), 1)


def predicted_prefixes(host_tokens: int | None, device_tokens: int | None, input_len: int,
                       page_size: int = 1) -> int | None:
    """How many distinct prefixes of input_len tokens the cache holds, from the pools' sizes per rank.

    With write_through every computed page is backed up to the host at once, so the host pool holds
    the newest host_tokens and the device pool the newest device_tokens of the same prefixes: what
    can be read back is the larger of the two. None when neither pool is known."""
    pools = [t for t in (host_tokens, device_tokens) if isinstance(t, int) and not isinstance(t, bool) and t > 0]
    if not pools or input_len < 1:
        return None
    return max(pools) // prefix_tokens(input_len, page_size)


def capacity_auto_prefixes(host_tokens: int | None, device_tokens: int | None, input_len: int,
                           page_size: int = 1, cap: int = CAPACITY_MAX_PREFIXES) -> int | None:
    """The m to fill for capacity_max_prefixes auto: the prediction + 2 (one past the prediction and one
    for a partly kept oldest prefix, see measure_capacity), at most cap. None when no pool is known."""
    predicted = predicted_prefixes(host_tokens, device_tokens, input_len, page_size)
    if predicted is None:
        return None
    return min(predicted + CAPACITY_AUTO_MARGIN, cap)


def resolve_capacity_prefixes(p: dict, pools: dict | None, facts: dict) -> int:
    """m for this run (0 = off); auto from the pools the server reported (ProbeError if none is)."""
    option = capacity_option(p.get("capacity_max_prefixes"))
    if option != CAPACITY_AUTO:
        return option
    pools = pools or {}
    host = pools.get("host_tokens")
    m = capacity_auto_prefixes(host, facts.get("max_total_num_tokens"), p["input_len"], facts.get("page_size") or 1)
    if m is None or (facts.get("enable_hierarchical_cache") and host is None):
        raise ProbeError(
            "capacity_max_prefixes auto needs the host pool's size, which this server does not report "
            f"({pools.get('note') or 'no host pool figure'}): start it with --enable-metrics, or give "
            "capacity_max_prefixes a number."
        )
    return m


def capacity_ids(i: int, p: dict, vocab: int) -> list[int]:
    """Prefix i (from 1): input_len seeded random ids, distinct from the other prefixes, from the probe's
    prompt (seed, a repeated block) and from its fillers (seed:filler:j)."""
    return generate_ids(p["input_len"], vocab, f"{p['seed']}:capacity:{i}")


def capacity_plan_steps(p: dict) -> list[str]:
    try:
        m = capacity_option(p.get("capacity_max_prefixes"))
    except ValueError:
        return []
    if m == 0:
        return []
    count = "auto (the host pool's prefixes + 2)" if m == CAPACITY_AUTO else str(m)
    return [
        f"capacity: POST /flush_cache, then fill {count} distinct prefixes of {p['input_len']} random ids "
        "(seed:capacity:i) -> 1 token each",
        "capacity: re-read them newest first -> 1 token each, until the first that is not cached "
        f"(min_cached_fraction {p.get('min_cached_fraction')}); at most "
        f"{p.get('capacity_timeout_s') or 3600:g} s in all",
    ]


def _say(line: str) -> None:
    """The default on_line: say nothing."""


def measure_capacity(p: dict, client: SGLangClient, facts: dict, vocab: int, m: int,
                     on_line: Callable[[str], None] = _say,
                     clock: Callable[[], float] = time.monotonic) -> dict:
    """Fill m distinct prefixes after a flush, then re-read them newest first and count the cached ones
    before the first that is not: `held`.

    Why newest first. SGLang's radix cache evicts least recently used leaves, per tier: the device
    pool's LRU (HiRadixCache.evict, whose victims keep their host copy when backed up) and the host
    pool's (evict_host, which takes only nodes no longer on the device). After the fill the LRU order
    is P1 (oldest) ... Pm (newest) on both tiers. A re-read that hits touches its nodes and adds none
    to the host pool (its pages are there already; a host hit is loaded back to the device, and the
    device pages that make room were backed up by write_through when computed), so no host page is
    evicted and every prefix not yet read keeps its place. Reading Pm, Pm-1, ... therefore sees the
    pools exactly as the fill left them until the first miss, and that miss is the newest prefix that
    fell out. Read oldest first, the first read would be a miss whose recomputation evicts the next
    oldest: the count would be 0 or a fraction of the truth. Stopping at the first miss also means no
    recomputed prefix ever evicts one still to be read. (The simulator, sim/sglang_sim/cache.py,
    evicts the same way: LRU per tier, leaves first, hits touch only.) Other write policies: with
    write_back the device's evictions during the re-reads write to the host and may push out a
    prefix not yet read, so the count can come out low (on the simulator it came out as with
    write_through: 22 at --hicache-size 12, input_len 16000); with write_through_selective a page is
    backed up only once it has been hit, so prefixes used once stay in the device pool only and the
    count is the device's (10 there), which is what such a workload gets. The toolkit runs
    write_through.

    Off by one: the oldest prefix still held may have lost only its last pages (leaves go first);
    it counts as held when what is left still meets the probe's rule (min_cached_fraction of
    input_len), so held is the pool // prefix tokens or one more.

    Bounded by capacity_timeout_s over the whole measurement: when it runs out, the result says so
    (`stopped: timeout`) and held is None during the fill, a lower bound during the re-reads."""
    start = clock()
    deadline = start + float(p.get("capacity_timeout_s") or 3600.0)
    page = facts.get("page_size") or 1
    need = required_cached_tokens(p["min_cached_fraction"], p["input_len"], page)
    out: dict[str, Any] = {
        "prefix_len": p["input_len"], "requested": m, "required_cached_tokens": need, "filled": 0,
        "held": None, "bound_reached": False, "reads": [], "first_miss": None, "fill_max_cached": 0,
        "stopped": None, "elapsed_s": None,
    }

    def elapsed() -> float:
        return round(clock() - start, 3)

    def out_of_time(phase: str) -> bool:
        if clock() < deadline:
            return False
        out["stopped"] = "timeout"
        out["note"] = (f"stopped by capacity_timeout_s {p.get('capacity_timeout_s'):g} s during the {phase}"
                       + (": nothing was re-read, held unknown" if phase == "fill" else
                          f": at least {out['held']} held (a lower bound)"))
        on_line(f"capacity: {out['note']}")
        return True

    def send(i: int) -> dict:
        body = generate_body(capacity_ids(i, p, vocab), 1, p["temperature"])
        return client.stream_generate(body, input_len=p["input_len"])

    flush_cache(client, p["flush_timeout"])
    on_line(f"capacity: filling {m} prefixes of {p['input_len']} tokens")
    for i in range(1, m + 1):
        if out_of_time("fill"):
            out["elapsed_s"] = elapsed()
            return out
        run = send(i)
        out["filled"] = i
        out["fill_max_cached"] = max(out["fill_max_cached"], run["cached_tokens"])
        spent = clock() - start
        # what is left: the rest of the fill, and re-reads that cost at most a fill each (a hit less)
        left = min(spent / i * (m - i + m), max(deadline - clock(), 0.0))
        on_line(f"capacity: fill {i}/{m} ({run['ttft_s']:.3g} s; {spent:.0f} s spent, at most about "
                f"{left:.0f} s left)")
    if out["fill_max_cached"] >= need:
        raise ProbeError(f"a capacity prefix came back cached while filling ({out['fill_max_cached']} tokens): "
                         "the prefixes are not distinct (vocab_size too small?); the count would be wrong.")
    out["held"] = 0
    for i in range(m, 0, -1):
        if out_of_time("re-reads"):
            out["elapsed_s"] = elapsed()
            return out
        run = send(i)
        cached = run["cached_tokens"] >= need
        out["reads"].append({"prefix": i, "cached": run["cached_tokens"], "device": run["device_cached_tokens"],
                             "host": run["host_cached_tokens"], "ttft_s": round(run["ttft_s"], 6)})
        on_line(f"capacity: re-read {m - i + 1}/{m} P{i}: cached {run['cached_tokens']} (device "
                f"{run['device_cached_tokens']}, host {run['host_cached_tokens']}), {run['ttft_s']:.3g} s")
        if not cached:
            out["first_miss"] = i
            break
        out["held"] += 1
    out["bound_reached"] = out["first_miss"] is None
    out["elapsed_s"] = elapsed()
    on_line(capacity_line(out))
    return out


def capacity_line(capacity: dict | None) -> str | None:
    """The measurement in one line, e.g. `capacity: 22 prefixes of 16000 tokens held (P2 of 24 was the
    newest to fall out)`; `≥ N` when the bound or the time ran out first."""
    if not isinstance(capacity, dict):
        return None
    length = capacity.get("prefix_len")
    if capacity.get("held") is None:
        return f"capacity: not measured ({capacity.get('note') or 'stopped'})"
    held = capacity["held"]
    if capacity.get("stopped"):
        return f"capacity: ≥ {held} prefixes of {length} tokens held ({capacity.get('note')})"
    if capacity.get("bound_reached"):
        return (f"capacity: ≥ {held} prefixes of {length} tokens held (all {capacity.get('filled')} filled came "
                "back: raise capacity_max_prefixes for the limit)")
    return (f"capacity: {held} prefixes of {length} tokens held (P{capacity.get('first_miss')} of "
            f"{capacity.get('filled')} was the newest to fall out)")
