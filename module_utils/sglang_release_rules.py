# hicache-fleet: what would kill an SGLang server at start, read off an installed release's files.
# Plain functions, unit-tested in tests/release_check on the real wheels; the module
# library/sglang_release_check.py runs them on the managed host with its system Python (standard
# library and binutils' `nm`/`readelf`, nothing imported from the release), so every check here
# works without a GPU and without importing torch or SGLang.
#
# Three families of rules:
# - ABI: every compiled extension that links torch resolves its c10/ATen/torch symbols against the
#   torch libraries it NEEDs (`nm -D`), so an extension built for another torch is refused.
# - Kernel names: every `sgl_kernel` name (Python import or `torch.ops.sgl_kernel` op) that the
#   installed SGLang uses on the host's platform exists in the installed kernel package.
# - Launch: the quantization method is registered on the platform and accepts the dtype; the
#   HiCache io backend is one that SGLang runs on the platform.
# The platform rules evaluate SGLang's own `if _is_hip:` / `elif is_cuda():` branches with the
# host's platform, the way the interpreter would on that host.

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

PLATFORMS = ("hip", "cuda", "cpu", "npu", "xpu", "mps", "musa")

# Mangled C++ names in torch's namespaces (c10, at, torch, caffe2), also vtables/typeinfo of their
# classes and ref-qualified members (_ZNR/_ZNO).
TORCH_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N[KRVO]*(?:3c10|2at|5torch|6caffe2)")
# The part of torch's ABI that lives in the GPU backend's libraries (libc10_hip/libtorch_hip on ROCm,
# libc10_cuda/libtorch_cuda on CUDA), not in libc10/libtorch_cpu.
BACKEND_SYMBOL = re.compile(r"^_Z(?:T[VIS])?N[KRVO]*(?:3c10(?:3hip|4cuda)|2at(?:3hip|4cuda))")
TORCH_LIBRARY = re.compile(r"^lib(?:c10|torch|caffe2)[A-Za-z0-9_]*\.so")
DTYPE_ALIASES = {"half": "float16", "float16": "float16", "fp16": "float16", "bfloat16": "bfloat16",
                 "bf16": "bfloat16", "float": "float32", "float32": "float32"}
# An op schema string in a compiled extension: m.def("name(Tensor! out, int bit) -> ()").
OP_SCHEMA = re.compile(rb"(?<![A-Za-z0-9_.])([a-z_][a-z0-9_]*)(?:\.[a-z_]+)?\("
                       rb"(?:Tensor|int|float|bool|str|SymInt|ScalarType|Scalar|Device|Layout|MemoryFormat|\))")
CUDA_LIBRARY = re.compile(r"^lib(?:cudart|cuda|cublas|cublasLt|nvrtc|c10_cuda|torch_cuda)\.so")


class ToolError(Exception):
    """binutils is missing or failed on a file."""


def _run(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=300)
    except FileNotFoundError as exc:
        raise ToolError(f"{argv[0]} is not installed: install binutils (the release check reads ELF files "
                        "with nm and readelf)") from exc
    if out.returncode != 0:
        raise ToolError(f"{' '.join(argv[:3])} … failed: {(out.stderr or out.stdout).strip()[-300:]}")
    return out.stdout


# --- ELF ----------------------------------------------------------------------------------------

def elf_dynamic(path: str) -> dict[str, list[str]]:
    """NEEDED and RUNPATH/RPATH entries of a shared object (`readelf -d`)."""
    needed, runpath = [], []
    for line in _run(["readelf", "-d", "-W", path]).splitlines():
        match = re.search(r"\((NEEDED|RUNPATH|RPATH)\)\s+[^\[]*\[(.*)\]", line)
        if not match:
            continue
        if match.group(1) == "NEEDED":
            needed.append(match.group(2))
        else:
            runpath.extend(match.group(2).split(":"))
    return {"needed": needed, "runpath": runpath}


def undefined_symbols(path: str) -> set[str]:
    """Strong undefined dynamic symbols (weak ones may stay unresolved), version suffix dropped."""
    symbols = set()
    for line in _run(["nm", "-D", "--undefined-only", path]).splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-2] == "U":
            symbols.add(parts[-1].split("@")[0])
    return symbols


def defined_symbols(paths: Iterable[str]) -> set[str]:
    """Dynamic symbols the given libraries export (each library read once per process: every
    extension of a venv resolves against the same torch libraries)."""
    symbols: set[str] = set()
    for path in paths:
        symbols |= _exports(os.path.realpath(path))
    return symbols


