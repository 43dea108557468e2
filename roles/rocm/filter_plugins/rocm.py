"""Filters of the rocm role: the desired ROCm release as data, its id, and what activating it changes.

A release is a small dict computed on the controller from the inventory:
  distro: {"source": "distro", "packages": {"rocminfo": None, "librocm-smi-dev": "5.2.3-2"}}
  amd:    {"source": "amd", "version": "7.1.1", "amdgpu_version": "30.20.1", "suite": "noble",
           "repositories": [...], "driver": ["amdgpu-dkms"], "packages": {"amdgpu-dkms": None, "rocm": None}}
A package's version None means "any version the source offers" (distro: whatever is installed is
kept; amd: the version of the pinned repository, so a repository change is an upgrade or a downgrade).

The GPU mapping (rocm_agents, rocm_gpu_map) reads `rocminfo` output: HIP device indices, as
HIP_VISIBLE_DEVICES names them, count the GPU agents only, in rocminfo's order (the "Agent N" number
counts CPUs too and is never a device index).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain pytest without ansible-core on the path
    AnsibleFilterError = ValueError  # type: ignore[assignment,misc]

_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


def rocm_package_specs(specs: list[str], variable: str = "rocm_distro_packages") -> dict[str, str | None]:
    """`name` or `name=version` (apt's syntax) → {name: version or None}."""
    packages: dict[str, str | None] = {}
    for spec in specs or []:
        name, sep, version = str(spec).strip().partition("=")
        name, version = name.strip(), version.strip()
        if not _NAME.match(name) or (sep and not version):
            raise AnsibleFilterError(
                f"{variable}: {spec!r} is not a Debian package name or name=version (e.g. rocminfo=5.2.3-2)"
            )
        if name in packages:
            raise AnsibleFilterError(f"{variable}: {name} is listed twice")
        packages[name] = version or None
    return packages


# scheme://user[:password]@host/path: the credentials of a mirror.
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@\s]*)@(.*)$")


def _credentials(uri: Any) -> tuple[str, str, str, str] | None:
    """(uri without credentials, apt's machine (host/path), login, password), or None without."""
    match = _USERINFO.match(str(uri))
    if not match:
        return None
    scheme, userinfo, rest = match.groups()
    login, _, password = userinfo.partition(":")
    return f"{scheme}{rest}", rest.rstrip("/"), login, password


def rocm_uri_public(uri: Any) -> Any:
    """A repository URI without its user:password@ (which goes to apt's auth.conf.d instead)."""
    found = _credentials(uri)
    return uri if found is None else found[0]


def rocm_repositories(repositories: list[dict[str, Any]], suite: str) -> list[dict[str, Any]]:
    """rocm_amd_repositories with every field filled in (suite, components), as a release records them.

    A URI's credentials are left out: the release is a fact (printed at -v, kept in the facts cache)
    and a record on the host (rocm-release.json, 0644); apt reads them from
    /etc/apt/auth.conf.d/ (rocm_apt_auth, 0600) instead."""
    return [
        {
            "name": repo["name"],
            "uris": rocm_uri_public(repo["uris"]),
            "suites": repo.get("suites") or suite,
            "components": list(repo.get("components") or ["main"]),
        }
        for repo in repositories or []
    ]


def rocm_apt_auth(repositories: list[dict[str, Any]]) -> str:
    """apt's auth.conf (apt_auth.conf(5)) for the repositories whose URI carries credentials:
    `machine <host/path> login <user> password <password>`, one per line; "" when none does."""
    lines = []
    for repo in repositories or []:
        found = _credentials(repo.get("uris", ""))
        if found is not None:
            _public, machine, login, password = found
            lines.append(f"machine {machine} login {login} password {password}")
    return "".join(f"{line}\n" for line in dict.fromkeys(lines))


