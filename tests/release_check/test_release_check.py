"""The release check (library/sglang_release_check.py, module_utils/sglang_release_rules.py) on the
real wheels from the package index: the gfx1100 kernel against torch 2.9.1 (fits) and 2.14.1
(refused, naming its missing symbols); SGLang 0.5.19 and 0.5.23 with that kernel on HIP (0.5.23's
HiCache host pool needs a kernel function the wheel lacks); the report's launch config against each
release's quantization rules on HIP; a CUDA kernel build refused; and the module through Ansible."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plugins import load
from release_wheels import REPO, fetch, make_venv, unpack

rules = load("module_utils/sglang_release_rules.py")

# What the wheels' own files say (../shared/docs/radeon-stack.md, re-read by these tests).
MISSING_ON_2_14 = {
    "c10::MessageLogger::MessageLogger(char const*, int, int)",
    "c10::impl::cow::materialize_cow_storage(c10::StorageImpl&)",
}


def profile(name: str) -> dict:
    """A launch profile of the sglang_service role's defaults, with the role's HiCache args (paths,
    which the defaults take from other variables, left out)."""
    defaults = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
    args = {**defaults["sglang_service_profiles"][name], **defaults["sglang_service_hicache_args"]}
    return {flag: value for flag, value in args.items() if "{{" not in str(value)}


def io_backends() -> dict:
    defaults = yaml.safe_load((REPO / "roles/sglang_service/defaults/main.yml").read_text())
    return defaults["sglang_service_platform_io_backends"]


# --- ABI: the kernel's torch symbols ----------------------------------------------------------------

def test_kernel_fits_torch_2_9_1(tmp_path, rdna3_kernel, torch_libs):
    site = make_venv(tmp_path, kernel=rdna3_kernel, torch_lib=torch_libs("2.9.1")) / "lib/python3.12/site-packages"
    problems, findings = rules.abi_problems(str(site), "2.9.1")
    [abi] = findings
    assert abi["path"].endswith("sgl_kernel/common_ops.cpython-312-x86_64-linux-gnu.so")
    assert abi["checked_symbols"] > 50
    assert abi["missing_symbols"] == []
    # PyPI's torch is a CUDA build: the kernel's HIP libraries are not there, and that alone is said.
    assert abi["absent_libraries"] == ["libc10_hip.so", "libtorch_hip.so"]
    assert len(problems) == 1
    assert problems[0].startswith("sgl_kernel/common_ops.cpython-312-x86_64-linux-gnu.so needs libc10_hip.so, "
                                  "libtorch_hip.so, which the venv's torch does not ship: it was built for a ROCm "
                                  "torch")


def test_kernel_refused_against_torch_2_14_1(tmp_path, rdna3_kernel, torch_libs):
    site = make_venv(tmp_path, kernel=rdna3_kernel, torch_lib=torch_libs("2.14.1")) / "lib/python3.12/site-packages"
    problems, findings = rules.abi_problems(str(site), "2.14.1")
    [abi] = findings
    names = set(rules.demangle(abi["missing_symbols"]).values())
    assert len(abi["missing_symbols"]) == 4
    assert names >= MISSING_ON_2_14
    assert sum("torch::Library::_def(" in n and "Tag" in n for n in names) == 2
    built = [p for p in problems if "was built against another torch" in p]
    assert len(built) == 1
    assert built[0].startswith("sgl_kernel/common_ops.cpython-312-x86_64-linux-gnu.so was built against another torch: "
                               "4 of its torch symbols are exported by none of the venv's torch 2.14.1 libraries")
    assert "c10::MessageLogger::MessageLogger(char const*, int, int)" in built[0]


def test_pypis_torchvision_beside_a_cpu_torch_is_refused(tmp_path):
    """What sglang 0.5.19 imports at module load (srt/utils/common.py) fails this way with the CPU
    test set: PyPI's torchvision is a CUDA build ("operator torchvision::nms does not exist")."""
    vision = unpack(fetch("torchvision==0.28.0"), ("torchvision/",)) / "torchvision"
    cpu_lib = unpack(fetch("torch==2.13.0+cpu"), ("torch/lib/",)) / "torch" / "lib"
    site = make_venv(tmp_path, torch_lib=cpu_lib) / "lib/python3.12/site-packages"
    shutil.copytree(vision, site / "torchvision")
    problems, findings = rules.abi_problems(str(site), "2.13.0+cpu")
    assert {os.path.basename(f["path"]) for f in findings} >= {"_C.so"}
    c_so = next(p for p in problems if p.startswith("torchvision/_C.so"))
    assert c_so.startswith("torchvision/_C.so needs libc10_cuda.so, libtorch_cuda.so, which the venv's torch does "
                           "not ship: it was built for a CUDA torch")


