"""The venv check of roles/sglang_venv: is this release's torch the build its package set needs?

Run by the release's own python on the host (tasks/verify.yml copies it there), with the package
set's expectations as one JSON argument::

    python venv_check.py '{"torch_build": "rocm", "gpu_arch": "gfx1100", "gpu_count": 2}'

It prints ``{"problems": [...], "facts": {...}}`` and exits 1 when there are problems. Without a
GPU it still refuses a torch that is not a ROCm build (``torch.version.hip`` unset), CUDA packages
(``nvidia-*``, ``cuda-*``) and a ``triton`` that torch did not ask for (PyPI's plain triton installs
the same ``triton`` module as ROCm's and shadows it). With ``/dev/kfd`` present (a ROCm host with
GPUs) it also imports torch and counts the devices of ``gpu_arch`` that torch sees.

``torch/version.py`` is read as a file, not imported, so the build check needs neither a GPU nor
the seconds an import of torch takes; ``venv_problems`` is a plain function with pytest tests
(tests/venv/test_venv_check.py, on the real CPU torch wheel and a CUDA wheel's version.py).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|cupy-cuda)")
TRITON_PACKAGE = re.compile(r"^(pytorch-)?triton(-rocm)?$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r";.*\bextra\s*==")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_torch_version(path: str) -> dict[str, Any]:
    """The assignments of a ``torch/version.py`` (``__version__``, ``cuda``, ``hip``, ``rocm``), read
    without importing torch."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    out: dict[str, Any] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                out[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return {"version": out.get("__version__"), "cuda": out.get("cuda"), "hip": out.get("hip"),
            "rocm": out.get("rocm")}


def requirement_names(requires: Sequence[str] | None) -> list[str]:
    """Canonical names of a distribution's Requires-Dist entries (extras' requirements left out)."""
    names = []
    for req in requires or []:
        if _EXTRA.search(req):
            continue
        match = _REQ_NAME.match(req)
        if match:
            names.append(canonical(match.group(1)))
    return names


def venv_problems(
    expect: Mapping[str, Any],
    torch: Mapping[str, Any] | None,
    distributions: Mapping[str, str],
    torch_requires: Sequence[str] = (),
    devices: Sequence[str] | None = None,
) -> list[str]:
    """Why this venv is not what the package set expects; empty when it is.

    ``expect``: ``torch_build`` (``rocm`` or ``any``), ``gpu_arch`` and ``gpu_count`` (checked only
    when ``devices`` is given, i.e. on a host with GPUs). ``torch``: ``read_torch_version``'s result
    (``None`` when torch is not installed). ``distributions``: installed name -> version.
    ``torch_requires``: torch's own requirement names. ``devices``: the GPU arch names torch sees.
    """
    build = str(expect.get("torch_build") or "any")
    if build == "any":
        return []
    fix = ("install torch from PyTorch's ROCm wheel index (sglang_venv_rocm_torch_index_url, a mirror of it, "
           "or a wheelhouse built from it) at sglang_venv_rocm_torch_version, or use the package set's lock file "
           "(make lock)")
    if torch is None:
        return [f"torch is not installed in this venv; {fix}"]
    problems = []
    if not torch.get("hip"):
        kind = (f"a CUDA {torch['cuda']} build" if torch.get("cuda") else "a CPU-only build")
        problems.append(
            f"torch {torch.get('version')} is not a ROCm build (torch.version.hip is unset; it is {kind}); {fix}")
    dists = {canonical(k): v for k, v in distributions.items()}
    cuda = sorted(f"{name}=={dists[name]}" for name in dists if CUDA_PACKAGE.match(name))
    if cuda:
        problems.append(
            f"CUDA packages in a ROCm venv: {', '.join(cuda)} (a CUDA torch from the default index, or a "
            "dependency that asks for one, slipped in); install from the package set's lock file, or keep "
            "their requirers out of the steps (install them with no_deps)")
    wanted = {canonical(n) for n in torch_requires if TRITON_PACKAGE.match(canonical(n))}
    foreign = sorted(f"{name}=={dists[name]}" for name in dists
                     if TRITON_PACKAGE.match(name) and name not in wanted and "+rocm" not in dists[name])
    if foreign:
        problems.append(
            f"{', '.join(foreign)} is installed but torch asks for {', '.join(sorted(wanted)) or 'no triton'}: "
            "PyPI's plain triton installs the same `triton` module as ROCm's and replaces it (xgrammar "
            "requires plain triton); remove it and install from the package set's lock file, which excludes it")
    if devices is not None:
        arch = str(expect.get("gpu_arch") or "")
        count = int(expect.get("gpu_count") or 0)
        matching = [d for d in devices if not arch or d.split(":")[0] == arch]
        if count and len(matching) != count:
            problems.append(
                f"torch sees {len(matching)} {arch or 'GPU'} device(s) ({', '.join(devices) or 'none'}), expected "
                f"{count} (sglang_venv_gpu_count): check HIP_VISIBLE_DEVICES, the amdgpu driver and the render/video "
                "groups")
        elif not matching:
            problems.append(f"torch sees no {arch} device ({', '.join(devices) or 'none'})")
    return problems


def _torch_devices() -> list[str]:
    import torch  # only on hosts with GPUs: importing torch takes seconds

    if not torch.cuda.is_available():
        return []
    return [getattr(torch.cuda.get_device_properties(i), "gcnArchName", "?") for i in range(torch.cuda.device_count())]


def collect(expect: Mapping[str, Any]) -> dict[str, Any]:
    """What ``venv_problems`` needs, read from the running interpreter's environment."""
    spec = importlib.util.find_spec("torch")
    torch = None
    if spec and spec.submodule_search_locations:
        path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
        if os.path.exists(path):
            torch = read_torch_version(path)
    dists = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}
    try:
        requires = importlib.metadata.requires("torch")
    except importlib.metadata.PackageNotFoundError:
        requires = []
    gpu_host = os.path.exists(expect.get("gpu_device_node") or "/dev/kfd")
    check_gpus = str(expect.get("torch_build")) == "rocm" and gpu_host and torch is not None and bool(torch.get("hip"))
    return {"torch": torch, "distributions": dists, "torch_requires": requirement_names(requires),
            "devices": _torch_devices() if check_gpus else None}


def main(argv: Sequence[str]) -> int:
    expect = json.loads(argv[1]) if len(argv) > 1 else {}
    facts = collect(expect)
    problems = venv_problems(expect, facts["torch"], facts["distributions"], facts["torch_requires"],
                             facts["devices"])
    print(json.dumps({"problems": problems, "facts": {k: v for k, v in facts.items() if k != "distributions"}}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