def rocm_release_id(release: dict[str, Any]) -> str:
    """Short stable id of a release: sha256 of its canonical JSON, 12 hex digits."""
    canonical = json.dumps(release, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def rocm_installed(stdout: str) -> dict[str, str]:
    """dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' → {name: version} of installed ones."""
    installed: dict[str, str] = {}
    for line in (stdout or "").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].startswith("ii"):
            installed[parts[0].split(":")[0]] = parts[2].strip()
    return installed


def rocm_offered(stdout: str, uris: list[str] | None = None) -> dict[str, list[str]]:
    """apt-cache madison output → {name: [versions, best first]}; only from `uris` when given."""
    offered: dict[str, list[str]] = {}
    prefixes = [u.rstrip("/") for u in uris or []]
    for line in (stdout or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 3:
            continue
        name, version, source = parts[0], parts[1], parts[2]
        if prefixes and not any(source.startswith(p + "/") or source.startswith(p + " ") for p in prefixes):
            continue
        versions = offered.setdefault(name, [])
        if version not in versions:
            versions.append(version)
    return offered


def rocm_wanted(release: dict[str, Any], offered: dict[str, list[str]]) -> dict[str, str | None]:
    """Each package's wanted version: the pinned one; for the amd source an unpinned package takes the
    version its (pinned) repository offers. None: any installed version will do (distro)."""
    wanted: dict[str, str | None] = {}
    for name, version in (release.get("packages") or {}).items():
        if version is None and release.get("source") == "amd":
            version = (offered.get(name) or [None])[0]
        wanted[name] = version
    return wanted


def rocm_changes(wanted: dict[str, str | None], installed: dict[str, str]) -> dict[str, str | None]:
    """The packages activating the release installs or moves to another version (and the version)."""
    return {
        name: version
        for name, version in sorted(wanted.items())
        if installed.get(name) is None or (version is not None and version != installed[name])
    }


def rocm_activation_plan(wanted: dict[str, str | None], installed: dict[str, str]) -> list[str]:
    """What activating the release changes, one line per package; empty: nothing to activate."""
    return [
        f"{name}: install {version or 'the archive version'}" if name not in installed
        else f"{name}: {installed[name]} -> {version}"
        for name, version in rocm_changes(wanted, installed).items()
    ]


def rocm_unavailable(wanted: dict[str, str | None], installed: dict[str, str],
                     offered: dict[str, list[str]]) -> list[str]:
    """Packages whose wanted version apt cannot install: neither installed at it nor in the archive."""
    missing = []
    for name, version in sorted(wanted.items()):
        if installed.get(name) is not None and (version is None or installed[name] == version):
            continue
        if version is None and not offered.get(name):
            missing.append(name)
        elif version is not None and version not in offered.get(name, []):
            missing.append(name)
    return missing


def rocm_unavailable_notes(missing: list[str], wanted: dict[str, str | None], installed: dict[str, str],
                           offered: dict[str, list[str]]) -> list[str]:
    """One sentence per package apt cannot bring to the wanted version: what stays and why."""
    notes = []
    for name in missing:
        want = f"{name}={wanted[name]}" if wanted.get(name) else name
        offer = ", ".join(offered.get(name, [])) or "none"
        stays = f"{installed[name]} stays installed" if name in installed else "it stays uninstalled"
        notes.append(f"{want}: apt cannot install it (versions offered: {offer}); {stays}")
    return notes


def rocm_apt_names(wanted: dict[str, str | None], only: list[str] | None = None,
                   skip: list[str] | None = None) -> list[str]:
    """apt names (`name` or `name=version`), only of the `only` packages when given, without the `skip` ones."""
    return [
        name if version is None else f"{name}={version}"
        for name, version in sorted(wanted.items())
        if (only is None or name in only) and name not in (skip or [])
    ]


_AGENT_HEADER = re.compile(r"^\*+[ \t]*\n[ \t]*Agent[ \t]+(\d+)[ \t]*\n\*+[ \t]*$", re.M)
_FIELD = re.compile(r"^([ \t]*)([A-Za-z][A-Za-z0-9 .()/-]*?):[ \t]*(.*?)[ \t]*$")
_FIELDS = {"Name": "name", "Uuid": "uuid", "Marketing Name": "marketing_name", "Device Type": "device_type",
           "Node": "node", "BDFID": "bdfid", "Chip ID": "chip_id", "Compute Unit": "compute_units"}
# Variables that also mask or renumber GPUs for HIP; the mapping reads HIP_VISIBLE_DEVICES only.
_OTHER_MASKS = ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def _bdf(bdfid: str | None) -> str:
    """rocminfo's BDFID (bus << 8 | device << 3 | function, decimal) as a PCI address, e.g. 2304 → 09:00.0."""
    if not bdfid or not bdfid.isdigit() or int(bdfid) == 0:
        return ""
    value = int(bdfid)
    return f"{value >> 8:02x}:{(value >> 3) & 0x1F:02x}.{value & 0x7}"


def rocm_agents(stdout: str) -> list[dict[str, Any]]:
    """rocminfo output → its agents in order, each {agent, name, uuid, marketing_name, device_type, node,
    bdf, chip_id, compute_units}; GPU agents also get `hip_index` (0, 1, ... in rocminfo's order)."""
    text = stdout or ""
    headers = list(_AGENT_HEADER.finditer(text))
    agents: list[dict[str, Any]] = []
    for n, header in enumerate(headers):
        body = text[header.end():headers[n + 1].start() if n + 1 < len(headers) else len(text)]
        agent: dict[str, Any] = {"agent": int(header.group(1))}
        indent = None
        for line in body.splitlines():
            match = _FIELD.match(line)
            if not match:
                continue
            # The agent's own fields share the first field's indentation; deeper ones (ISA Info, Pool
            # Info) repeat names like "Name:" and are not the agent's.
            if indent is None:
                indent = match.group(1)
            if match.group(1) != indent:
                continue
            key = _FIELDS.get(match.group(2).strip())
            if key and key not in agent:
                agent[key] = match.group(3)
        agent["device_type"] = agent.get("device_type", "").upper()
        agent["bdf"] = _bdf(agent.pop("bdfid", None))
        agents.append(agent)
    index = 0
    for agent in agents:
        if agent["device_type"] == "GPU":
            agent["hip_index"] = index
            index += 1
    return agents


def _describe(gpu: dict[str, Any]) -> str:
    where = f", PCI {gpu['bdf']}" if gpu.get("bdf") else ""
    return f"HIP device {gpu['hip_index']} = {gpu.get('name', '?')} ({gpu.get('marketing_name', '?')}{where})"


def _tp_size(instance: dict[str, Any], default: Any) -> int | None:
    value = instance.get("tp_size")
    if value is None:
        value = (instance.get("args") or {}).get("--tp-size")
    if value is None:
        value = default
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def rocm_gpu_map(stdout: str, instances: list[dict[str, Any]] | None, arch: str = "gfx1100",
                 tp_size: Any = None, environment: dict[str, Any] | None = None) -> dict[str, Any]:
    """Map each instance's HIP_VISIBLE_DEVICES to rocminfo's GPU agents and say what is wrong.

    instances: as sglang_service_instances lists them ({name, environment: {HIP_VISIBLE_DEVICES},
    args: {--tp-size}}, optional tp_size); tp_size: the TP size of an instance that names none;
    environment: what every instance's environment starts from (the instance's own wins).
    Returns {gpus: [GPU agents], instances: [{name, hip_visible_devices, devices, tp_size, problems}],
    problems: [every problem, one sentence each, naming the variable and the fix],
    mapping: {instance name: [HIP device indices it sees]}}.
    An unset HIP_VISIBLE_DEVICES makes every GPU agent visible, as HIP does.
    """
    gpus = [agent for agent in rocm_agents(stdout) if agent["device_type"] == "GPU"]
    matching = [gpu["hip_index"] for gpu in gpus if gpu.get("name") == arch]
    listed = "; ".join(_describe(gpu) for gpu in gpus) or "none"
    result: list[dict[str, Any]] = []
    problems: list[str] = []
    users: dict[int, list[str]] = {}
    for instance in instances or []:
        name = str(instance.get("name", "?"))
        env = dict(environment or {})
        env.update(instance.get("environment") or {})
        tp = _tp_size(instance, tp_size)
        spec = env.get("HIP_VISIBLE_DEVICES")
        mine: list[str] = []
        devices: list[dict[str, Any]] = []
        fix = ",".join(str(i) for i in matching[:tp]) if tp and len(matching) >= tp else ""
        fix_hint = (f'; set HIP_VISIBLE_DEVICES: "{fix}" in its environment (sglang_service_instances)' if fix
                    else f"; rocminfo lists {len(matching)} x {arch}: check the cards and the amdgpu driver (dmesg)")
        for other in _OTHER_MASKS:
            if other in env:
                mine.append(f"{other} is set ({env[other]!r}); it masks or renumbers GPUs before HIP does, so this "
                            f"check cannot map the devices: remove it and name the GPUs with HIP_VISIBLE_DEVICES only")
        if tp is None or tp < 1:
            given = instance.get("tp_size", (instance.get("args") or {}).get("--tp-size", tp_size))
            mine.append(f"its TP size {given!r} is not a whole number >= 1 "
                        "(--tp-size in the instance's args, or rocm_gpu_tp_size)")
        if spec is None:
            devices = list(gpus)
            shown = "unset (every GPU agent is visible)"
        else:
            shown = f'"{spec}"'
            tokens = [t.strip() for t in str(spec).split(",")]
            if tokens == [""]:
                tokens = []
            seen: set[int] = set()
            for token in tokens:
                if token.isdigit():
                    index = int(token)
                    if index >= len(gpus):
                        mine.append(f"HIP_VISIBLE_DEVICES={shown} names HIP device {index}, which does not exist: "
                                    f"rocminfo lists {len(gpus)} GPU agent(s) ({listed}){fix_hint}")
                        continue
                    gpu = gpus[index]
                elif token.upper().startswith("GPU-") and any(g.get("uuid") == token for g in gpus):
                    gpu = next(g for g in gpus if g.get("uuid") == token)
                else:
                    mine.append(f"HIP_VISIBLE_DEVICES={shown}: {token!r} is neither a HIP device index nor the "
                                f"Uuid of a GPU agent rocminfo lists ({listed}){fix_hint}")
                    continue
                if gpu["hip_index"] in seen:
                    mine.append(f"HIP_VISIBLE_DEVICES={shown} names HIP device {gpu['hip_index']} twice{fix_hint}")
                    continue
                seen.add(gpu["hip_index"])
                devices.append(gpu)
            if not tokens:
                mine.append(f"HIP_VISIBLE_DEVICES is empty, which hides every GPU{fix_hint}")
        for gpu in devices:
            if gpu.get("name") != arch:
                mine.append(f"HIP_VISIBLE_DEVICES {shown} makes {_describe(gpu)} visible, which is not a {arch}"
                            f"{fix_hint}")
        visible = [gpu for gpu in devices if gpu.get("name") == arch]
        if tp is not None and tp >= 1 and len(visible) != tp:
            mine.append(f"TP size {tp} needs {tp} visible {arch} device(s); HIP_VISIBLE_DEVICES {shown} makes "
                        f"{len(visible)} visible ({'; '.join(_describe(g) for g in visible) or 'none'}){fix_hint}")
        for gpu in devices:
            users.setdefault(gpu["hip_index"], []).append(name)
        problems += [f"instance {name}: {p}" for p in mine]
        result.append({"name": name, "hip_visible_devices": spec, "tp_size": tp, "problems": mine,
                       "devices": [{k: gpu.get(k) for k in ("hip_index", "name", "marketing_name", "uuid", "bdf")}
                                   for gpu in devices]})
    for index, names in sorted(users.items()):
        if len(names) > 1:
            problems.append(f"instances {', '.join(names)} all use {_describe(gpus[index])}: give each instance "
                            "its own GPUs (HIP_VISIBLE_DEVICES in sglang_service_instances)")
    mapping = {inst["name"]: [d["hip_index"] for d in inst["devices"]] for inst in result}
    return {"gpus": gpus, "instances": result, "problems": problems, "mapping": mapping}


# --- AMD's repository layout per ROCm release -----------------------------------------------------

def rocm_amd_layout_error(version: str, releases: dict[str, dict[str, str]] | None, amdgpu: str = "",
                          graphics: str = "") -> str:
    """Why the role cannot render AMD's repositories for rocm_version, or "" when it can.

    releases: the role's table (vars/main.yml _rocm_amd_releases), {rocm version: {amdgpu, graphics}}.
    amdgpu, graphics: rocm_amdgpu_version and rocm_amd_graphics_version; a non-empty value is used as is.
    """
    version = str(version or "").strip()
    known = releases or {}
    if version in known or (str(amdgpu or "").strip() and str(graphics or "").strip()):
        return ""
    missing = [name for name, value in (("rocm_amdgpu_version", amdgpu), ("rocm_amd_graphics_version", graphics))
               if not str(value or "").strip()]
    return (
        f"rocm_version {version!r}: the rocm role does not know AMD's repository layout for this ROCm release "
        f"(it knows {', '.join(sorted(known)) or 'none'}; roles/rocm/vars/main.yml _rocm_amd_releases). The layout is "
        "not derived from the version (ROCm 7.2.2's graphics repository breaks the graphics/<rocm_version> rule), "
        f"so the role does not guess it: set rocm_version to a release it knows, or set {' and '.join(missing)} "
        f"to the amdgpu driver release and graphics repository AMD publishes for ROCm {version} (AMD's release notes; "
        "check rocm_amd_repositories too)."
    )


def rocm_amd_layout(version: str, releases: dict[str, dict[str, str]] | None, amdgpu: str = "",
                    graphics: str = "") -> dict[str, str]:
    """{amdgpu, graphics} for rocm_version: the role's table, each overridden by a non-empty knob.
    Refuses (naming rocm_version) a release the table lacks unless both knobs are set."""
    problem = rocm_amd_layout_error(version, releases, amdgpu, graphics)
    if problem:
        raise AnsibleFilterError(problem)
    row = (releases or {}).get(str(version).strip(), {})
    return {
        "amdgpu": str(amdgpu or "").strip() or str(row["amdgpu"]),
        "graphics": str(graphics or "").strip() or str(row["graphics"]),
    }


# --- The amdgpu driver: loaded against installed ---------------------------------------------------

def _dkms_line(line: str) -> dict[str, str] | None:
    """One `dkms status` line, DKMS 3 (`amdgpu/6.10.5-2084815.24.04, 6.8.0-48-generic, x86_64: installed`)
    or DKMS 2 (`amdgpu, 6.10.5-2084815.24.04, 6.8.0-48-generic, x86_64: installed`)."""
    head, sep, state = line.rpartition(":")
    if not sep:
        return None
    fields = [f.strip() for f in head.split(",")]
    if "/" in fields[0]:
        module, _, version = fields[0].partition("/")
        rest = fields[1:]
    else:
        module, version, rest = fields[0], (fields[1] if len(fields) > 1 else ""), fields[2:]
    if module != "amdgpu" or not version:
        return None
    return {"version": version, "kernel": rest[0] if rest else "", "arch": rest[1] if len(rest) > 1 else "",
            "state": state.strip()}


def rocm_amdgpu_state(stdout: str) -> dict[str, Any]:
    """The role's read-only amdgpu probe (tasks/reboot_state.yml) → the loaded and the installed driver.

    The probe prints `key=value` lines: loaded (yes|no: /sys/module/amdgpu exists), loaded_version and
    loaded_srcversion (/sys/module/amdgpu/{version,srcversion}), kernel (uname -r), modinfo (yes|no),
    disk_file, disk_version, disk_srcversion (`modinfo -k <kernel>` of the module that loads at the next
    boot of this kernel: amdgpu-dkms's under updates/dkms once DKMS installed it), and, last, a line
    `dkms_status:` followed by what `dkms status amdgpu` prints (when dkms is installed). The loaded and
    installed module versions (both MODULE_VERSION) are compared; an in-tree amdgpu has none, so an
    in-tree driver still loaded after amdgpu-dkms installed a versioned one differs too. Equal versions
    with different srcversions (both known) differ as well.
    Returns {loaded, loaded_version, installed_version, installed_file, kernel, dkms: [...], pending,
    summary}: pending is true only when a loaded driver is known to differ from the installed one.
    """
    values: dict[str, str] = {}
    dkms: list[dict[str, str]] = []
    in_dkms = False
    for line in (stdout or "").splitlines():
        if line.strip() == "dkms_status:":
            in_dkms = True
            continue
        if in_dkms:
            entry = _dkms_line(line.strip())
            if entry:
                dkms.append(entry)
            continue
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    loaded = values.get("loaded") == "yes"
    kernel = values.get("kernel", "")
    loaded_version = values.get("loaded_version", "")
    disk_file = values.get("disk_file", "")
    disk_version = values.get("disk_version", "")
    on_disk = bool(disk_file)
    built = [f"{d['version']} for {d['kernel'] or '?'} ({d['state']})" for d in dkms]
    dkms_said = f"; dkms status: {', '.join(built)}" if built else ""

    def shown(version: str) -> str:
        return version or "in-tree, no version"

    installed = f"{shown(disk_version)} ({disk_file})" if on_disk else ""
    pending = False
    if not loaded:
        where = (f"the module installed for kernel {kernel} is {installed}" if on_disk
                 else f"no amdgpu module is installed for kernel {kernel or '?'}"
                 + (" (modinfo is not installed, so the module on disk is unknown)" if values.get("modinfo") == "no"
                    else ""))
        summary = (f"the amdgpu driver is not loaded on this host (no /sys/module/amdgpu): no GPU driver runs, "
                   f"so there is nothing to compare; {where}{dkms_said}")
    elif not on_disk:
        reason = ("modinfo is not installed" if values.get("modinfo") == "no"
                  else f"modinfo finds no amdgpu module for kernel {kernel or '?'}")
        summary = (f"the loaded amdgpu driver is {shown(loaded_version)}; the installed one is unknown ({reason})"
                   f"{dkms_said}")
    else:
        src_loaded, src_disk = values.get("loaded_srcversion", ""), values.get("disk_srcversion", "")
        if loaded_version != disk_version:
            pending = True
            summary = (f"the loaded amdgpu driver is {shown(loaded_version)} but {installed} is installed for kernel "
                       f"{kernel}: the new driver waits for a reboot{dkms_said}")
        elif src_loaded and src_disk and src_loaded != src_disk:
            pending = True
            summary = (f"the loaded amdgpu driver {shown(loaded_version)} (srcversion {src_loaded}) is not the build "
                       f"installed for kernel {kernel} ({disk_file}, srcversion {src_disk}): the new build waits for "
                       f"a reboot{dkms_said}")
        else:
            summary = f"the loaded amdgpu driver is the installed one: {installed}{dkms_said}"
    return {"loaded": loaded, "loaded_version": loaded_version if loaded else None,
            "installed_version": disk_version if on_disk else None, "installed_file": disk_file or None,
            "kernel": kernel, "dkms": dkms, "pending": pending, "summary": summary}


# --- Staged package files -------------------------------------------------------------------------

_DEB_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9+.~%_-]*\.deb$")


