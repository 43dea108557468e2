#!/usr/bin/env python3
"""Traffic with repeated long prefixes, sent by SGLang's own benchmark client, bounded in count and time.

    scripts/traffic.py --python VENV/bin/python --target http://127.0.0.1:30004 [--target URL ...]
        [--groups 2 --prompts-per-group 8 --prefix-len 4096 --question-len 128 --output-len 16]
        [--request-rate 4 --max-concurrency 4 --timeout 120] [--output summary.json] [--fleet]

For each target (a router URL, or one SGLang server's URL), one after the other, it runs
`sglang.benchmark.serving` (what `python -m sglang.bench_serving` runs) of the SGLang installed in
`--python`'s venv, with its `generated-shared-prefix` dataset: `--groups` long shared system prompts
of `--prefix-len` tokens, each followed by `--prompts-per-group` different questions of
`--question-len` tokens, so every prefix is read `--prompts-per-group` times (plus bench_serving's
one warm-up request). The prompts go as token ids (`--tokenize-prompt`), so the server sees exactly
these lengths whatever its tokenizer.

Bounds: at most 10,000 prompts per target; `--timeout` seconds for the whole run, after which the
child is stopped by its PID (SIGTERM, SIGKILL 5 s later) and the summary says `timed_out`. A target
outside 127.0.0.0/8 (or ::1) is refused before anything is sent, unless `--fleet` says it is a real
fleet an operator means to load.

Output: a JSON summary on stdout (and in `--output`): per target the requests sent, completed and
failed, TTFT p50/p95 and the cached tokens per tier, read from bench_serving's own output file
(`--output-file`, kept in the work directory), and the prefix/question sizes.

The client venv needs sglang 0.5.23 plus `transformers` (and `tokenizers`): bench_serving imports
them. Two imports of its module tree are replaced when they cannot be imported, and the summary
lists them under `stand_ins`: `sglang.srt.disaggregation.utils` (bench_serving reads one constant
from it, for PD-disaggregation runs; the module's import chain needs torchvision, which the CPU
test venv cannot have) by a module holding that constant as read from the installed file, and
`datasets` (imported only by the mmmu dataset) by a module that raises when used. Everything else
is SGLang's code. Without `--tokenizer`, a word-level tokenizer of 32,000 made-up tokens is
written to the work directory (ids only matter: the prompts go as ids); against a real server,
give the served model's tokenizer directory.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

MAX_PROMPTS = 10_000
MAX_TIMEOUT_S = 3_600
STOP_GRACE_S = 5.0
DEFAULT_VOCAB = 32_000
STAND_INS_ENV = "HICACHE_TRAFFIC_STAND_INS"
_DISAGG = "sglang.srt.disaggregation.utils"


# --- the target check -------------------------------------------------------------------------


def _loopback(host: str) -> bool:
    """True when every address `host` names is in 127.0.0.0/8 or is ::1."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_target(url: str, fleet: bool) -> str:
    """The URL without a trailing slash, or ValueError saying why it is refused."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise ValueError(f"{url!r}: no credentials in the URL (use --api-key-env)")
    if not fleet and not _loopback(parts.hostname):
        raise ValueError(
            f"{url!r}: {parts.hostname} is not a loopback address (127.0.0.0/8, ::1); test traffic goes "
            "only there. To load a real fleet on purpose, pass --fleet."
        )
    return url.rstrip("/")


# --- the tokenizer ----------------------------------------------------------------------------


def write_tokenizer(directory: Path, vocab_size: int = DEFAULT_VOCAB) -> Path:
    """A real Hugging Face `tokenizers` file (WordLevel, whitespace split) of made-up tokens.

    bench_serving draws the prompts' token ids from the tokenizer's vocabulary (ids 0 to
    vocab_size - 1) and, with --tokenize-prompt, sends them as ids; it also counts the generated
    text's tokens with it (unknown words count one each).
    """
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0}
    vocab.update({f"t{i}": i for i in range(1, vocab_size)})
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "model_max_length": 1_000_000,
        "clean_up_tokenization_spaces": False,
    }))
    (directory / "README.md").write_text(
        "Written by hicache-fleet scripts/traffic.py: a word-level tokenizer of made-up tokens for test\n"
        "traffic; it belongs to no model.\n")
    return directory


# --- the child: SGLang's benchmark client ------------------------------------------------------


def _constant_from_source(path: Path, name: str) -> Any:
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} not assigned in {path}")


def bench_client(argv: list[str]) -> None:
    """Run sglang.benchmark.serving's CLI with argv, in this (the client venv's) interpreter."""
    import importlib
    import importlib.util
    import types

    stand_ins: list[dict[str, str]] = []
    try:
        importlib.import_module(_DISAGG)
    except ImportError as err:
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.origin is None:
            raise SystemExit(f"traffic: no sglang in {sys.executable}") from err
        source = Path(spec.origin).parent / "srt" / "disaggregation" / "utils.py"
        module = types.ModuleType(_DISAGG)
        module.FAKE_BOOTSTRAP_HOST = _constant_from_source(source, "FAKE_BOOTSTRAP_HOST")
        sys.modules[_DISAGG] = module
        stand_ins.append({"module": _DISAGG, "why": f"{type(err).__name__}: {err}",
                          "holds": f"FAKE_BOOTSTRAP_HOST = {module.FAKE_BOOTSTRAP_HOST!r} (read from {source})"})
    if importlib.util.find_spec("datasets") is None:
        module = types.ModuleType("datasets")

        def load_dataset(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("traffic: `datasets` is not installed in this venv (only the mmmu dataset needs it)")

        module.load_dataset = load_dataset
        sys.modules["datasets"] = module
        stand_ins.append({"module": "datasets", "why": "not installed",
                          "holds": "load_dataset, which raises (imported by bench_serving's mmmu dataset only)"})
    for item in stand_ins:
        print(f"[traffic] stand-in for {item['module']}: {item['why']}", file=sys.stderr, flush=True)
    if os.environ.get(STAND_INS_ENV):
        Path(os.environ[STAND_INS_ENV]).write_text(json.dumps(stand_ins))
    serving = importlib.import_module("sglang.benchmark.serving")
    sys.argv = ["sglang.benchmark.serving", *argv]
    serving.cli_main()


# --- the parent --------------------------------------------------------------------------------


def bench_argv(args: argparse.Namespace, url: str, tokenizer: Path, output_file: Path) -> list[str]:
    return [
        "--backend", "sglang",
        "--base-url", url,
        "--dataset-name", "generated-shared-prefix",
        "--gsp-num-groups", str(args.groups),
        "--gsp-prompts-per-group", str(args.prompts_per_group),
        "--gsp-system-prompt-len", str(args.prefix_len),
        "--gsp-question-len", str(args.question_len),
        "--gsp-output-len", str(args.output_len),
        "--num-prompts", str(args.groups * args.prompts_per_group),
        "--request-rate", str(args.request_rate),
        "--max-concurrency", str(args.max_concurrency),
        "--warmup-requests", str(args.warmup_requests),
        "--ready-check-timeout-sec", str(max(1, min(60, int(args.timeout)))),
        "--seed", str(args.seed),
        "--tokenizer", str(tokenizer),
        "--tokenize-prompt",
        "--cache-report",
        "--output-file", str(output_file),
        "--output-details",
        "--disable-tqdm",
    ]


def stop_child(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group (its own session: its PGID is its PID), SIGKILL later."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize_output(path: Path, sent: int) -> dict[str, Any]:
    """The figures of bench_serving's own output file (its last JSON line)."""
    if not path.is_file() or not path.read_text().strip():
        return {"completed": 0, "failed": sent, "result_file": None}
    result = json.loads(path.read_text().strip().splitlines()[-1])
    completed = int(result.get("completed", 0))
    errors = [e for e in result.get("errors", []) if e]
    cache = result.get("cache_report") or {}
    ttfts_ms = [t * 1000 for t, e in zip(result.get("ttfts", []), result.get("errors", []), strict=False) if not e]
    return {
        "completed": completed,
        "failed": sent - completed,
        "errors": sorted(set(errors))[:5],
        "ttft_ms": {"p50": result.get("median_ttft_ms"), "p95": result.get("p95_ttft_ms"),
                    "p95_recomputed": _percentile(ttfts_ms, 0.95)},
        "duration_s": result.get("duration"),
        "request_throughput": result.get("request_throughput"),
        "total_input_tokens": result.get("total_input_tokens"),
        "cached_tokens": {"total": cache.get("total_cached_tokens"), "device": cache.get("device_cached_tokens"),
                          "host": cache.get("host_cached_tokens"), "storage": cache.get("storage_cached_tokens"),
                          "hit_rate_pct": cache.get("cache_hit_rate_pct")},
        "result_file": str(path),
    }