def test_an_extension_without_torch_is_not_checked(tmp_path):
    import _ctypes  # a compiled extension of the standard library: links no torch

    site = make_venv(tmp_path) / "lib/python3.12/site-packages"
    (site / "plain").mkdir()
    shutil.copy(_ctypes.__file__, site / "plain" / "x.so")
    problems, findings = rules.abi_problems(str(site))
    assert (problems, findings) == ([], [])


# --- sgl_kernel names used on HIP -------------------------------------------------------------------

def test_sglang_0_5_19_finds_every_kernel_name_on_hip(rdna3_kernel, sglang_pkg):
    problems, info = rules.kernel_name_problems(str(sglang_pkg("0.5.19")), str(rdna3_kernel), "hip",
                                                "sglang-kernel-rdna3")
    assert problems == []
    assert info["used"] > 10  # activations, layernorms, rotary, kvcacheio … really scanned


def test_sglang_0_5_23_needs_what_the_gfx1100_kernel_lacks(rdna3_kernel, sglang_pkg):
    problems, info = rules.kernel_name_problems(str(sglang_pkg("0.5.23")), str(rdna3_kernel), "hip",
                                                "sglang-kernel-rdna3")
    assert info["missing"] == ["py:kvcacheio.get_device_accessible_ptr"]
    [problem] = problems
    assert problem.startswith("the installed SGLang uses sgl_kernel.kvcacheio.get_device_accessible_ptr on HIP "
                              "(srt/mem_cache/pool_host/common.py:")
    assert "which the installed sglang-kernel-rdna3 lacks" in problem


def test_a_kernel_with_that_function_passes(tmp_path, rdna3_kernel, sglang_pkg):
    kernel = tmp_path / "sgl_kernel"
    shutil.copytree(rdna3_kernel, kernel)
    with (kernel / "kvcacheio.py").open("a") as handle:
        handle.write("\n\ndef get_device_accessible_ptr(tensor):\n    return tensor.data_ptr()\n")
    problems, info = rules.kernel_name_problems(str(sglang_pkg("0.5.23")), str(kernel), "hip")
    assert (problems, info["missing"]) == ([], [])


def test_platform_branches_are_taken_like_the_interpreter_would():
    source = (
        "if _is_cuda:\n    from sgl_kernel import cuda_only\n"
        "elif _is_hip and not _is_npu:\n    from sgl_kernel import on_hip\n"
        "if is_cuda() or _is_hip:\n    x = torch.ops.sgl_kernel.op_both.default\n"
        "if cpu_has_amx_support():\n    y = torch.ops.sgl_kernel.op_amx\n"
        "def f():\n    try:\n        from sgl_kernel import optional\n    except ImportError:\n        pass\n"
        "def g():\n    try:\n        from sgl_kernel.kvcacheio import needed\n"
        "    except ImportError:\n        needed = None\n"
        "    if needed is None and _is_hip:\n        raise ImportError('needed on ROCm')\n"
    )
    hip = {(kind, name) for kind, name, _ in rules.kernel_uses(source, "hip")}
    assert hip == {("py", "on_hip"), ("op", "op_both"), ("py", "kvcacheio.needed")}
    cuda = {(kind, name) for kind, name, _ in rules.kernel_uses(source, "cuda")}
    assert cuda == {("py", "cuda_only"), ("op", "op_both")}
    assert rules.truth(ast.parse("not (_is_hip or _is_cuda)").body[0].value, "hip") is False
    assert rules.truth(ast.parse("_is_hip and some_flag").body[0].value, "hip") is None


# --- The launch config against SGLang's rules on HIP --------------------------------------------------

def test_gptq_registered_on_hip_in_0_5_19_not_in_0_5_23(sglang_pkg):
    for version, on_hip in (("0.5.19", True), ("0.5.23", False)):
        init = (sglang_pkg(version) / "srt/layers/quantization/__init__.py").read_text()
        assert ("gptq" in rules.registered_quantizations(init, "hip")) is on_hip, version
        assert "gptq" in rules.registered_quantizations(init, "cpu"), version  # CPU keeps it in both
        assert rules.supported_act_dtypes(str(sglang_pkg(version) / "srt/layers/quantization"),
                                          "GPTQConfig") == ["float16"]


def test_the_reports_profile_is_refused_on_hip_by_both_releases(sglang_pkg):
    seed = profile("seed-validated")
    old = rules.launch_problems(str(sglang_pkg("0.5.19")), seed, "hip", io_backends())
    assert [p.split(":")[0] for p in old] == ["--dtype bfloat16 with --quantization gptq",
                                              "--hicache-io-backend kernel on HIP"]
    assert "set --dtype float16 in the profile" in old[0]
    new = rules.launch_problems(str(sglang_pkg("0.5.23")), seed, "hip", io_backends())
    assert new[0].startswith("--quantization gptq: the installed SGLang does not register 'gptq' on HIP")