def rocm_staged_files(stdout: str) -> list[str]:
    """`apt-get install --print-uris` → the file names it downloads into /var/cache/apt/archives
    (each line: 'URI' FILE SIZE HASH). Anything but a plain .deb file name is refused."""
    files: list[str] = []
    for line in (stdout or "").splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("'"):
            continue
        name = parts[1]
        if not _DEB_FILE.match(name):
            raise AnsibleFilterError(f"apt-get --print-uris named {name!r}, which is not a .deb file name in "
                                     "apt's cache; the role records only such files as staged")
        if name not in files:
            files.append(name)
    return files


def rocm_staged_record(previous: dict[str, Any] | None, release_id: str, files: list[str]) -> dict[str, Any]:
    """The record of staged package files after staging release_id: the files downloaded now, added to those
    an earlier stage recorded (a re-run downloads nothing new; a newer release's stage keeps the older files
    listed, so a later successful activation still removes them). {} when no file is staged."""
    before = [str(f) for f in ((previous or {}).get("files") or []) if _DEB_FILE.match(str(f))]
    merged = sorted(set(before) | set(files or []))
    return {"release_id": release_id, "files": merged} if merged else {}



def rocm_staged_to_remove(record: dict[str, Any] | None, active_release_id: str, done: bool) -> list[str]:
    """The staged files a finished activation removes: the record's, when the release just activated is the
    one they were staged for and `done` (nothing is left to install). Otherwise none: they stay for a retry."""
    record = record or {}
    if not done or not active_release_id or record.get("release_id") != active_release_id:
        return []
    return [str(f) for f in record.get("files") or [] if _DEB_FILE.match(str(f))]