def run_target(args: argparse.Namespace, url: str, tokenizer: Path, workdir: Path, deadline: float,
               index: int) -> dict[str, Any]:
    sent = args.groups * args.prompts_per_group
    output_file = workdir / f"bench-{index}.jsonl"
    stand_ins_file = workdir / f"stand-ins-{index}.json"
    log_file = workdir / f"bench-{index}.log"
    for stale in (output_file, stand_ins_file):  # bench_serving appends; a re-used work dir starts clean
        stale.unlink(missing_ok=True)
    env = dict(os.environ)
    # bench_serving caches generated prompts under ~/.cache/sglang: keep them in the work directory.
    # Nothing comes from a hub: the tokenizer is a local directory.
    env.update({"HOME": str(workdir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_HOME": str(workdir / "hf"), STAND_INS_ENV: str(stand_ins_file),
                "PYTHONUNBUFFERED": "1"})
    env.pop("OPENAI_API_KEY", None)
    env.pop("API_KEY", None)
    if args.api_key_env:
        # bench_serving sends OPENAI_API_KEY as `Authorization: Bearer <key>` (SGLang's --api-key).
        env["OPENAI_API_KEY"] = os.environ[args.api_key_env]
    cmd = [args.python, str(Path(__file__).resolve()), "--bench-client", *bench_argv(args, url, tokenizer, output_file)]
    start = time.monotonic()
    timed_out = False
    with log_file.open("wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=workdir, start_new_session=True)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_child(proc)
    summary: dict[str, Any] = {"target": url, "sent": sent, "child_pid": proc.pid, "child_rc": proc.returncode,
                               "timed_out": timed_out, "wall_s": round(time.monotonic() - start, 3),
                               "log": str(log_file)}
    summary.update(summarize_output(output_file, sent))
    summary["stand_ins"] = json.loads(stand_ins_file.read_text()) if stand_ins_file.is_file() else []
    if proc.returncode not in (0, None) and not timed_out:
        summary["log_tail"] = log_file.read_text(errors="replace").splitlines()[-15:]
    return summary


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", required=True,
                   help="router or SGLang server base URL (repeat for several; run one after the other)")
    p.add_argument("--python", default=os.environ.get("HICACHE_TRAFFIC_PYTHON", "/opt/sglang/current/bin/python"),
                   help="python of a venv with sglang and transformers (default: $HICACHE_TRAFFIC_PYTHON, "
                        "else /opt/sglang/current/bin/python)")
    p.add_argument("--groups", type=int, default=2, help="shared prefixes (bench_serving --gsp-num-groups)")
    p.add_argument("--prompts-per-group", type=int, default=8, help="questions per prefix (--gsp-prompts-per-group)")
    p.add_argument("--prefix-len", type=int, default=4096,
                   help="tokens of each shared prefix (--gsp-system-prompt-len)")
    p.add_argument("--question-len", type=int, default=128, help="tokens of each question (--gsp-question-len)")
    p.add_argument("--output-len", type=int, default=16, help="tokens generated per request (--gsp-output-len)")
    p.add_argument("--request-rate", type=float, default=4.0, help="requests per second (Poisson arrivals)")
    p.add_argument("--max-concurrency", type=int, default=4, help="requests in flight at most")
    p.add_argument("--warmup-requests", type=int, default=1, help="bench_serving's warm-up requests (not counted)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=120.0, help=f"seconds for the whole run (at most {MAX_TIMEOUT_S})")
    p.add_argument("--tokenizer", help="tokenizer directory (default: a made-up word-level one, see above)")
    p.add_argument("--api-key-env", help="name of an environment variable holding the servers' api key")
    p.add_argument("--work-dir", help="where bench_serving's files go (default: a new temporary directory)")
    p.add_argument("--output", help="also write the JSON summary here")
    p.add_argument("--fleet", action="store_true",
                   help="targets are a real fleet: allow addresses outside 127.0.0.0/8 (operators only)")
    args = p.parse_args(argv)
    for name in ("groups", "prompts_per_group", "prefix_len", "question_len", "output_len", "max_concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.groups * args.prompts_per_group > MAX_PROMPTS:
        p.error(f"--groups x --prompts-per-group is {args.groups * args.prompts_per_group}, at most {MAX_PROMPTS}")
    if not 0 < args.request_rate < float("inf"):
        p.error("--request-rate must be a finite number above 0")
    if not 0 < args.timeout <= MAX_TIMEOUT_S:
        p.error(f"--timeout must be in (0, {MAX_TIMEOUT_S}] seconds")
    if args.warmup_requests < 0:
        p.error("--warmup-requests must be at least 0")
    if args.api_key_env and args.api_key_env not in os.environ:
        p.error(f"--api-key-env: {args.api_key_env} is not set")
    try:
        args.target = [check_target(url, args.fleet) for url in args.target]
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bench-client"]:
        bench_client(argv[1:])
        return 0
    args = parse_args(argv)
    # Absolute, not resolved: a venv's bin/python is a symlink whose target is not the venv.
    args.python = os.path.abspath(args.python) if os.sep in args.python else (shutil.which(args.python) or args.python)
    deadline = time.monotonic() + args.timeout
    workdir = Path(args.work_dir or tempfile.mkdtemp(prefix="hicache-traffic-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = Path(args.tokenizer).resolve() if args.tokenizer else write_tokenizer(workdir / "tokenizer")
    runs = []
    for index, url in enumerate(args.target):
        if time.monotonic() >= deadline:
            runs.append({"target": url, "sent": 0, "completed": 0, "failed": 0, "timed_out": True,
                         "skipped": "no time left"})
            continue
        runs.append(run_target(args, url, tokenizer, workdir, deadline, index))
    summary = {
        "generator": "sglang.benchmark.serving (generated-shared-prefix), driven by scripts/traffic.py",
        "python": args.python,
        "workload": {"groups": args.groups, "prompts_per_group": args.prompts_per_group,
                     "prefix_len": args.prefix_len, "question_len": args.question_len,
                     "output_len": args.output_len, "request_rate": args.request_rate,
                     "max_concurrency": args.max_concurrency, "warmup_requests": args.warmup_requests,
                     "timeout_s": args.timeout, "tokenizer": str(tokenizer)},
        "work_dir": str(workdir),
        "sent": sum(r["sent"] for r in runs),
        "completed": sum(r["completed"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "timed_out": any(r["timed_out"] for r in runs),
        "targets": runs,
    }
    text = json.dumps(summary, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    ok = not summary["timed_out"] and summary["failed"] == 0 and all(r.get("child_rc") == 0 for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
