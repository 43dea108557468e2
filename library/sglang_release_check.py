#!/usr/bin/python
# hicache-fleet: refuse an installed SGLang release that would die at start, without a GPU.
# Runs on the managed host with its system Python (standard library, binutils); the rules are in
# module_utils/sglang_release_rules.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_release_check
short_description: Refuse an SGLang venv release that would not start on the host's GPU platform
description:
  - >-
    Reads an installed SGLang virtualenv release (O(venv)) file by file, imports nothing from it,
    and lists what would kill the server at start on O(platform). Needs no GPU: it is meant to run
    after a release is staged and before anything restarts.
  - >-
    C(abi): every compiled extension in the venv that links torch (C(sgl_kernel) above all) resolves
    the c10/ATen/torch symbols it imports against the torch libraries it needs (C(nm -D), C(readelf
    -d)); an extension built against another torch, or one that needs a torch library the installed
    torch does not ship (C(libc10_hip.so) of a ROCm build), is refused with the symbols it misses.
  - >-
    C(kernel_names): every C(sgl_kernel) name (a Python import or a C(torch.ops.sgl_kernel) op) that
    the installed SGLang uses in its own O(platform) branches, or requires there through an import
    guarded by an O(platform)-only C(raise), exists in the installed kernel package.
  - >-
    C(cuda_kernel): on C(hip), a CUDA build of the kernel (the C(sglang-kernel) or C(sgl-kernel)
    distribution, or a kernel library that needs CUDA's libraries) is refused like a CUDA torch.
  - >-
    C(launch): the launch config (O(launch_args)) passes the installed SGLang's own rules beyond its
    argument parser on O(platform): the quantization method (and the draft's) is registered there,
    the model's C(--dtype) is one the method accepts, and the HiCache io backend is one known to run
    on the platform (O(io_backends)).
  - Read-only; never changed. Fails, with every problem in RV(problems) and in the message, when any check finds one.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
requirements:
  - binutils (C(nm), C(readelf), C(c++filt)) on the managed host for C(abi) and C(cuda_kernel).
options:
  venv:
    description: The release directory (a virtualenv with C(lib/pythonX.Y/site-packages)).
    type: path
    required: true
  platform:
    description:
      - The GPU platform the release will run on, as SGLang's own C(is_<platform>()) tests name it.
      - C(none) runs only C(abi) (nothing platform-specific).
    type: str
    choices: [hip, cuda, cpu, npu, xpu, musa, none]
    default: hip
  checks:
    description: Which checks to run.
    type: list
    elements: str
    choices: [abi, kernel_names, cuda_kernel, launch]
    default: [abi, kernel_names, cuda_kernel]
  kernel_package:
    description: The import name of SGLang's kernel package.
    type: str
    default: sgl_kernel
  launch_args:
    description:
      - For C(launch), the server arguments as flag to value (C(--quantization), C(--dtype),
        C(--speculative-draft-model-quantization), C(--enable-hierarchical-cache), C(--hicache-io-backend)).
    type: dict
    default: {}
  io_backends:
    description:
      - For C(launch), platform to the HiCache io backends known to run there; a platform not listed
        is not checked.
    type: dict
    default: {}
notes:
  - Supports check mode (it only reads).
"""

EXAMPLES = r"""
- name: Refuse a release whose kernel was built for another torch
  sglang_release_check:
    venv: /opt/sglang/venvs/0.5.19-rocm-gfx1100-1a2b3c4d5e6f
    platform: hip

- name: Check the launch config against the installed SGLang's rules on ROCm
  sglang_release_check:
    venv: /opt/sglang/current
    platform: hip
    checks: [launch]
    launch_args: {--quantization: gptq, --dtype: float16, --enable-hierarchical-cache: true,
                  --hicache-io-backend: direct}
    io_backends: {hip: [direct]}
"""

RETURN = r"""
problems:
  description: Why the release would not start; empty when it passed.
  returned: always
  type: list
  elements: str
site_packages:
  description: The venv's site-packages directory that was read.
  returned: always
  type: str
sglang_version:
  description: The installed SGLang version (its dist-info), empty when SGLang is not installed.
  returned: always
  type: str
kernel:
  description: The kernel distribution that provides O(kernel_package) (name and version), empty when none.
  returned: always
  type: dict
extensions:
  description: >-
    Each compiled extension that links torch, with the torch symbols it imports and those none of
    torch's libraries export.
  returned: when abi ran
  type: list
  elements: dict
kernel_names:
  description: How many kernel names the installed SGLang uses on the platform and which are missing.
  returned: when kernel_names ran
  type: dict
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_release_rules import (
    CUDA_LIBRARY,
    ToolError,
    abi_problems,
    elf_dynamic,
    kernel_name_problems,
    launch_problems,
    shared_objects,
)


def site_packages(venv: str) -> str | None:
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    return found[-1] if found else None


def distributions(site: str) -> dict[str, dict[str, str]]:
    """Canonical name -> {name, version, top_level} of the dist-info directories in site, read as files."""
    out = {}
    for info in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
        fields = {}
        try:
            with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.strip():
                        break
                    key, _sep, value = line.partition(":")
                    if key in ("Name", "Version"):
                        fields[key.lower()] = value.strip()
        except OSError:
            continue
        top = ""
        try:
            with open(os.path.join(info, "top_level.txt"), encoding="utf-8") as handle:
                top = " ".join(handle.read().split())
        except OSError:
            pass
        if "name" in fields:
            fields["top_level"] = top
            out[fields["name"].lower().replace("_", "-").replace(".", "-")] = fields
    return out


def kernel_distribution(dists: dict[str, dict[str, str]], package: str) -> dict[str, str]:
    for dist in dists.values():
        if package in dist.get("top_level", "").split():
            return {"name": dist["name"], "version": dist.get("version", "")}
    return {}


def cuda_kernel_problems(site: str, dists: dict[str, dict[str, str]], package: str, kernel: dict) -> list[str]:
    problems = []
    cuda_builds = sorted(f"{d['name']}=={d.get('version', '')}" for key, d in dists.items()
                         if key in ("sglang-kernel", "sgl-kernel"))
    if cuda_builds:
        problems.append(
            f"{', '.join(cuda_builds)} is SGLang's CUDA kernel build, which does not load on ROCm: install sglang "
            "with --no-deps (its wheel pins the CUDA kernel) and the ROCm kernel of the package set")
    kernel_dir = os.path.join(site, package)
    if os.path.isdir(kernel_dir):
        for path in shared_objects(kernel_dir):
            try:
                cuda = [lib for lib in elf_dynamic(path)["needed"] if CUDA_LIBRARY.match(lib)]
            except ToolError:
                continue
            if cuda:
                problems.append(
                    f"{os.path.relpath(path, site)} ({kernel.get('name', package)}) needs {', '.join(cuda)}: a CUDA "
                    "build of the kernel, which does not load on ROCm; install the ROCm kernel of the package set")
    return problems


def run(params: dict) -> dict:
    venv = params["venv"]
    site = site_packages(venv)
    result = {"problems": [], "site_packages": site or "", "sglang_version": "", "kernel": {}}
    if site is None:
        result["problems"].append(f"{venv} is not a virtualenv with lib/python3*/site-packages")
        return result
    dists = distributions(site)
    result["sglang_version"] = dists.get("sglang", {}).get("version", "")
    package = params["kernel_package"]
    kernel = kernel_distribution(dists, package)
    result["kernel"] = kernel
    platform = params["platform"]
    checks = params["checks"]
    sglang_dir = os.path.join(site, "sglang")
    if "abi" in checks:
        torch = dists.get("torch", {}).get("version", "")
        problems, findings = abi_problems(site, torch)
        result["problems"].extend(problems)
        result["extensions"] = [{**f, "path": os.path.relpath(f["path"], site)} for f in findings]
    if "cuda_kernel" in checks and platform == "hip":
        result["problems"].extend(cuda_kernel_problems(site, dists, package, kernel))
    if "kernel_names" in checks and platform != "none":
        kernel_dir = os.path.join(site, package)
        if not os.path.isdir(sglang_dir):
            result["problems"].append(f"SGLang is not installed in {venv}")
        elif not os.path.isdir(kernel_dir):
            result["problems"].append(
                f"the installed SGLang imports {package} on {platform.upper()}, which is not installed in {venv}: "
                "add the platform's kernel package to the package set")
        else:
            problems, info = kernel_name_problems(sglang_dir, kernel_dir, platform,
                                                  kernel.get("name") or package)
            result["problems"].extend(problems)
            result["kernel_names"] = info
    if "launch" in checks and platform != "none":
        if not os.path.isdir(sglang_dir):
            result["problems"].append(f"SGLang is not installed in {venv}")
        else:
            result["problems"].extend(launch_problems(sglang_dir, params["launch_args"], platform,
                                                      params["io_backends"]))
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "platform": {"type": "str", "default": "hip",
                         "choices": ["hip", "cuda", "cpu", "npu", "xpu", "musa", "none"]},
            "checks": {"type": "list", "elements": "str", "default": ["abi", "kernel_names", "cuda_kernel"],
                       "choices": ["abi", "kernel_names", "cuda_kernel", "launch"]},
            "kernel_package": {"type": "str", "default": "sgl_kernel"},
            "launch_args": {"type": "dict", "default": {}},
            "io_backends": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module.params)
    except ToolError as exc:
        module.fail_json(msg=f"cannot check the release {module.params['venv']}: {exc}", problems=[str(exc)])
    except OSError as exc:
        module.fail_json(msg=f"cannot read the release {module.params['venv']}: {exc}", problems=[str(exc)])
    if result["problems"]:
        module.fail_json(
            msg=f"the release {module.params['venv']} would not start on {module.params['platform'].upper()}: "
                + " | ".join(result["problems"]),
            changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