def rocm_rocminfo_said(result: dict[str, Any], command: str, last_line: str) -> str:
    """What the rocminfo run said, after "rocminfo ": not installed (the task was skipped), rc=0, or
    its failure with rc and `last_line` (the last line it printed)."""
    if result.get("skipped", False):
        return f"is not installed ({command} is neither on PATH nor in /opt/rocm/bin)"
    if result.get("rc", 1) == 0:
        return "rc=0"
    return f'failed (rc={result.get("rc", "n/a")}): "{last_line}"'


def rocm_rocminfo_hint(result: dict[str, Any]) -> str:
    """The hint after a failed rocminfo (rc not 0): it prints that error without a GPU; ``""`` otherwise."""
    if result.get("rc", 0) == 0:
        return ""
    return "That is the error rocminfo itself prints when no GPU (or no amdgpu kernel driver) is present."


def rocm_recorded(slurped: dict[str, Any]) -> Any:
    """The JSON record a slurp read (base64 content), ``{}`` when it read none (no such file)."""
    if "content" not in slurped:
        return {}
    return json.loads(base64.b64decode(str(slurped["content"]).encode()).decode("utf-8"))


def rocm_stage_note(pending: Any, plan: list[str]) -> str:
    """How a staged release waits: with its pending activation plan, or with nothing pending."""
    if pending:
        return f"and its activation is pending ({'; '.join(str(step) for step in plan)})"
    return "and nothing is pending"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rocm_package_specs": rocm_package_specs,
            "rocm_repositories": rocm_repositories,
            "rocm_uri_public": rocm_uri_public,
            "rocm_apt_auth": rocm_apt_auth,
            "rocm_release_id": rocm_release_id,
            "rocm_installed": rocm_installed,
            "rocm_offered": rocm_offered,
            "rocm_wanted": rocm_wanted,
            "rocm_changes": rocm_changes,
            "rocm_activation_plan": rocm_activation_plan,
            "rocm_unavailable": rocm_unavailable,
            "rocm_unavailable_notes": rocm_unavailable_notes,
            "rocm_apt_names": rocm_apt_names,
            "rocm_agents": rocm_agents,
            "rocm_gpu_map": rocm_gpu_map,
            "rocm_amd_layout": rocm_amd_layout,
            "rocm_amd_layout_error": rocm_amd_layout_error,
            "rocm_amdgpu_state": rocm_amdgpu_state,
            "rocm_staged_files": rocm_staged_files,
            "rocm_staged_record": rocm_staged_record,
            "rocm_staged_to_remove": rocm_staged_to_remove,
            "rocm_rocminfo_said": rocm_rocminfo_said,
            "rocm_rocminfo_hint": rocm_rocminfo_hint,
            "rocm_recorded": rocm_recorded,
            "rocm_stage_note": rocm_stage_note,
        }
