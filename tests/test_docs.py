"""The README and docs/: every repository path they name exists, the generated tables of
docs/architecture.md are current (scripts/gen_docs.py --check), and a benchmark's --record
(benchmarks/record.py) rewrites only its own block of docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTENSIONS = (".yml", ".yaml", ".py", ".md", ".sh", ".cfg", ".txt")
# Paths that are made by a run, not kept in the checkout, and the report files runs write.
GENERATED = (".cache/", ".venv/", "reports/")
RUN_OUTPUTS = {"rollout.md", "status.md"}
# Paths the docs name inside other software (a wheel, SGLang's source), not in this repository.
FOREIGN = {"srt/utils/common.py", "torchvision/_C.so"}
SKIPPED_DIRS = {".git", ".venv", ".cache", "__pycache__", ".molecule", "node_modules"}


def _tracked_basenames(root: Path) -> set[str]:
    names: set[str] = set()
    for _dir, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        names.update(files)
    return names


def named_paths(text: str) -> list[tuple[str, str]]:
    """('code' or 'link', token) for every path-like token of inline code spans and link targets,
    outside fenced code blocks (those hold commands and sample output)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found: list[tuple[str, str]] = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        for token in span.split():
            if "/" in token or token.endswith(EXTENSIONS):
                found.append(("code", token))
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        found.append(("link", target))
    return found


def missing_paths(doc: Path, root: Path = ROOT) -> list[str]:
    """The repository paths doc names that do not exist in root."""
    basenames: set[str] | None = None
    missing = []
    for kind, token in named_paths(doc.read_text(encoding="utf-8")):
        if "://" in token or token.startswith(("mailto:", "#")):
            continue
        if kind == "link":
            target = (doc.parent / token.split("#", 1)[0]).resolve()
            if not target.is_relative_to(root) or not target.exists():
                missing.append(token)
            continue
        path = token.rstrip(".,;:")
        if (
            path.startswith(("/", "~", "../", "-"))  # on a host or the controller, outside the checkout, a flag
            or any(c in path for c in "<>{}$=@")  # a placeholder, a command's argument
            or path.startswith(GENERATED) or "/reports/" in path
            or path in FOREIGN or path in RUN_OUTPUTS
        ):
            continue
        if "*" in path:
            if not any(root.glob(path.rstrip("/"))):
                missing.append(token)
        elif "/" not in path:
            if not (root / path).exists():
                basenames = basenames if basenames is not None else _tracked_basenames(root)
                if path not in basenames:
                    missing.append(token)
        elif not (root / path).exists():
            missing.append(token)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_named_path_exists(doc: Path) -> None:
    assert missing_paths(doc) == [], f"{doc.relative_to(ROOT)} names paths that are not in the checkout"


def test_the_path_check_flags_what_is_not_there(tmp_path: Path) -> None:
    (tmp_path / "roles" / "real").mkdir(parents=True)
    (tmp_path / "roles" / "real" / "README.md").write_text("x\n")
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "page.md"
    doc.write_text(
        "Real: `roles/real/README.md`, [real](../roles/real/README.md), `roles/*/README.md`, `README.md`.\n"
        "Missing: `roles/gone/tasks/main.yml`, [gone](gone.md), `roles/*/meta/main.yml`, `nowhere.yml`,\n"
        "[outside](../../elsewhere.md).\n"
        "Not repository paths: `/var/lib/hicache-fleet/validated.json`, `inventories/<fleet>/hosts.yml`,\n"
        "`.cache/logs/x.txt`, [a site](https://example.org/a/b.md), `make demo`, `--tags preflight`.\n"
        "```sh\ncat fenced/commands/are/not/checked.yml\n```\n"
    )
    (tmp_path / "README.md").write_text("x\n")
    assert missing_paths(doc, tmp_path) == [
        "roles/gone/tasks/main.yml", "roles/*/meta/main.yml", "nowhere.yml", "gone.md", "../../elsewhere.md",
    ]


def test_readme_names_no_issue_numbers() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.findall(r"\bissues? #?\d+", text, flags=re.I) == []


# --- scripts/gen_docs.py ------------------------------------------------------------------------------

def _gen_docs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, check=False)


def test_generated_tables_are_current() -> None:
    done = _gen_docs("--check")
    assert done.returncode == 0, done.stderr + "\nrun: python scripts/gen_docs.py"


