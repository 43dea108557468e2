"""First-host smoke, layers 3 and 4, run with the venv's python (ansible.builtin.script, read-only).

  python first_host_gpu.py torch  --device-type cuda --timeout 180
  python first_host_gpu.py kernel --device-type cuda --module sgl_kernel --op silu_and_mul --timeout 300

Prints one JSON line with what it saw; the role's filters decide passed or failed. A check that hangs
(HIP initialisation on a card the driver half-bound) is ended by faulthandler after --timeout with
every thread's traceback on stderr (exit 1), so the report shows where it hung.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import sys
import traceback
from typing import Any

# op name → how torch computes the same thing on the first half/second half of the last dimension.
REFERENCES = {
    "silu_and_mul": lambda F, a, b: F.silu(a) * b,
    "gelu_and_mul": lambda F, a, b: F.gelu(a) * b,
    "gelu_tanh_and_mul": lambda F, a, b: F.gelu(a, approximate="tanh") * b,
}


def _error(stage: str, err: BaseException) -> dict[str, Any]:
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    return {"stage": stage, "error": f"{type(err).__name__}: {err}", "traceback": "".join(lines)[-3000:]}


def _device_module(torch: Any, device_type: str) -> Any:
    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "device_count"):
        raise ValueError(f"torch has no device type {device_type!r} with a device_count()")
    return module


def check_torch(device_type: str) -> dict[str, Any]:
    try:
        import torch
    except BaseException as err:  # an ImportError, or an OSError of a missing libamdhip64.so
        return _error("import torch", err)
    out: dict[str, Any] = {"torch": torch.__version__, "hip": getattr(torch.version, "hip", None),
                           "file": torch.__file__, "device_type": device_type}
    try:
        module = _device_module(torch, device_type)
        out["count"] = int(module.device_count())
        devices = []
        for index in range(out["count"]):
            device: dict[str, Any] = {"index": index, "name": device_type, "arch": None}
            if hasattr(module, "get_device_properties"):
                props = module.get_device_properties(index)
                device["name"] = getattr(props, "name", device_type)
                arch = getattr(props, "gcnArchName", None)
                device["arch"] = arch.split(":")[0] if arch else None
                device["total_memory"] = getattr(props, "total_memory", None)
            devices.append(device)
        out["devices"] = devices
    except BaseException as err:
        out.update(_error(f"torch.{device_type}", err))
    return out


def check_kernel(device_type: str, module_name: str, op: str, tolerance: float) -> dict[str, Any]:
    try:
        import torch
        import torch.nn.functional as F
    except BaseException as err:
        return _error("import torch", err)
    try:
        module = importlib.import_module(module_name)
    except BaseException as err:  # undefined symbol (torch ABI), missing libamdhip64.so, not installed
        return _error(f"import {module_name}", err)
    out: dict[str, Any] = {"module": module_name, "file": getattr(module, "__file__", None),
                           "version": getattr(module, "__version__", None), "op": op, "tolerance": tolerance}
    try:
        function = getattr(module, op)
        device = torch.device(device_type, 0) if device_type != "cpu" else torch.device("cpu")
        dtype = torch.float16 if device_type != "cpu" else torch.float32
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4, 2 * 128, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)
        y = function(x)
        if device_type != "cpu":
            _device_module(torch, device_type).synchronize()
        a, b = x.float().chunk(2, dim=-1)
        reference = REFERENCES[op](F, a, b)
        error = float((y.float() - reference).abs().max().item())
        out.update({"device": str(y.device), "shape": list(y.shape), "max_abs_err": round(error, 6),
                    "ok": error <= tolerance and list(y.shape) == list(reference.shape)})
    except BaseException as err:
        out.update(_error(f"{module_name}.{op}", err))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["torch", "kernel"])
    parser.add_argument("--device-type", default="cuda")
    parser.add_argument("--module", default="sgl_kernel")
    parser.add_argument("--op", default="silu_and_mul", choices=sorted(REFERENCES))
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    if args.check == "torch":
        result = check_torch(args.device_type)
    else:
        result = check_kernel(args.device_type, args.module, args.op, args.tolerance)
    faulthandler.cancel_dump_traceback_later()
    if "traceback" in result:
        sys.stderr.write(result["traceback"])
    print(json.dumps({k: v for k, v in result.items() if k != "traceback"}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
