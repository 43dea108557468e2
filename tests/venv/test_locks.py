"""The package sets' lock files (roles/sglang_venv/files/locks/, `make lock`): they agree with the
sets in the role's defaults, and every pin they take from PyPI still resolves for their target
(CPython 3.12, manylinux x86_64) with uv, without installing anything; a deliberately bad pin fails.
The resolution tests need uv (requirements/controller.txt) and PyPI, and skip saying which is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cred_index import Watcher, start_index, wheel
from plugins import ROOT, load
from procs import stop_by_pid

locks = load("scripts/lock_package_sets.py")
LOCK_FILES = sorted((ROOT / "roles/sglang_venv/files/locks").glob("*.txt"))
SETS = locks.package_sets()


def test_every_set_has_a_lock():
    assert sorted(p.stem for p in LOCK_FILES) == sorted(SETS)


@pytest.mark.parametrize("lock", LOCK_FILES, ids=[p.stem for p in LOCK_FILES])
def test_lock_agrees_with_its_package_set(lock):
    """Each exact pin of the set is in the lock at that version (else the set changed: make lock)."""
    text = lock.read_text()
    entries = locks.parse_lock(text)
    spec = SETS[lock.stem]
    missing_from_index = locks.header_value(text, "incomplete")
    from_torch = {locks.canonical(p) for p in spec["lock"].get("torch_packages", locks.TORCH_INDEX_PACKAGES)}
    for step in spec["steps"]:
        for req in step["packages"]:
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^;\s]+)", req)
            if not match:
                continue
            name = locks.canonical(match.group(1))
            if name in from_torch and missing_from_index:
                assert req in missing_from_index
                continue
            assert name in entries, f"{req} of set {lock.stem} is not in {lock.name}: run make lock"
            assert entries[name]["version"] == match.group(2), f"{lock.name} pins {name}=={entries[name]['version']}"
    assert all(e["hashes"] for e in entries.values()), "every pin carries its sha256 hashes"
    excluded = [locks.canonical(p) for p in spec["lock"].get("exclude", [])]
    assert not [n for n in excluded if n in entries], "an excluded package is in the lock"
    if spec.get("check", {}).get("torch_build") == "rocm":
        assert not [n for n in entries if re.match(r"^(nvidia-|cuda-)", n)], "CUDA packages in a ROCm lock"


@pytest.fixture(scope="module")
def uv():
    binary = locks.uv_binary()
    if not binary:
        pytest.skip("uv is not installed (requirements/controller.txt lists it; make setup installs it)")
    return binary


def _check(uv, path: Path):
    ok, message = locks.check_lock(uv, path)
    if ok is None:
        pytest.skip(f"offline, lock resolution not checked: {message}")
    return ok, message


@pytest.mark.slow
@pytest.mark.parametrize("lock", LOCK_FILES, ids=[p.stem for p in LOCK_FILES])
def test_lock_resolves_from_pypi(uv, lock):
    ok, message = _check(uv, lock)
    assert ok, message
    assert "pins from PyPI resolve for CPython 3.12" in message


@pytest.mark.slow
def test_a_bad_pin_fails(uv, tmp_path):
    lock = ROOT / "roles/sglang_venv/files/locks/rocm-gfx1100.txt"
    text = lock.read_text()
    assert re.search(r"^tokenizers==0\.23\.2 ", text, re.M)
    bad = tmp_path / "rocm-gfx1100.txt"
    bad.write_text(re.sub(r"^tokenizers==0\.23\.2 ", "tokenizers==0.23.99 ", text, flags=re.M))
    ok, message = _check(uv, bad)
    assert ok is False
    assert "tokenizers==0.23.99" in message
    assert "do not resolve" in message


@pytest.mark.slow
def test_a_changed_hash_fails(uv, tmp_path):
    lock = ROOT / "roles/sglang_venv/files/locks/test-minimal.txt"
    entries = locks.parse_lock(lock.read_text())
    first = sorted(entries["numpy"]["hashes"])[0]
    bad = tmp_path / "test-minimal.txt"
    bad.write_text(lock.read_text().replace(first, "0" * 64))
    ok, message = _check(uv, bad)
    assert ok is False
    assert "numpy==" in message
    assert "hashes are not what PyPI serves" in message


LOCK_PASSWORD = "pw/Lock 5Tn"  # noqa: S105 (a test password: its URL says pw%2FLock%205Tn)
LOCK_SECRETS = (LOCK_PASSWORD, "pw%2FLock%205Tn")


def test_the_mirror_comes_from_the_environment_or_the_defaults():
    mirror = f"https://dave:{LOCK_SECRETS[1]}@127.0.0.64:9/rocm/"
    spec = locks.package_sets(mirror=mirror)["rocm-gfx1100"]
    assert spec["lock"]["torch_find_links"] == mirror
    assert SETS["rocm-gfx1100"]["lock"]["torch_find_links"] == ""


def test_make_lock_gives_uv_the_mirror_credentials_in_a_netrc_file(uv, tmp_path, monkeypatch):
    """A find-links mirror with user:password@ (percent-encoded): uv's argv and the lock file name it
    without them, uv reads them from a netrc file (NETRC) and gets the wheel from a local index that
    answers only with basic auth; no process ever held the password, no netrc file is left."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "hfcred-torch", "0.0.1", "hfcred_torch", "V = 1\n")
    proc, port = start_index("127.0.0.64", "dave", LOCK_PASSWORD, wheels, tmp_path / "index.log")
    watcher = Watcher(LOCK_SECRETS)
    try:
        # Everything uv asks for goes to the local index (its default index too), never elsewhere.
        monkeypatch.setenv("UV_DEFAULT_INDEX", f"http://127.0.0.64:{port}/idx/")
        monkeypatch.setenv("TMPDIR", str(tmp_path))
        spec = {"steps": [{"packages": ["hfcred-torch==0.0.1"], "no_deps": False}],
                "lock": {"torch_find_links": f"http://dave:{LOCK_SECRETS[1]}@127.0.0.64:{port}/idx/hfcred-torch/",
                         "torch_packages": ["hfcred-torch"], "exclude": []}}
        watcher.start()
        text, summary = locks.lock_set(uv, "cred-test", spec)
    finally:
        watcher.stop.set()
        watcher.join()
        stop_by_pid(proc)
    assert "200 /files/hfcred_torch-0.0.1-py3-none-any.whl" in (tmp_path / "index.log").read_text()
    assert "hfcred-torch==0.0.1" in locks.parse_lock(text)["hfcred-torch"]["block"][0]
    assert f"# torch backend: http://127.0.0.64:{port}/idx/hfcred-torch/;" in text
    assert "# incomplete" not in text
    for secret in (*LOCK_SECRETS, "dave"):
        assert secret not in text + summary
    assert watcher.seen == []
    assert not list(tmp_path.rglob("netrc"))


def test_make_lock_refuses_a_mirror_url_it_cannot_give_uv_without_printing_the_password(uv):
    spec = {"steps": [{"packages": ["x==1"], "no_deps": False}],
            "lock": {"torch_find_links": "http://dave:pw/Lock@127.0.0.64:9/rocm/", "torch_packages": ["x"]}}
    with pytest.raises(SystemExit) as refused:
        locks.lock_set(uv, "cred-test", spec)
    assert "lock.torch_find_links of package set cred-test" in str(refused.value)
    assert "SGLANG_VENV_ROCM_TORCH_INDEX_URL" in str(refused.value)
    assert "pw/Lock" not in str(refused.value)
