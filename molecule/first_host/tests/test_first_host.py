"""After every case: the smoke left nothing on the host. No transient unit, no server process of
the simulator, nothing listening on the smoke's port, no temporary script of the checks."""

SERVER = "127.0.26.1"
PORT = 30990


def test_the_transient_unit_is_gone(host):
    show = host.run("systemctl show first-host-smoke.service --property=LoadState")
    assert show.stdout.strip() == "LoadState=not-found", host.run(
        "journalctl -u first-host-smoke.service --no-pager -n 40").stdout


def test_no_server_process_is_left(host):
    assert host.run("pgrep -f sglang_sim.launch_server").rc == 1


def test_nothing_listens_on_the_smoke_port(host):
    assert not host.socket(f"tcp://{SERVER}:{PORT}").is_listening


def test_the_venv_and_the_fixtures_are_unchanged(host):
    # The smoke only read them: the model directory holds what prepare.yml copied, current the image's release.
    assert host.file("/opt/sglang/current").is_symlink
    listing = host.run("ls /srv/first-host/models/demo-27b-w4a16").stdout.split()
    assert "config.json" in listing
    assert not host.file("/srv/first-host/models/no-such-model").exists