def test_the_gfx1100_profile_passes_0_5_19_and_not_0_5_23(sglang_pkg):
    args = {**profile("seed-gfx1100"), "--hicache-io-backend": "direct"}
    assert rules.launch_problems(str(sglang_pkg("0.5.19")), args, "hip", io_backends()) == []
    refused = rules.launch_problems(str(sglang_pkg("0.5.23")), args, "hip", io_backends())
    assert len(refused) == 1
    assert "does not register 'gptq' on HIP" in refused[0]


def test_gfx1100_profile_keeps_the_reports_hicache_and_sizes():
    seed, gfx = profile("seed-validated"), profile("seed-gfx1100")
    changed = {flag for flag in seed.keys() | gfx.keys() if seed.get(flag) != gfx.get(flag)}
    # Only what the stack cannot take (each named with its reason in the profile's comments).
    assert changed == {"--dtype", "--kv-cache-dtype", "--cuda-graph-bs-decode", "--disable-cuda-graph",
                       "--speculative-draft-model-quantization"}


# --- A CUDA kernel build, and the module through Ansible -----------------------------------------

def test_cuda_kernel_build_refused_on_hip(tmp_path):
    module = load("library/sglang_release_check.py")
    venv = make_venv(tmp_path, dists={"sglang-kernel": "0.4.10", "torch": "2.14.1"})
    result = module.run({"venv": str(venv), "platform": "hip", "checks": ["cuda_kernel"],
                         "kernel_package": "sgl_kernel", "launch_args": {}, "io_backends": {}})
    assert result["kernel"] == {"name": "sglang-kernel", "version": "0.4.10"}
    [problem] = result["problems"]
    assert problem.startswith("sglang-kernel==0.4.10 is SGLang's CUDA kernel build, which does not load on ROCm")


def ansible_module(tmp_path: Path, args: dict, check: bool = False) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_DEPRECATION_WARNINGS": "0"}
    ansible = Path(sys.executable).parent / "ansible"
    cmd = [str(ansible) if ansible.exists() else "ansible", "localhost", "-i", "localhost,", "-c", "local",
           "-m", "sglang_release_check", "-a", json.dumps(args),
           "-e", json.dumps({"ansible_python_interpreter": sys.executable})] + (["--check"] if check else [])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    # minimal callback: `localhost | FAILED! => {...}` (or SUCCESS)
    status, _, body = proc.stdout[proc.stdout.rfind("localhost | "):].partition(" => ")
    try:
        result = json.loads(body)
    except ValueError:
        pytest.fail(f"ansible gave no result (rc {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return {**result, "failed": "FAILED" in status}


def test_module_refuses_the_old_stack_with_every_reason(tmp_path, rdna3_kernel, torch_libs, sglang_pkg):
    venv = make_venv(tmp_path / "venv", kernel=rdna3_kernel, torch_lib=torch_libs("2.14.1"),
                     sglang=sglang_pkg("0.5.23"),
                     dists={"sglang": "0.5.23", "sglang-kernel-rdna3": "0.4.6.post1", "torch": "2.14.1"})
    result = ansible_module(tmp_path, {"venv": str(venv), "platform": "hip"}, check=True)
    assert result["failed"] is True
    assert result["changed"] is False
    assert result["sglang_version"] == "0.5.23"
    assert result["kernel"] == {"name": "sglang-kernel-rdna3", "version": "0.4.6.post1"}
    assert result["msg"].startswith(f"the release {venv} would not start on HIP: ")
    assert "c10::MessageLogger::MessageLogger(char const*, int, int)" in result["msg"]
    assert "sgl_kernel.kvcacheio.get_device_accessible_ptr" in result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_module_passes_the_published_stack_apart_from_the_hip_torch(tmp_path, rdna3_kernel, torch_libs, sglang_pkg):
    venv = make_venv(tmp_path / "venv", kernel=rdna3_kernel, torch_lib=torch_libs("2.9.1"), sglang=sglang_pkg("0.5.19"),
                     dists={"sglang": "0.5.19", "sglang-kernel-rdna3": "0.4.6.post1", "torch": "2.9.1"})
    result = ansible_module(tmp_path, {"venv": str(venv), "platform": "hip",
                                       "checks": ["abi", "kernel_names", "cuda_kernel", "launch"],
                                       "launch_args": {**profile("seed-gfx1100"), "--hicache-io-backend": "direct"},
                                       "io_backends": io_backends()})
    # The only finding: PyPI's torch is no ROCm build (the kernel's HIP libraries are absent).
    assert "problems" in result, result
    assert result["problems"] == [p for p in result["problems"] if "libc10_hip.so" in p]
    assert len(result["problems"]) == 1
    assert result["kernel_names"]["missing"] == []
    assert result["extensions"][0]["missing_symbols"] == []
