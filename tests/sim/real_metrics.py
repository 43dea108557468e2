"""SGLang's own Prometheus metric definitions, read off the pinned wheel's source (the source of truth
the simulator's /metrics and roles/monitoring's alerts are checked against).

The wheel's sglang/srt/observability/metrics_collector.py is parsed with `ast` (importing it would
need torch): every `Counter/Gauge/Histogram/Summary(name="sglang:…", labelnames=…, buckets=…)`
call, the class it is made in, and the base labels each collector gets (the `labels = {…}` of
SchedulerMetricsCollector.init_new and of tokenizer_metric_labels(); their conditional extras —
priority scheduling, DP ranks, --extra-metric-labels — are off in this toolkit's profiles).
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


@dataclass(frozen=True)
class RealMetric:
    name: str  # family name as exposed in "# TYPE" (a counter's without _total)
    kind: str
    labels: tuple[str, ...]  # base labels of its collector + its own extra labels, sorted
    buckets: tuple[float, ...] | None
    collector: str


def sglang_version() -> str:
    sys.path.insert(0, str(ROOT / "sim"))
    from sglang_sim import SGLANG_VERSION

    return SGLANG_VERSION


def find_wheel() -> Path:
    """The pinned sglang wheel: from the test-host wheelhouse when built, else downloaded once from
    PyPI (no dependencies) into .cache/sglang-wheel with the controller's pip."""
    version = sglang_version()
    cache = Path(os.environ.get("HICACHE_FLEET_CACHE") or ROOT / ".cache")
    pattern = f"sglang-{version}-*.whl"
    found = sorted(glob.glob(str(cache / "wheelhouse" / "*" / pattern)))
    found += sorted(glob.glob(str(cache / "sglang-wheel" / pattern)))
    if found:
        return Path(found[0])
    dest = cache / "sglang-wheel"
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.11", "-d", str(dest), f"sglang=={version}"],
        check=True, timeout=900,
    )
    (wheel,) = glob.glob(str(dest / pattern))
    return Path(wheel)


def collector_source(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(COLLECTOR).decode("utf-8")


def _dict_keys(node: ast.AST, target: str) -> list[str] | None:
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Assign) and len(sub.targets) == 1
                and isinstance(sub.targets[0], ast.Name) and sub.targets[0].id == target
                and isinstance(sub.value, ast.Dict)):
            return [k.value for k in sub.value.keys if isinstance(k, ast.Constant)]
    return None


def _constants(node: ast.AST) -> list[str]:
    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def _bucket_list(func: ast.AST, expr: ast.AST) -> tuple[float, ...] | None:
    if isinstance(expr, (ast.List, ast.Tuple)):
        return tuple(float(ast.literal_eval(e)) for e in expr.elts)
    if isinstance(expr, ast.Name):  # a parameter with a default list assigned in the function body
        for sub in ast.walk(func):
            if (isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Name)
                    and sub.targets[0].id == expr.id and isinstance(sub.value, ast.List)):
                return tuple(float(ast.literal_eval(e)) for e in sub.value.elts)
    return None


def parse_collector(source: str) -> dict[str, RealMetric]:
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    base = {
        "SchedulerMetricsCollector": _dict_keys(classes["SchedulerMetricsCollector"], "labels"),
        "TokenizerMetricsCollector": _dict_keys(functions["tokenizer_metric_labels"], "labels"),
    }
    assert all(base.values()), f"base labels not found in {COLLECTOR}: {base}"
    metrics: dict[str, RealMetric] = {}
    for cls_name, labels in base.items():
        for func in ast.walk(classes[cls_name]):
            if not isinstance(func, ast.FunctionDef):
                continue
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and call.func.id in KINDS):
                    continue
                kw = {k.arg: k.value for k in call.keywords}
                name = kw.get("name")
                if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
                    continue
                kind = KINDS[call.func.id]
                family = name.value
                if kind == "counter" and family.endswith("_total"):
                    family = family[: -len("_total")]
                extra = _constants(kw["labelnames"]) if "labelnames" in kw else []
                buckets = _bucket_list(func, kw["buckets"]) if "buckets" in kw else None
                metrics[family] = RealMetric(family, kind, tuple(sorted([*labels, *extra])),
                                             buckets, cls_name)
    return metrics


def real_metrics() -> dict[str, RealMetric]:
    return parse_collector(collector_source(find_wheel()))
