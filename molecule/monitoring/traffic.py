#!/usr/bin/env python3
"""Traffic that repeats long shared prefixes, sent to each SGLang (simulator) instance, while
Prometheus's alerts are watched (molecule/monitoring's side effect and verify).

Every request is one shared "system prompt" (always on the GPU: device-tier hits) followed by one
of --docs long documents, cycled, whose total exceeds the GPU pool: on a healthy HiCache host each
document comes back from the host tier, on a host whose host tier is silently off it is recomputed.

    traffic.py --target URL [--target URL ...] [--router URL] --prometheus URL --expect-firing INSTANCE
               [--timeout S] [--out FILE]
    traffic.py --router-only --router URL --until-file PATH [--concurrency N] [--timeout S] [--out FILE]

Runs until the alert HiCacheHostTierStopped fires for every --expect-firing instance (host:port)
or --timeout seconds passed; bounded either way. Prints and writes a JSON summary: per alert state
seen, per instance; the cached tokens per tier each target reported; requests sent.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request

ALERT = "HiCacheHostTierStopped"


def post(url: str, body: dict, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def get(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def router_traffic(args) -> None:
    """--router-only: traffic through the router alone, as users send it (the bake's live traffic:
    molecule/monitoring/side_effect.yml). Every other request repeats one of --docs documents
    after the shared system prompt (served from cache), the others are fresh documents (random
    token ids: a cold prefill), from --concurrency clients, until --until-file exists or --timeout.
    A host out of the router's rotation (restarting, probed) gets none of it."""
    import random
    import threading

    system = list(range(1, args.system_tokens + 1))
    docs = [list(range(10_000 + d * 20_000, 10_000 + d * 20_000 + args.doc_tokens)) for d in range(args.docs)]
    counts = {"requests": 0, "errors": 0}
    lock = threading.Lock()
    start = time.monotonic()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        n = 0
        while time.monotonic() - start < args.timeout and not os.path.exists(args.until_file):
            doc = docs[(n // 2) % len(docs)] if n % 2 == 0 else [rng.randint(300, 200_000)
                                                                 for _ in range(args.doc_tokens)]
            n += 1
            try:
                post(f"{args.router}/generate", {"input_ids": system + doc, "sampling_params": {"max_new_tokens": 1}})
                key = "requests"
            except OSError:
                key = "errors"
                time.sleep(0.5)
            with lock:
                counts[key] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = {"seconds": round(time.monotonic() - start, 1), **counts}
    print(json.dumps(summary, sort_keys=True))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--router-only", action="store_true")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--until-file", default="")
    ap.add_argument("--router", default="")
    ap.add_argument("--prometheus", default="")
    ap.add_argument("--expect-firing", action="append", default=[])
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--doc-tokens", type=int, default=6000)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.router_only:
        if not args.router or not args.until_file:
            ap.error("--router-only needs --router and --until-file")
        router_traffic(args)
        return
    if not args.target or not args.prometheus:
        ap.error("--target and --prometheus are required (or --router-only)")

    system = list(range(1, args.system_tokens + 1))
    docs = [list(range(10_000 + d * 20_000, 10_000 + d * 20_000 + args.doc_tokens)) for d in range(args.docs)]
    cached = {t: {"device": 0, "host": 0} for t in args.target}
    states: dict[str, set[str]] = {}
    sent = errors = routed = 0
    start = time.monotonic()
    last_poll = 0.0
    n = 0
    while time.monotonic() - start < args.timeout:
        doc = docs[n % len(docs)]
        n += 1
        for target in args.target:
            try:
                meta = post(f"{target}/generate", {"input_ids": system + doc,
                                                   "sampling_params": {"max_new_tokens": 1}})["meta_info"]
                sent += 1
                for tier, value in (meta.get("cached_tokens_details") or {}).items():
                    cached[target][tier] = cached[target].get(tier, 0) + int(value)
            except OSError:
                errors += 1
        if args.router and n % 8 == 0:  # some traffic through the router as well
            try:
                post(f"{args.router}/generate", {"input_ids": system + doc, "sampling_params": {"max_new_tokens": 1}})
                routed += 1
            except OSError:
                errors += 1
        if time.monotonic() - last_poll >= 5:
            last_poll = time.monotonic()
            try:
                alerts = get(f"{args.prometheus}/api/v1/alerts")["data"]["alerts"]
            except OSError:
                alerts = []
            for alert in alerts:
                if alert["labels"].get("alertname") == ALERT:
                    states.setdefault(alert["labels"].get("instance", "?"), set()).add(alert["state"])
            if args.expect_firing and all("firing" in states.get(i, ()) for i in args.expect_firing):
                break
        time.sleep(0.05)
    summary = {
        "seconds": round(time.monotonic() - start, 1), "requests": sent, "routed": routed, "errors": errors,
        "alert": ALERT, "states": {k: sorted(v) for k, v in states.items()}, "cached_tokens": cached,
    }
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
