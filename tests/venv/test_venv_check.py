"""The sglang_venv check (roles/sglang_venv/files/venv_check.py) on real torch builds: the CPU wheel
of the test wheelhouse and a CUDA wheel's version.py (tests/venv/fixtures/README.md) are refused by
the rocm-gfx1100 set's expectations, with their message; the test-minimal set's own check passes.
The script also runs end to end, as the role runs it on a host, against a site directory laid out
from those real files."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from plugins import ROOT, load

check = load("roles/sglang_venv/files/venv_check.py")
SCRIPT = ROOT / "roles/sglang_venv/files/venv_check.py"
FIXTURES = Path(__file__).parent / "fixtures"
CUDA_VERSION_PY = FIXTURES / "torch-2.14.1+cu130.version.py.txt"
CUDA_REQUIRES = (FIXTURES / "torch-2.14.1+cu130.requires.txt").read_text().splitlines()
WHEELS = sorted((ROOT / ".cache" / "wheelhouse").glob("*/torch-*+cpu-*.whl"))


def package_set_expectation(name: str) -> dict:
    """The `check` of a package set in the role's defaults, as the role passes it (gpu_count added)."""
    defaults = yaml.safe_load((ROOT / "roles/sglang_venv/defaults/main.yml").read_text())
    return {**defaults["sglang_venv_package_sets"][name].get("check", {}), "gpu_count": 2}


ROCM = package_set_expectation("rocm-gfx1100")
TEST_MINIMAL = package_set_expectation("test-minimal")


def minimal_torch_pin() -> str:
    """The torch requirement the test-minimal set installs (its constraint, e.g. torch==2.13.0)."""
    defaults = yaml.safe_load((ROOT / "roles/sglang_venv/defaults/main.yml").read_text())
    return next(c for c in defaults["sglang_venv_package_sets"]["test-minimal"]["constraints"] if c.startswith("torch"))


