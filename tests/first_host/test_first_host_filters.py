"""The first_host role's verdicts and report (roles/first_host/filter_plugins/first_host.py) on real
outputs: rocminfo of real Radeon hosts (tests/fixtures/rocminfo), stat's and the check scripts'
output as the role's tasks register it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "rocminfo"
fh = load("roles/first_host/filter_plugins/first_host.py")
ROCMINFO = ["timeout", "--kill-after=5", "60", "rocminfo"]


def rocminfo(name: str, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": (FIXTURES / name).read_text(), "stderr": ""}


# --- rocminfo -----------------------------------------------------------------------------------

def test_gpu_agents_are_numbered_without_the_cpu():
    agents = fh.first_host_rocminfo_agents((FIXTURES / "two-7900xtx.txt").read_text())
    assert [a["device_type"] for a in agents] == ["CPU", "GPU", "GPU"]
    gpus = [a for a in agents if a["device_type"] == "GPU"]
    assert [(a["agent"], a["hip_index"], a["name"]) for a in gpus] == [(2, 0, "gfx1100"), (3, 1, "gfx1100")]
    assert gpus[1]["uuid"] == "GPU-398a3f843a146602"
    assert "hip_index" not in agents[0]


def test_two_cards_pass():
    layer = fh.first_host_rocminfo_layer(rocminfo("two-7900xtx.txt"), 2, "gfx1100", ROCMINFO)
    assert layer["status"] == "passed", layer
    assert layer["summary"].startswith("2 x gfx1100; GPU agents: HIP 0: gfx1100 (Radeon RX 7900 XTX), HIP 1: gfx1100")
    assert layer["evidence"][0]["command"] == "timeout --kill-after=5 60 rocminfo"
    # The evidence keeps the lines the verdict read, not the whole listing.
    assert "Marketing Name:          Radeon RX 7900 XTX" in layer["evidence"][0]["output"]
    assert "Runtime Version" not in layer["evidence"][0]["output"]


def test_a_missing_card_fails_naming_the_count():
    layer = fh.first_host_rocminfo_layer(rocminfo("one-7900xtx-missing.txt"), 2, "gfx1100", ROCMINFO)
    assert layer["status"] == "failed"
    assert "1 GPU agent(s) of gfx1100, expected 2" in layer["summary"]
    assert "lspci -k" in layer["fix"]


def test_one_card_passes_when_one_is_expected():
    layer = fh.first_host_rocminfo_layer(rocminfo("one-7900xtx-missing.txt"), 1, "gfx1100", ROCMINFO)
    assert layer["status"] == "passed"


def test_an_igpu_before_the_cards_fails_unless_allowed():
    layer = fh.first_host_rocminfo_layer(rocminfo("igpu-first-two-7900xtx.txt"), 2, "gfx1100", ROCMINFO)
    assert layer["status"] == "failed"
    assert "1 GPU agent(s) of another kind (gfx1036 AMD Radeon Graphics)" in layer["summary"]
    assert "HIP 0: gfx1036" in layer["summary"]
    assert "disable an iGPU" in layer["fix"]
    allowed = fh.first_host_rocminfo_layer(rocminfo("igpu-first-two-7900xtx.txt"), 2, "gfx1100", ROCMINFO,
                                           allow_other_gpus=True)
    assert allowed["status"] == "passed"


def test_the_wrong_arch_fails():
    layer = fh.first_host_rocminfo_layer(rocminfo("two-7900xtx.txt"), 2, "gfx1101", ROCMINFO)
    assert layer["status"] == "failed"
    assert "0 GPU agent(s) of gfx1101, expected 2" in layer["summary"]


def test_rocminfo_not_installed_timed_out_or_failing():
    missing = {"rc": 127, "stdout": "",
               "stderr": "timeout: failed to run command 'rocminfo': No such file or directory"}
    layer = fh.first_host_rocminfo_layer(missing, 2, "gfx1100", ROCMINFO)
    assert layer["status"] == "failed"
    assert "failed to run command 'rocminfo'" in layer["summary"]
    hung = {"rc": 124, "stdout": "ROCk module is loaded\n", "stderr": ""}
    assert "timed out" in fh.first_host_rocminfo_layer(hung, 2, "gfx1100", ROCMINFO)["summary"]
    denied = {"rc": 1, "stdout": "", "stderr": "hsa api call failure at: rocminfo.cc:1306\nPermission denied"}
    layer = fh.first_host_rocminfo_layer(denied, 2, "gfx1100", ROCMINFO)
    assert "rocminfo exited 1" in layer["summary"]
    assert "Permission denied" in layer["evidence"][0]["output"]
    never = {"rc": 2, "stdout": "", "stderr": "", "msg": "[Errno 2] No such file or directory: b'timeout'"}
    assert "did not run" in fh.first_host_rocminfo_layer(never, 2, "gfx1100", ROCMINFO)["summary"]


# --- driver -------------------------------------------------------------------------------------

DRIVER = ["stat", "--format=%F|%n", "/sys/module/amdgpu", "/dev/kfd"]


def test_driver_loaded_and_kfd_present():
    result = {"rc": 0, "stdout": "directory|/sys/module/amdgpu\ncharacter special file|/dev/kfd", "stderr": ""}
    layer = fh.first_host_driver_layer(result, "amdgpu", "/dev/kfd", DRIVER)
    assert layer["status"] == "passed"
    assert layer["evidence"][0]["command"] == "stat '--format=%F|%n' /sys/module/amdgpu /dev/kfd"


def test_driver_missing_names_both_paths():
    result = {"rc": 1, "stdout": "",
              "stderr": "stat: cannot statx '/sys/module/amdgpu': No such file or directory\n"
                        "stat: cannot statx '/dev/kfd': No such file or directory"}
    layer = fh.first_host_driver_layer(result, "amdgpu", "/dev/kfd", DRIVER)
    assert layer["status"] == "failed"
    assert layer["summary"] == ("the amdgpu module is not loaded (/sys/module/amdgpu is missing); "
                                "/dev/kfd does not exist")
    assert "cannot statx '/dev/kfd'" in layer["evidence"][0]["output"]
    assert "modprobe amdgpu" in layer["fix"]


def test_kfd_that_is_not_a_device_fails():
    result = {"rc": 0, "stdout": "directory|/sys/module/amdgpu\nregular file|/dev/kfd", "stderr": ""}
    layer = fh.first_host_driver_layer(result, "amdgpu", "/dev/kfd", DRIVER)
    assert layer["status"] == "failed"
    assert "/dev/kfd is a regular file" in layer["summary"]


# --- torch and kernel ---------------------------------------------------------------------------

TORCH = ["/opt/sglang/current/bin/python", "first_host_gpu.py", "torch"]


def script(data: dict | None, rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": (json.dumps(data) + "\n") if data is not None else "", "stderr": stderr}


def rocm_torch(*archs: str) -> dict:
    return {"torch": "2.9.1+rocm7.2.1", "hip": "7.2.53211", "device_type": "cuda", "count": len(archs),
            "devices": [{"index": i, "name": "Radeon RX 7900 XTX", "arch": a} for i, a in enumerate(archs)]}


def test_torch_sees_two_gfx1100():
    layer = fh.first_host_torch_layer(script(rocm_torch("gfx1100", "gfx1100")), 2, "cuda", "gfx1100", TORCH)
    assert layer["status"] == "passed"
    assert layer["summary"].startswith("torch 2.9.1+rocm7.2.1 (HIP 7.2.53211) sees 2 cuda device(s), each gfx1100")


def test_torch_with_one_card_or_a_wrong_arch_fails():
    layer = fh.first_host_torch_layer(script(rocm_torch("gfx1100")), 2, "cuda", "gfx1100", TORCH)
    assert layer["status"] == "failed"
    assert "torch.cuda.device_count() = 1, expected 2" in layer["summary"]
    layer = fh.first_host_torch_layer(script(rocm_torch("gfx1036", "gfx1100")), 2, "cuda", "gfx1100", TORCH)
    assert "1 device(s) not gfx1100: 0: gfx1036" in layer["summary"]


def test_cpu_torch_sees_no_cards_but_its_cpu():
    cpu = {"torch": "2.13.0+cpu", "hip": None, "device_type": "cuda", "count": 0, "devices": []}
    layer = fh.first_host_torch_layer(script(cpu), 2, "cuda", "gfx1100", TORCH)
    assert layer["status"] == "failed"
    assert layer["summary"].startswith("torch 2.13.0+cpu (no HIP): torch.cuda.device_count() = 0, expected 2")
    on_cpu = {"torch": "2.13.0+cpu", "hip": None, "device_type": "cpu", "count": 1,
              "devices": [{"index": 0, "name": "cpu", "arch": None}]}
    layer = fh.first_host_torch_layer(script(on_cpu), 1, "cpu", "", TORCH)
    assert layer["status"] == "passed"
    assert "arch not checked" in layer["summary"]
    # An arch expected of devices that report none fails.
    assert fh.first_host_torch_layer(script(on_cpu), 1, "cpu", "gfx1100", TORCH)["status"] == "failed"


def test_torch_that_cannot_import_hangs_or_has_no_python():
    broken = {"stage": "import torch", "error": "OSError: libamdhip64.so.7: cannot open shared object file"}
    layer = fh.first_host_torch_layer(script(broken, stderr="Traceback ..."), 2, "cuda", "gfx1100", TORCH)
    assert layer["summary"] == "import torch failed: OSError: libamdhip64.so.7: cannot open shared object file"
    hung = script(None, rc=1, stderr="Timeout (0:03:00)!\nThread 0x1 (most recent call first):\n  File \"x.py\"")
    assert "timed out" in fh.first_host_torch_layer(hung, 2, "cuda", "gfx1100", TORCH)["summary"]
    no_python = script(None, rc=127, stderr="/bin/sh: 1: /opt/sglang/current/bin/python: not found")
    layer = fh.first_host_torch_layer(no_python, 2, "cuda", "gfx1100", TORCH)
    assert layer["summary"] == "the check crashed: /opt/sglang/current/bin/python was not found"


KERNEL = ["/opt/sglang/current/bin/python", "first_host_gpu.py", "kernel"]


def test_kernel_op_matches_or_not():
    ran = {"module": "sgl_kernel", "version": "0.4.6.post1", "op": "silu_and_mul", "device": "cuda:0",
           "shape": [4, 128], "max_abs_err": 0.000977, "tolerance": 0.01, "ok": True}
    layer = fh.first_host_kernel_layer(script(ran), "sgl_kernel", "silu_and_mul", KERNEL)
    assert layer["status"] == "passed"
    assert "silu_and_mul on cuda:0 [4, 128] matches torch" in layer["summary"]
    wrong = {**ran, "max_abs_err": 3.5, "ok": False}
    layer = fh.first_host_kernel_layer(script(wrong), "sgl_kernel", "silu_and_mul", KERNEL)
    assert layer["status"] == "failed"
    assert "differs from torch's reference (max abs error 3.5 > 0.01)" in layer["summary"]


def test_kernel_built_for_another_torch():
    abi = {"stage": "import sgl_kernel",
           "error": "ImportError: common_ops.so: undefined symbol: _ZN3c1013MessageLoggerC1EPKcii"}
    layer = fh.first_host_kernel_layer(script(abi), "sgl_kernel", "silu_and_mul", KERNEL)
    assert layer["status"] == "failed"
    assert "undefined symbol" in layer["summary"]
    assert "first_host_skip_layers: [kernel]" in layer["fix"]


# --- server and probe ---------------------------------------------------------------------------

URL = "http://127.0.0.1:30990/health_generate"
START = ["systemd-run", "--unit=first-host-smoke.service", "--", "python", "-m", "sglang.launch_server"]
JOURNAL = ["journalctl", "--unit=first-host-smoke.service"]
FREE = script({"free": True, "detail": "nothing listens on 127.0.0.1:30990"})


def server(port=FREE, start=None, wait=None, journal=None):
    return fh.first_host_server_layer(port, start or {"rc": 0, "stdout": "", "stderr": ""}, wait or {},
                                      journal or {"rc": 0, "stdout": "", "stderr": ""}, START, URL,
                                      "first-host-smoke.service", JOURNAL)


def test_server_healthy():
    layer = server(wait=script({"healthy": True, "waited_s": 41.5, "timeout_s": 600, "interval_s": 2}),
                   journal={"rc": 0, "stdout": "The server is fired up and ready to roll!", "stderr": ""})
    assert layer["status"] == "passed"
    assert layer["summary"] == f"first-host-smoke.service answered {URL} with 200 after 41.5 s"
    assert [e["command"].split()[0] for e in layer["evidence"]] == ["systemd-run", "GET", "journalctl"]
    assert "fired up" in layer["evidence"][2]["output"]


def test_server_that_died_keeps_its_log_lines():
    log = "\n".join(f"line {i}" for i in range(100)) + "\nRuntimeError: Not enough memory."
    layer = server(wait=script({"healthy": False, "ended": True, "state": "LoadState=not-found ActiveState=inactive",
                                "timeout_s": 600}),
                   journal={"rc": 0, "stdout": log, "stderr": ""})
    assert layer["status"] == "failed"
    assert layer["summary"].startswith("first-host-smoke.service ended before it was healthy")
    output = layer["evidence"][2]["output"]
    assert output.endswith("RuntimeError: Not enough memory.")
    assert "lines left out" in output
    assert len(output.splitlines()) == 41


def test_server_never_healthy_and_port_taken_and_start_refused():
    layer = server(wait=script({"healthy": False, "ended": False, "timeout_s": 600, "last_error": "HTTP 503"}))
    assert layer["summary"].startswith(f"{URL} did not answer 200 within 600 s (last: HTTP 503)")
    taken = server(port=script({"free": False, "detail": "something accepts connections on 127.0.0.1:30990"}))
    assert taken["status"] == "failed"
    assert "the smoke would probe another server" in taken["summary"]
    assert [e["command"] for e in taken["evidence"]] == ["connect 127.0.0.1:30990"]
    refused = server(start={"rc": 1, "stdout": "", "stderr": "Failed to start transient service unit: Unit "
                                                               "first-host-smoke.service already exists."})
    assert refused["summary"] == "systemd-run could not start first-host-smoke.service"
    assert "already exists" in refused["evidence"][0]["output"]


def test_probe_passes_or_names_its_reasons():
    good = {"msg": "cold 120 ms, warm device 9 ms", "gate": {"passed": True, "reasons": []},
            "cold": {"median_ttft_ms": 120.0}, "warm": {"device": {"median_ttft_ms": 9.0}}}
    layer = fh.first_host_probe_layer(good, "http://127.0.0.1:30990", 2048, "device")
    assert layer["status"] == "passed"
    assert layer["summary"] == "cold TTFT 120.0 ms, warm device 9.0 ms; the warm read came from the cache"
    bad = {"msg": "gate failed", "gate": {"passed": False, "reasons": ["warm device: 0 of 2048 tokens cached"]}}
    assert fh.first_host_probe_layer(bad, "u", 2048, "device")["summary"] == "warm device: 0 of 2048 tokens cached"
    error = {"msg": "POST /generate answered 500"}
    assert fh.first_host_probe_layer(error, "u", 2048, "device")["summary"] == "POST /generate answered 500"


# --- the report ---------------------------------------------------------------------------------

def passed(name: str) -> dict:
    return fh._layer(name, True, f"{name} ok", [{"command": name, "rc": 0, "output": "fine"}])


def failed(name: str) -> dict:
    return fh._layer(name, False, f"{name} broke", [{"command": name, "rc": 1, "output": "bad"}], f"fix {name}")


META = {"host": "gpu-1", "time": "20261201T000000Z", "inventory": "inventories/prod"}


def test_report_marks_later_layers_not_reached():
    report = fh.first_host_report([passed("driver"), failed("rocminfo")], META)
    assert [layer["status"] for layer in report["layers"]] == ["passed", "failed"] + ["not reached"] * 4
    assert report["first_failed"] == "rocminfo"
    assert report["passed"] is False
    assert report["verdict"] == "failed at layer 2 (rocminfo): rocminfo broke"
    md = fh.first_host_report_md(report)
    assert "First failed layer: **rocminfo**. Fix: fix rocminfo" in md
    assert "| 3 | torch | the venv's torch sees the cards | not reached | not reached: rocminfo failed first |" in md
    assert "## 2. rocminfo: **FAILED**" in md
    assert "## 3." not in md


def test_report_all_passed_skipped_and_check_mode():
    layers = [passed(n) for n in ("driver", "rocminfo", "torch", "server", "probe")]
    report = fh.first_host_report(fh.first_host_skipped_layers(["kernel"]) + layers, META)
    assert [layer["status"] for layer in report["layers"]] == ["passed"] * 3 + ["skipped"] + ["passed"] * 2
    assert report["passed"]
    assert report["verdict"] == "passed, with layers skipped: kernel"
    everything = fh.first_host_report([passed(n) for n in fh.NAMES], META)
    assert everything["verdict"] == "passed: every layer"
    check = [passed(n) for n in ("driver", "rocminfo", "torch", "kernel")] + [
        fh.first_host_skipped_layer("server", "check mode", ["systemd-run --unit=x"]),
        fh.first_host_skipped_layer("probe", "check mode", ["sglang_cache_probe url=u"])]
    report = fh.first_host_report(check, META)
    assert report["verdict"].startswith("check mode:")
    assert "| 5 | server | the server starts and answers its health check | not run (check mode) |" \
        in fh.first_host_report_md(report)


def test_skipping_the_server_skips_the_probe():
    assert [e["name"] for e in fh.first_host_skipped_layers(["server"])] == ["server", "probe"]
    assert fh.first_host_go(fh.first_host_skipped_layers(["kernel", "server"]))
    assert not fh.first_host_go([failed("driver")])


def test_an_unexpected_error_fails_the_report():
    report = fh.first_host_report([passed("driver")], {**META, "error": {"task": "Torch | x", "msg": "boom"}})
    assert report["passed"] is False
    assert report["verdict"] == "the smoke itself failed in task 'Torch | x': boom"


def test_cleanup_says_whether_the_unit_is_gone():
    gone = fh.first_host_cleanup({"rc": 5, "stderr": "Unit first-host-smoke.service not loaded."},
                                 {"rc": 0, "stdout": "LoadState=not-found\nActiveState=inactive\nSubState=dead"},
                                 "first-host-smoke.service")
    assert gone["gone"] is True
    left = fh.first_host_cleanup({"rc": 1}, {"rc": 0, "stdout": "LoadState=loaded\nActiveState=deactivating"},
                                 "first-host-smoke.service")
    assert left["gone"] is False
    report = fh.first_host_report([passed("driver")], META, left)
    assert "**still loaded**" in fh.first_host_report_md(report)


def test_systemd_run_argv():
    argv = fh.first_host_systemd_run("first-host-smoke.service", "/opt/sglang/current/bin/python",
                                     "sglang.launch_server", "/srv/m", "127.0.0.1", 30990, ["--tp-size", 1],
                                     ["DynamicUser=yes"], {"B": "2", "A": "1"}, 1800, 60)
    assert argv[:4] == ["systemd-run", "--unit=first-host-smoke.service", "--collect", "--quiet"]
    assert "--property=RuntimeMaxSec=1800" in argv
    assert "--property=DynamicUser=yes" in argv
    assert argv[argv.index("--setenv=A=1") + 1] == "--setenv=B=2"
    assert argv[argv.index("--"):] == ["--", "/opt/sglang/current/bin/python", "-m", "sglang.launch_server",
                                       "--model-path", "/srv/m", "--host", "127.0.0.1", "--port", "30990",
                                       "--tp-size", "1"]


@pytest.mark.parametrize(("address", "loopback"), [("127.0.0.1", True), ("127.0.26.1", True), ("::1", True),
                                                    ("[::1]", True), ("10.0.0.5", False), ("0.0.0.0", False),  # noqa: S104
                                                    ("localhost", False)])
def test_the_server_binds_loopback_only(address, loopback):
    assert fh.first_host_is_loopback(address) is loopback


def test_trim_keeps_head_and_tail():
    text = "\n".join(str(i) for i in range(10))
    assert fh.first_host_trim(text, 4).splitlines() == ["0", "1", "… (6 lines left out) …", "8", "9"]
    assert fh.first_host_trim(text, 40) == text
    assert fh.first_host_trim(None) == ""