@functools.lru_cache(maxsize=64)
def _exports(path: str) -> frozenset[str]:
    out = set()
    for line in _run(["nm", "-D", "--defined-only", path]).splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] not in ("U", "w", "v"):
            out.add(parts[2].split("@")[0])
    return frozenset(out)


def demangle(symbols: Iterable[str]) -> dict[str, str]:
    """Mangled name -> readable C++ (`c++filt`; the mangled name when it is missing)."""
    symbols = sorted(symbols)
    if not symbols:
        return {}
    try:
        out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, check=True,
                             timeout=60).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {s: s for s in symbols}
    return dict(zip(symbols, out, strict=True)) if len(out) == len(symbols) else {s: s for s in symbols}


def _resolve_runpath(entry: str, origin: str) -> str:
    return os.path.normpath(entry.replace("$ORIGIN", origin).replace("${ORIGIN}", origin))


def extension_abi(path: str, torch_lib_dir: str) -> dict[str, Any]:
    """How one compiled extension links torch: the torch libraries it NEEDs, which of them torch ships
    (searched in its RUNPATH, then in ``torch_lib_dir``), and the torch-namespace symbols none of the
    shipped ones export. Symbols of the GPU backend's namespaces (c10::hip, at::cuda, …) are charged
    to a missing backend library rather than reported one by one."""
    dyn = elf_dynamic(path)
    wanted = [lib for lib in dyn["needed"] if TORCH_LIBRARY.match(lib)]
    dirs = [_resolve_runpath(e, os.path.dirname(path)) for e in dyn["runpath"]] + [torch_lib_dir]
    found, absent = {}, []
    for lib in wanted:
        where = next((os.path.join(d, lib) for d in dirs if os.path.isfile(os.path.join(d, lib))), None)
        if where:
            found[lib] = where
        else:
            absent.append(lib)
    needed_symbols = {s for s in undefined_symbols(path) if TORCH_SYMBOL.match(s)} if wanted else set()
    missing = needed_symbols - defined_symbols(found.values())
    backend_absent = any(not re.match(r"^lib(c10|torch_cpu|torch)\.so", lib) for lib in absent)
    if backend_absent:
        missing = {s for s in missing if not BACKEND_SYMBOL.match(s)}
    return {"path": path, "torch_libraries": wanted, "absent_libraries": absent,
            "cuda_libraries": [lib for lib in dyn["needed"] if CUDA_LIBRARY.match(lib)],
            "missing_symbols": sorted(missing), "checked_symbols": len(needed_symbols)}