def test_gen_docs_check_fails_on_a_stale_table_and_the_rewrite_fixes_it(tmp_path: Path) -> None:
    stale = tmp_path / "architecture.md"
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    begin = text.index("<!-- BEGIN generated: entry points -->")
    end = text.index("<!-- END generated -->", begin)
    block = text[begin:end]
    assert "`converged_record`" in block
    stale.write_text(text[:begin] + block.replace("`converged_record`", "`converged_recorded`") + text[end:],
                     encoding="utf-8")
    assert stale.read_text(encoding="utf-8") != text
    assert _gen_docs("--check", "--file", str(stale)).returncode == 1
    assert _gen_docs("--file", str(stale)).returncode == 0
    assert stale.read_text(encoding="utf-8") == text
    assert _gen_docs("--check", "--file", str(stale)).returncode == 0


def test_every_entry_point_is_in_the_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for spec in ROOT.glob("roles/*/meta/argument_specs.yml"):
        role = spec.parent.parent.name
        for name in re.findall(r"^  ([a-z_]+):\s*$", spec.read_text(encoding="utf-8"), flags=re.M):
            assert f"| [`{role}`](../roles/{role}/README.md) | `{name}` |" in text, (role, name)


# --- benchmarks/record.py -----------------------------------------------------------------------------

def _record_module():
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "benchmarks" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOC_WITH_BLOCKS = """# Benchmarks

Hand-written text, kept.

<!-- BEGIN recorded: alpha -->
old alpha
<!-- END recorded: alpha -->

Between the blocks, kept.

<!-- BEGIN recorded: beta -->
old beta
<!-- END recorded: beta -->

Recorded by hand (2026-12-01): 2.0 s, kept.
"""


def test_record_rewrites_only_its_own_block(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record = _record_module()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC_WITH_BLOCKS, encoding="utf-8")

    def main() -> int:
        print("alpha median 12.3 ms")
        return 0

    assert record.run(main, "alpha", doc=doc, argv=["--record"]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "alpha median 12.3 ms" in capsys.readouterr().out  # still printed
    alpha = re.search(r"<!-- BEGIN recorded: alpha -->\n(.*?)<!-- END recorded: alpha -->", text, re.S).group(1)
    assert "alpha median 12.3 ms" in alpha
    assert "load average" in alpha
    assert "old alpha" not in alpha
    assert re.search(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC", alpha)
    # Everything outside alpha's block is byte for byte what it was.
    outside = re.sub(r"<!-- BEGIN recorded: alpha -->.*?<!-- END recorded: alpha -->", "", text, flags=re.S)
    expected = re.sub(r"<!-- BEGIN recorded: alpha -->.*?<!-- END recorded: alpha -->", "", DOC_WITH_BLOCKS,
                      flags=re.S)
    assert outside == expected


def test_record_writes_nothing_without_the_flag_or_after_a_failure(tmp_path: Path) -> None:
    record = _record_module()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC_WITH_BLOCKS, encoding="utf-8")
    assert record.run(lambda: print("figures") or 0, "beta", doc=doc, argv=[]) == 0
    assert record.run(lambda: print("half the figures") or 1, "beta", doc=doc, argv=["--record"]) == 1
    assert doc.read_text(encoding="utf-8") == DOC_WITH_BLOCKS


def test_record_refuses_a_document_without_its_block(tmp_path: Path) -> None:
    record = _record_module()
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOC_WITH_BLOCKS, encoding="utf-8")
    with pytest.raises(ValueError, match="gamma"):
        record.write_block(doc, "gamma", "<!-- BEGIN recorded: gamma -->\nx\n<!-- END recorded: gamma -->")
    assert doc.read_text(encoding="utf-8") == DOC_WITH_BLOCKS


def test_every_benchmark_has_its_block_and_the_flag() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for bench in sorted((ROOT / "benchmarks").glob("*.py")):
        if bench.name == "record.py":
            continue
        source = bench.read_text(encoding="utf-8")
        assert f'record.run(main, "{bench.stem}")' in source, bench.name
        assert '"--record"' in source, bench.name
        assert text.count(f"<!-- BEGIN recorded: {bench.stem} -->") == 1, bench.name
        assert text.count(f"<!-- END recorded: {bench.stem} -->") == 1, bench.name
