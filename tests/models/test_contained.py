"""Issue 24, the models part: model inputs that cannot reach outside their place.

- Manifest paths that are absolute, hold ``..``, control characters or start with ``-`` are refused
  by the plan (whole-string checks: a trailing newline is not accepted), and hf gets ``--`` before
  the repository and the paths.
- Files of a model directory that resolve (symbolic links followed) outside it are refused, naming
  the file and the variable: on the controller by the plan (a sync from the controller) and by the
  manifest writer, on the host by tasks/contained.yml before anything of the model is copied.
- The download tool is installed from a requirements file with a sha256 for every package.

Real files and real symlinks in tmp dirs; the role's real tasks on localhost (connection local).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from plugins import load
from test_manifest import manifest, run_playbook

ROOT = Path(__file__).resolve().parents[2]
F = load("roles/models/filter_plugins/models.py")
DIR = "/srv/sglang/models"
SHA = "a" * 64
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n"


def entry(path: str, sha: str = SHA, size: int = 10) -> dict:
    return {"path": path, "sha256": sha, "size": size}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def problems(main: dict, models_dir: str = DIR) -> list[str]:
    return F.models_plan(main, None, models_dir)["problems"]


def sync_model(src: Path | str, files: list[dict], **kw) -> dict:
    return {"name": "main", "source": "sync", "sync_src": str(src), "manifest": files, **kw}


# --- manifest paths, names and hashes: whole-string checks -------------------------------------------
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("-rf", 'manifest path "-rf" must not start with "-" (the download tool would read it as an option)'),
        ("--help", 'manifest path "--help" must not start with "-"'),
        ("config.json\n", 'manifest path "config.json\\n" holds a control character'),
        ("a\x1b[2Jb", 'manifest path "a\\u001b[2Jb" holds a control character'),
        ("/etc/shadow", 'manifest path "/etc/shadow" must be relative, without ..'),
        ("sub/../../x", 'manifest path "sub/../../x" must be relative, without ..'),
        ("a//b", 'manifest path "a//b" must not hold empty or "." parts'),
        ("./a", 'manifest path "./a" must not hold empty or "." parts'),
    ],
)
def test_bad_manifest_paths_are_refused_naming_the_variable(path, expected):
    found = problems(sync_model("/src/main", [entry("ok.json"), entry(path)]))
    assert any(p.startswith(f"models_main: {expected}") for p in found), found
    assert len(found) == 1, found


def test_good_manifest_paths_pass():
    files = [entry("config.json"), entry("sub/model-00001-of-00002.safetensors"), entry(".gitattributes"),
             entry("a-b/c-d.bin")]
    assert problems(sync_model("/src/main", files)) == []


@pytest.mark.parametrize(
    ("main", "expected"),
    [
        (sync_model("/src/m", [entry("x", SHA + "\n")]), "manifest entry x needs a sha256 of 64 hex digits"),
        (sync_model("/src/m", [{"path": "x", "sha256": SHA, "size": "10\n"}]), "manifest entry x needs a size"),
        (sync_model("/src/m", [entry("x")], name="main\n"), 'models_main.name "main\n" must be a plain'),
        ({"name": "m", "source": "hf", "hf_repo_id": "o/m", "hf_revision": "0" * 40 + "\n", "manifest": [entry("x")]},
         "models_main.hf_revision must pin a commit"),
        ({"name": "m", "source": "hf", "hf_repo_id": "--help", "hf_revision": "0" * 40, "manifest": [entry("x")]},
         'models_main.hf_repo_id "--help" must be <org>/<model>'),
        ({"name": "m", "source": "http", "http_base_url": "http://h/m\r\nX-Injected: 1", "manifest": [entry("x")]},
         'models_main.http_base_url "http://h/m\\r\\nX-Injected: 1" holds a control character'),
        ({"name": "m", "source": "http", "manifest": [{**entry("x"), "url": "http://h/x\n"}]},
         'models_main: manifest entry x has a url with a control character: "http://h/x\\n"'),
        (sync_model("src/m", [entry("x")]), 'models_main.sync_src "src/m" must be an absolute path'),
        (sync_model("/src/m\n", [entry("x")]), 'models_main.sync_src "/src/m\\n" must be an absolute path'),
    ],
)
def test_trailing_newlines_and_options_elsewhere_are_refused(main, expected):
    found = problems(main)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    ("main", "expected"),
    [
        ({"name": "m", "source": "http", "http_base_url": "https://bob:pw-Models-4@127.0.0.4:9/m",
          "manifest": [entry("x")]},
         'models_main.http_base_url "https://127.0.0.4:9/m" carries a user:password@'),
        ({"name": "m", "source": "http", "manifest": [{**entry("x"), "url": "http://bob:pw-Models-4@127.0.0.4:9/x"}]},
         "models_main: manifest entry x has a url with a user:password@ (http://127.0.0.4:9/x)"),
    ],
)
def test_a_url_with_credentials_is_refused_without_repeating_them(main, expected):
    found = problems(main)
    assert any(expected in p for p in found), found
    assert "pw-Models-4" not in " ".join(found)


def test_models_dir_with_a_newline_is_refused():
    found = problems(sync_model("/src/m", [entry("x")]), "/srv/models\n")
    assert any('models_dir "/srv/models\\n" must be an absolute path' in p for p in found), found


def test_hf_gets_every_path_after_the_end_of_options():
    plan = F.models_plan({"name": "m", "source": "hf", "hf_repo_id": "org/m", "hf_revision": "0" * 40,
                          "manifest": [entry("b.bin"), entry("config.json")]}, None, DIR)
    assert plan["problems"] == []
    argv = F.models_hf_argv(plan["models"][0], "/opt/hf/bin/hf", 4)
    end = argv.index("--")
    assert argv[:end] == ["/opt/hf/bin/hf", "download", "--revision", "0" * 40, "--local-dir",
                          plan["models"][0]["staging"], "--max-workers", "4"]
    assert argv[end + 1:] == ["org/m", "b.bin", "config.json"]


# --- links out of a model directory, on the controller ------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """A model directory with a link out to a key, a linked directory out, and a link inside."""
    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_bytes(SECRET)
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_bytes(b"{}\n")
    (model / "sub" / "w.bin").write_bytes(b"weights")
    (model / "tokenizer.json").symlink_to(secret / "id_ed25519")
    (model / "linked").symlink_to(secret)
    (model / "alias.json").symlink_to("config.json")  # inside: fine
    # A sibling whose name starts with the model directory's: outside all the same.
    (tmp_path / "model-other").mkdir()
    (tmp_path / "model-other" / "k").write_bytes(SECRET)
    (model / "sibling.json").symlink_to(tmp_path / "model-other" / "k")
    return {"model": model, "secret": secret / "id_ed25519", "tmp": tmp_path}


def test_sync_from_the_controller_refuses_links_out(tree):
    model, secret = tree["model"], tree["secret"]
    files = [entry("config.json"), entry("sub/w.bin"), entry("alias.json"), entry("tokenizer.json"),
             entry("linked/id_ed25519")]
    found = problems(sync_model(model, files))
    assert len(found) == 2, found
    assert found[0] == (f'models_main: manifest file "linked/id_ed25519" resolves to {secret} on the controller, '
                        f"outside models_main.sync_src {model} (a symbolic link): model files must lie inside their "
                        "model directory; put the file itself there, or fix the manifest")
    assert found[1].startswith(f'models_main: manifest file "tokenizer.json" resolves to {secret} on the controller')
    # The same tree without the two links out is accepted; a sync_src that is itself a link is fine.
    assert problems(sync_model(model, files[:3])) == []
    sibling = problems(sync_model(model, [entry("sibling.json")]))
    assert sibling[0].startswith('models_main: manifest file "sibling.json" resolves to '
                                 f'{tree["tmp"] / "model-other" / "k"} on the controller'), sibling
    (tree["tmp"] / "model-link").symlink_to(model)
    assert problems(sync_model(tree["tmp"] / "model-link", files[:3])) == []


def test_a_host_side_source_is_left_to_the_host(tree):
    """sync_remote_src: the controller's files are not the ones copied; contained.yml checks the host's."""
    main = sync_model(tree["model"], [entry("tokenizer.json")], sync_remote_src=True)
    assert problems(main) == []


def test_resolved_outside_from_real_realpath_output(tree):
    model = tree["model"]
    files = [entry("config.json"), entry("tokenizer.json"), entry("alias.json"), entry("not-yet/there.bin"),
             entry("linked/id_ed25519"), entry("sibling.json")]
    argv = F.models_realpath_argv(files, str(model) + "/")
    assert argv[:4] == ["realpath", "-m", "--", str(model)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    bad = F.models_resolved_outside(out, [f["path"] for f in files])
    assert bad == [{"path": "tokenizer.json", "real": str(tree["secret"])},
                   {"path": "linked/id_ed25519", "real": str(tree["secret"])},
                   {"path": "sibling.json", "real": str(tree["tmp"] / "model-other" / "k")}]
    assert F.models_resolved_outside(out[:-1], ["x"])[0]["path"] == "?"


def test_the_manifest_writer_refuses_a_directory_with_a_link_out(tree):
    out = tree["tmp"] / "main.manifest.yml"
    result = manifest("-e", f"models_manifest_dir={tree['model']}", "-e", f"models_manifest_out={out}")
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert f"models_manifest_dir {tree['model']}: 4 file(s) resolve outside it (symbolic links)" in text
    assert (f"linked -> {tree['secret'].parent}; linked/id_ed25519 -> {tree['secret']}; "
            f"sibling.json -> {tree['tmp'] / 'model-other' / 'k'}; tokenizer.json -> {tree['secret']}.") in text
    assert "Nothing was written" in text
    assert not out.exists()
    # Without the links out, the same directory gives a manifest (find leaves the link inside out, as before).
    (tree["model"] / "tokenizer.json").unlink()
    (tree["model"] / "linked").unlink()
    (tree["model"] / "sibling.json").unlink()
    assert manifest("-e", f"models_manifest_dir={tree['model']}", "-e", f"models_manifest_out={out}").returncode == 0
    assert [f["path"] for f in yaml.safe_load(out.read_text())["files"]] == ["config.json", "sub/w.bin"]


# --- the real models role on localhost ----------------------------------------------------------------
def stage(tmp_path: Path, main: dict) -> subprocess.CompletedProcess:
    play = tmp_path / "stage.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}", "models_dir": str(tmp_path / "models"),
                 "models_main": main, "models_draft_enabled": False, "models_disk_margin_mb": 0},
        "roles": [{"role": "models"}],
    }]))
    return run_playbook(play)


def files_of(model: Path, names: list[str]) -> list[dict]:
    return [{"path": n, "sha256": sha((model / n).read_bytes()), "size": (model / n).stat().st_size} for n in names]


def test_host_side_source_with_a_link_out_is_refused_before_any_copy(tree, tmp_path):
    model = tree["model"]
    files = files_of(model, ["config.json", "sub/w.bin"])
    files.append({"path": "tokenizer.json", "sha256": sha(SECRET), "size": len(SECRET)})
    result = stage(tmp_path, sync_model(model, files, sync_remote_src=True))
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert (f"models_main (main): 1 manifest file(s) of models_main.sync_src on the host ({model}) resolve outside it: "
            f"tokenizer.json -> {tree['secret']}.") in text
    assert "Nothing was copied. Put the files themselves in" in text
    assert os.listdir(tmp_path / "models" / ".staging") == []
    assert os.listdir(tmp_path / "models" / ".store") == []


def test_host_side_source_inside_is_staged(tree, tmp_path):
    model = tree["model"]
    result = stage(tmp_path, sync_model(model, files_of(model, ["alias.json", "config.json", "sub/w.bin"]),
                                        sync_remote_src=True))
    assert result.returncode == 0, result.stdout[-3000:]
    (store,) = (tmp_path / "models" / ".store").iterdir()
    assert (store / "sub" / "w.bin").read_bytes() == b"weights"
    assert not (store / "alias.json").is_symlink()
    assert (store / "alias.json").read_bytes() == b"{}\n"


def test_a_staging_directory_with_a_link_out_is_not_written_through(tree, tmp_path):
    """A staging dir left by an earlier run, whose sub/ is a link out: refused before the copy, and
    nothing is written at the link's target."""
    model, outside = tree["model"], tmp_path / "outside"
    outside.mkdir()
    main = sync_model(model, files_of(model, ["config.json", "sub/w.bin"]), sync_remote_src=True)
    staging = Path(F.models_plan(main, None, str(tmp_path / "models"))["models"][0]["staging"])
    staging.mkdir(parents=True)
    (staging / "sub").symlink_to(outside)
    result = stage(tmp_path, main)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert (f"models_main (main): 1 manifest file(s) of the staging directory (left by an earlier run) ({staging}) "
            f"resolve outside it: sub/w.bin -> {outside}/w.bin.") in text
    assert f"Nothing was copied; the store copy is untouched. Remove {staging} and run again" in text
    assert os.listdir(outside) == []
    assert os.listdir(tmp_path / "models" / ".store") == []