def shared_objects(root: str, skip: Sequence[str] = ()) -> Iterator[str]:
    """Every ``*.so`` file under root (extension modules and bundled libraries), sorted."""
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if os.path.join(directory, d) not in skip)
        for name in sorted(files):
            if name.endswith(".so") or ".so." in name:
                full = os.path.join(directory, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    yield full


def abi_problems(site_dir: str, torch_version: str = "") -> tuple[list[str], list[dict[str, Any]]]:
    """Problems of every compiled extension in ``site_dir`` that links torch (torch's own files
    excepted), and the per-extension findings."""
    torch_dir = os.path.join(site_dir, "torch")
    torch_lib = os.path.join(torch_dir, "lib")
    findings, problems = [], []
    for path in shared_objects(site_dir, skip=[torch_dir]):
        try:
            needed = elf_dynamic(path)["needed"]
        except ToolError:
            continue  # not an ELF file (a linker script, say)
        if not any(TORCH_LIBRARY.match(lib) for lib in needed):
            continue
        abi = extension_abi(path, torch_lib)
        findings.append(abi)
        rel = os.path.relpath(path, site_dir)
        if abi["missing_symbols"]:
            names = demangle(abi["missing_symbols"])
            shown = "; ".join(names[s] for s in abi["missing_symbols"][:4])
            more = len(abi["missing_symbols"]) - 4
            problems.append(
                f"{rel} was built against another torch: {len(abi['missing_symbols'])} of its torch symbols are "
                f"exported by none of the venv's torch{(' ' + torch_version) if torch_version else ''} libraries "
                f"({shown}{f'; and {more} more' if more > 0 else ''}): importing it fails, so the server dies at "
                "start. Pin the torch the extension was built for, or an extension built for this torch")
        if abi["absent_libraries"]:
            absent = " ".join(abi["absent_libraries"])
            built_for = ("a ROCm torch" if "_hip" in absent else "a CUDA torch" if "_cuda" in absent
                         else "another torch")
            problems.append(
                f"{rel} needs {', '.join(abi['absent_libraries'])}, which the venv's torch does not ship: it was "
                f"built for {built_for}, so importing it fails; install the torch build the extension was built "
                "for, or the extension's build for this torch")
    return problems, findings


# --- Platform branches ---------------------------------------------------------------------------

def _platform_of(name: str) -> str | None:
    match = re.fullmatch(r"_?is_([a-z]+)", name)
    return match.group(1) if match and match.group(1) in PLATFORMS else None


def truth(expr: ast.expr, platform: str) -> bool | None:
    """The value of a condition like ``_is_hip``, ``is_cuda()``, ``not _is_npu and _is_hip`` on
    ``platform``; None when it depends on something else."""
    if isinstance(expr, ast.Call) and not expr.args:
        return truth(expr.func, platform)
    if isinstance(expr, ast.Name):
        if expr.id == "_is_cuda_alike" or expr.id == "is_cuda_alike":
            return platform in ("cuda", "hip")
        kind = _platform_of(expr.id)
        return None if kind is None else kind == platform
    if isinstance(expr, ast.Attribute):  # current_platform.is_hip()
        kind = _platform_of(expr.attr)
        return None if kind is None else kind == platform
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = truth(expr.operand, platform)
        return None if inner is None else not inner
    if isinstance(expr, ast.BoolOp):
        values = [truth(v, platform) for v in expr.values]
        if isinstance(expr.op, ast.And):
            if False in values:
                return False
            return True if all(v is True for v in values) else None
        if True in values:
            return True
        return False if all(v is False for v in values) else None
    return None


def reachable(body: Sequence[ast.stmt], platform: str) -> Iterator[ast.stmt]:
    """The statements of ``body`` (recursively, into functions, classes, try and with blocks) that
    can run on ``platform``: an ``if`` whose condition is decided by the platform contributes only
    the branch taken."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            value = truth(stmt.test, platform)
            if value is not False:
                yield from reachable(stmt.body, platform)
            if value is not True:
                yield from reachable(stmt.orelse, platform)
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from reachable(part, platform)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.For,
                               ast.While, ast.AsyncWith, ast.AsyncFor)):
            yield from reachable(stmt.body, platform)
            yield from reachable(getattr(stmt, "orelse", []), platform)


def _platform_raises(body: Sequence[ast.stmt], platform: str) -> bool:
    """Does this scope raise inside a branch that hangs on this platform (``if _is_hip: raise``,
    ``if fn is None and _is_hip: raise``): possible here, and ruled out on some other platform?"""
    for stmt in body:
        if isinstance(stmt, ast.If):
            here = truth(stmt.test, platform)
            specific = here is not False and any(truth(stmt.test, other) is False for other in PLATFORMS
                                                 if other != platform)
            if specific and any(isinstance(s, ast.Raise) for s in ast.walk(stmt)):
                return True
            if _platform_raises(stmt.body, platform) or _platform_raises(stmt.orelse, platform):
                return True
    return False


def _op_names(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "sgl_kernel"
                and isinstance(sub.value.value, ast.Attribute) and sub.value.value.attr == "ops"):
            yield sub.attr


def kernel_uses(source: str, platform: str, filename: str = "<sglang>") -> list[tuple[str, str, int]]:
    """``(kind, name, line)`` of every ``sgl_kernel`` name the module requires on ``platform``: ``py``
    for ``from sgl_kernel[.sub] import name`` (``sub.name`` for a submodule), ``op`` for
    ``torch.ops.sgl_kernel.name``. A use counts when it sits in a branch that this platform takes
    by SGLang's own platform test (``if _is_hip:``, ``elif is_hip():``), or when it is an import inside
    ``try`` in a scope that raises on this platform (SGLang's way of saying "required here").
    Uses outside any platform branch are left out: whether they run depends on the model and the
    flags (CPU-only ops behind ``cpu_has_amx_support()``, say), not on the platform."""
    tree = ast.parse(source, filename)
    uses: list[tuple[str, str, int]] = []

    def scan(body: Sequence[ast.stmt], on_platform: bool, scope_raises: bool, in_try: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.split(".")[0] == "sgl_kernel":
                if (on_platform and not in_try) or (in_try and scope_raises):
                    sub = stmt.module[len("sgl_kernel"):].lstrip(".")
                    for alias in stmt.names:
                        uses.append(("py", f"{sub}.{alias.name}" if sub else alias.name, stmt.lineno))
                continue
            if isinstance(stmt, ast.If):
                value = truth(stmt.test, platform)
                if value is not False:
                    scan(stmt.body, on_platform or value is True, scope_raises, in_try)
                if value is not True:
                    scan(stmt.orelse, on_platform, scope_raises, in_try)
                continue
            if isinstance(stmt, ast.Try):
                scan(stmt.body, on_platform, scope_raises, True)
                for part in (*(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                    scan(part, on_platform, scope_raises, in_try)
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scan(stmt.body, on_platform, _platform_raises(stmt.body, platform), False)
                continue
            if isinstance(stmt, (ast.ClassDef, ast.With, ast.For, ast.While, ast.AsyncWith, ast.AsyncFor)):
                scan(stmt.body, on_platform, scope_raises, in_try)
                scan(getattr(stmt, "orelse", []), on_platform, scope_raises, in_try)
                continue
            if on_platform and not in_try:
                uses.extend(("op", n, stmt.lineno) for n in _op_names(stmt))

    scan(tree.body, False, _platform_raises(tree.body, platform), False)
    return uses


def kernel_exports(kernel_dir: str) -> dict[str, set[str]]:
    """What an installed ``sgl_kernel`` package offers: ``py`` names (top-level names of
    ``__init__.py`` and ``sub.name`` of each submodule) and ``op`` names (the op schemas its compiled
    ``common_ops`` registers, ``m.def("name(...``)."""
    py: set[str] = set()
    for name in sorted(os.listdir(kernel_dir)):
        path = os.path.join(kernel_dir, name)
        if name.endswith(".py"):
            module = name[:-3]
            try:
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read(), path)
            except (OSError, SyntaxError):
                continue
            for defined in _top_level_names(tree):
                py.add(defined if module == "__init__" else f"{module}.{defined}")
            if module != "__init__":
                py.add(module)
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
            py.add(name)
    ops: set[str] = set()
    for so in shared_objects(kernel_dir):
        with open(so, "rb") as handle:
            data = handle.read()
        ops.update(m.decode() for m in OP_SCHEMA.findall(data))
    return {"py": py, "op": ops}


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in reachable(tree.body, "hip"):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    return names


def kernel_name_problems(sglang_dir: str, kernel_dir: str, platform: str,
                         distribution: str = "sgl_kernel") -> tuple[list[str], dict[str, Any]]:
    """Names the installed SGLang (``sglang_dir``: the package directory) uses on ``platform`` that the
    installed kernel (``kernel_dir``) lacks, one problem per name with the files that use it."""
    exports = kernel_exports(kernel_dir)
    wanted: dict[tuple[str, str], list[str]] = {}
    srt = os.path.join(sglang_dir, "srt")
    for directory, dirs, files in os.walk(srt):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    source = handle.read()
                uses = kernel_uses(source, platform, path) if "sgl_kernel" in source else []
            except (OSError, SyntaxError, UnicodeDecodeError):
                continue
            for kind, used, line in uses:
                wanted.setdefault((kind, used), []).append(f"{os.path.relpath(path, sglang_dir)}:{line}")
    problems = []
    missing = []
    for (kind, used), where in sorted(wanted.items()):
        if used in exports[kind]:
            continue
        missing.append(f"{kind}:{used}")
        label = f"sgl_kernel.{used}" if kind == "py" else f"torch.ops.sgl_kernel.{used}"
        problems.append(
            f"the installed SGLang uses {label} on {platform.upper()} ({', '.join(where[:3])}"
            f"{' …' if len(where) > 3 else ''}), which the installed {distribution} lacks: pin an SGLang release "
            "whose kernel calls the installed kernel has (the package set's sglang version), or a kernel that has it")
    return problems, {"used": len(wanted), "missing": missing}


# --- Launch rules ----------------------------------------------------------------------------------

def _dict_keys(node: ast.AST) -> dict[str, str]:
    out = {}
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out[key.value] = value.id if isinstance(value, ast.Name) else ast.unparse(value)
    return out


def registered_quantizations(init_source: str, platform: str) -> dict[str, str]:
    """Quantization method -> config class that ``sglang/srt/layers/quantization/__init__.py``
    registers on ``platform`` (``BASE_QUANTIZATION_METHODS`` and its platform-guarded ``update``s).
    A condition the platform does not decide (a GPU generation, say) is taken as false."""
    tree = ast.parse(init_source)
    methods: dict[str, str] = {}

    def walk(body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(isinstance(t, ast.Name) and t.id == "BASE_QUANTIZATION_METHODS" for t in targets):
                    methods.update(_dict_keys(stmt.value))
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                func = stmt.value.func
                if (isinstance(func, ast.Attribute) and func.attr == "update" and isinstance(func.value, ast.Name)
                        and func.value.id == "BASE_QUANTIZATION_METHODS" and stmt.value.args):
                    methods.update(_dict_keys(stmt.value.args[0]))
            elif isinstance(stmt, ast.If):
                value = truth(stmt.test, platform)
                walk(stmt.body if value else stmt.orelse)

    walk(tree.body)
    return methods


def supported_act_dtypes(quant_dir: str, class_name: str) -> list[str] | None:
    """The dtypes ``<class_name>.get_supported_act_dtypes`` returns (``torch.half`` -> ``float16``),
    found in the quantization package's modules; None when it cannot be read statically."""
    aliases = DTYPE_ALIASES
    files = sorted(os.path.join(d, f) for d, _dirs, fs in os.walk(quant_dir) for f in fs if f.endswith(".py"))
    for path in files:
        try:
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
            if f"class {class_name}" not in source:
                continue
            tree = ast.parse(source, path)
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if not (isinstance(node, ast.ClassDef) and node.name == class_name):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "get_supported_act_dtypes":
                    for sub in ast.walk(item):
                        if isinstance(sub, ast.Return) and isinstance(sub.value, (ast.List, ast.Tuple)):
                            out = []
                            for elt in sub.value.elts:
                                if isinstance(elt, ast.Attribute) and elt.attr in aliases:
                                    out.append(aliases[elt.attr])
                                else:
                                    return None
                            return out
            return None
    return None


def launch_problems(sglang_dir: str, args: Mapping[str, Any], platform: str,
                    io_backends: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """What the installed SGLang's own rules refuse in a launch config on ``platform``, beyond its
    argument parser: ``args`` maps flags to values as the profile renders them (``--quantization``,
    ``--dtype``, ``--hicache-io-backend``, ``--speculative-draft-model-quantization``).
    ``io_backends``: platform -> HiCache io backends known to run there (the role's data)."""
    problems = []
    quant_dir = os.path.join(sglang_dir, "srt", "layers", "quantization")
    with open(os.path.join(quant_dir, "__init__.py"), encoding="utf-8") as handle:
        registered = registered_quantizations(handle.read(), platform)
    dtype = DTYPE_ALIASES.get(str(args.get("--dtype") or "auto"), str(args.get("--dtype") or "auto"))
    for flag in ("--quantization", "--speculative-draft-model-quantization"):
        method = args.get(flag)
        if method in (None, False, "", "unquant"):
            continue
        method = str(method)
        if method not in registered:
            problems.append(
                f"{flag} {method}: the installed SGLang does not register {method!r} on {platform.upper()} "
                f"(sglang/srt/layers/quantization/__init__.py; registered there: {', '.join(sorted(registered))}), "
                "so the server refuses it at start: choose a registered method or an SGLang release that has it "
                "on this platform")
            continue
        if flag == "--quantization" and dtype != "auto":
            dtypes = supported_act_dtypes(quant_dir, registered[method])
            if dtypes is not None and dtype not in dtypes:
                problems.append(
                    f"--dtype {args.get('--dtype')} with --quantization {method}: {registered[method]} accepts only "
                    f"{', '.join(dtypes)} activations (get_supported_act_dtypes), so the model load is refused: set "
                    f"--dtype {dtypes[0]} in the profile")
    backend = args.get("--hicache-io-backend")
    if args.get("--enable-hierarchical-cache") and backend and io_backends and platform in io_backends:
        allowed = list(io_backends[platform])
        if str(backend) not in allowed:
            problems.append(
                f"--hicache-io-backend {backend} on {platform.upper()}: known to run here only with "
                f"{', '.join(allowed)} (sglang_service_platform_io_backends): set --hicache-io-backend "
                f"{allowed[0]} in sglang_service_hicache_args")
    return problems