@pytest.fixture(scope="module")
def cpu_wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The test wheelhouse's CPU torch wheel; before the wheelhouse is built (make test builds it beside
    pytest), the same wheel fetched by pip as the wheelhouse playbook would."""
    wheels = WHEELS
    if not wheels:
        into = tmp_path_factory.mktemp("torch-wheel")
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
             "-d", str(into), minimal_torch_pin()],
            capture_output=True, text=True, timeout=900, check=False,
        )
        wheels = sorted(into.glob("torch-*+cpu-*.whl"))
        if not wheels:
            pytest.skip(f"no CPU torch wheel: not in .cache/wheelhouse/ and pip download gave none: "
                        f"{(fetched.stderr or fetched.stdout)[-500:]}")
    return zipfile.ZipFile(wheels[0])


def test_the_sets_say_what_they_expect():
    assert ROCM["torch_build"] == "rocm"
    assert ROCM["gpu_arch"] == "gfx1100"
    assert TEST_MINIMAL.get("torch_build", "any") == "any"


def test_cuda_build_refused_by_rocm_set():
    torch = check.read_torch_version(str(CUDA_VERSION_PY))
    assert torch == {"version": "2.14.1+cu130", "cuda": "13.0", "hip": None, "rocm": None}
    problems = check.venv_problems(ROCM, torch, {"torch": "2.14.1"}, check.requirement_names(CUDA_REQUIRES))
    assert len(problems) == 1
    assert problems[0].startswith("torch 2.14.1+cu130 is not a ROCm build (torch.version.hip is unset; it is a "
                                  "CUDA 13.0 build)")
    assert "sglang_venv_rocm_torch_index_url" in problems[0]


def test_cuda_packages_and_plain_triton_refused():
    torch = {"version": "2.14.1+rocm7.2", "cuda": None, "hip": "7.2.53211", "rocm": "7.2.0"}
    # What pip's resolver brought in the dry run next to a ROCm torch.
    dists = {"torch": "2.14.1+rocm7.2", "pytorch-triton-rocm": "3.8.0", "triton": "3.6.0",
             "nvidia-nccl-cu13": "2.30.7", "cuda-bindings": "13.0.3", "xgrammar": "0.2.7"}
    problems = check.venv_problems(ROCM, torch, dists, ["pytorch-triton-rocm", "filelock"])
    assert len(problems) == 2, problems
    assert problems[0].startswith("CUDA packages in a ROCm venv: cuda-bindings==13.0.3, nvidia-nccl-cu13==2.30.7")
    assert problems[1].startswith("triton==3.6.0 is installed but torch asks for pytorch-triton-rocm")


def test_a_clean_rocm_venv_passes_and_gpus_are_counted():
    torch = {"version": "2.14.1+rocm7.2", "cuda": None, "hip": "7.2.53211", "rocm": "7.2.0"}
    dists = {"torch": "2.14.1+rocm7.2", "pytorch-triton-rocm": "3.8.0", "numpy": "2.4.6"}
    assert check.venv_problems(ROCM, torch, dists, ["pytorch-triton-rocm"]) == []
    assert check.venv_problems(ROCM, torch, dists, ["pytorch-triton-rocm"], ["gfx1100", "gfx1100"]) == []
    # An iGPU taking index 0 and one card missing: one gfx1100 where two are expected.
    (problem,) = check.venv_problems(ROCM, torch, dists, ["pytorch-triton-rocm"], ["gfx1036", "gfx1100"])
    assert problem.startswith("torch sees 1 gfx1100 device(s) (gfx1036, gfx1100), expected 2 (sglang_venv_gpu_count)")


def test_real_cpu_wheel_refused_by_rocm_set_and_passes_test_minimal(cpu_wheel, tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_bytes(cpu_wheel.read("torch/version.py"))
    torch = check.read_torch_version(str(tmp_path / "torch" / "version.py"))
    assert torch["version"].endswith("+cpu")
    assert torch["hip"] is None
    (problem,) = check.venv_problems(ROCM, torch, {"torch": torch["version"]})
    assert problem.startswith(f"torch {torch['version']} is not a ROCm build (torch.version.hip is unset; it is a "
                              "CPU-only build)")
    assert check.venv_problems(TEST_MINIMAL, torch, {"torch": torch["version"], "triton": "3.9.0"}) == []


def _dist_info(site: Path, name: str, version: str, requires: list[str] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def run_script(site: Path, expect: dict) -> tuple[int, dict]:
    result = subprocess.run([sys.executable, "-I", "-S", "-c",
                             f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = sys.argv[1:]; "
                             f"exec(open({str(SCRIPT)!r}).read())", "venv_check.py", json.dumps(expect)],
                            capture_output=True, text=True, timeout=60, check=False)
    return result.returncode, json.loads(result.stdout)


def test_script_on_the_real_cpu_wheel_as_the_role_runs_it(cpu_wheel, tmp_path):
    """The test-minimal venv's layout: the wheel's own torch/version.py and METADATA, plain triton."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_bytes(cpu_wheel.read("torch/version.py"))
    meta = next(n for n in cpu_wheel.namelist() if n.endswith(".dist-info/METADATA"))
    (site / meta).parent.mkdir()
    (site / meta).write_bytes(cpu_wheel.read(meta))
    _dist_info(site, "triton", "3.9.0")
    rc, out = run_script(site, {**ROCM, "gpu_device_node": str(tmp_path / "no-kfd")})
    assert rc == 1
    assert out["problems"][0].startswith("torch 2.13.0+cpu is not a ROCm build")
    assert out["problems"][1].startswith("triton==3.9.0 is installed but torch asks for no triton")
    assert out["facts"]["devices"] is None
    rc, out = run_script(site, TEST_MINIMAL)
    assert (rc, out["problems"]) == (0, [])


def test_script_on_the_cuda_build(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "version.py").write_bytes(CUDA_VERSION_PY.read_bytes())
    _dist_info(site, "torch", "2.14.1", CUDA_REQUIRES)
    _dist_info(site, "nvidia-nccl-cu13", "2.30.7")
    _dist_info(site, "triton", "3.8.0")
    rc, out = run_script(site, {**ROCM, "gpu_device_node": str(tmp_path / "no-kfd")})
    assert rc == 1
    assert len(out["problems"]) == 2, out
    assert out["problems"][0].startswith("torch 2.14.1+cu130 is not a ROCm build")
    assert out["problems"][1].startswith("CUDA packages in a ROCm venv: nvidia-nccl-cu13==2.30.7")
    # This triton is the one torch asks for (a CUDA torch's own): not flagged as foreign.
    assert "triton" in out["facts"]["torch_requires"]