def test_the_plan_refuses_a_bad_manifest_path_before_any_host_change(tmp_path):
    main = sync_model("/nonexistent", [entry("--help"), entry("config.json\n")])
    result = stage(tmp_path, main)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "roles/models: 2 problem(s) in the model variables" in text
    assert 'models_main: manifest path "--help" must not start with "-"' in text
    assert "holds a control character" in text
    assert not (tmp_path / "models").exists()


# --- the download tool: every package pinned with a hash ----------------------------------------------
REQUIREMENTS = ROOT / "roles/models/files/hf-requirements.txt"


def requirement_blocks(text: str) -> list[tuple[str, list[str]]]:
    """[(requirement line, [sha256, ...])] of a pip-compile/uv style requirements file."""
    blocks: list[tuple[str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            blocks[-1][1].append(line.split("=", 1)[1].rstrip(" \\"))
        else:
            blocks.append((line.rstrip(" \\"), []))
    return blocks


def test_every_requirement_is_pinned_with_a_sha256():
    defaults = yaml.safe_load((ROOT / "roles/models/defaults/main.yml").read_text())
    text = REQUIREMENTS.read_text()
    blocks = requirement_blocks(text)
    names = [re.split(r"[=;\s]", line)[0] for line, _ in blocks]
    assert {"huggingface-hub", "hf-xet", "httpx2", "typing-extensions"} <= set(names), names
    for line, hashes in blocks:
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*==[A-Za-z0-9.+!]+( ; .+)?", line), line
        assert hashes, line
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), (line, hashes)
    assert F.models_requirements_pin(text, "huggingface_hub") == defaults["models_hf_hub_version"]
    assert F.models_requirements_pin(text, "nothing-here") == ""


def test_the_install_task_requires_hashes():
    tasks = yaml.safe_load((ROOT / "roles/models/tasks/hf-tool.yml").read_text())
    (pip,) = [t["ansible.builtin.pip"] for t in tasks if "ansible.builtin.pip" in t]
    assert "name" not in pip
    assert pip["requirements"] == "{{ models_hf_venv }}/hf-requirements.txt"
    assert pip["extra_args"].startswith("{{ '--require-hashes' ~"), pip["extra_args"]
