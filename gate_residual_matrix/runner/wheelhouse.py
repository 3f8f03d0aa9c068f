"""The kernel wheelhouse: a few kilobytes of a library's released wheel, enough to load its
kernel modules on an offline GPU host. Built by ``nox -s kernel_wheelhouse``.

For each (distribution, version) that matrix.yaml's ``libraries.versions`` names, :func:`build`
runs ``pip download --no-deps`` and keeps, from the wheel:

* the modules that the library implementations call (:func:`kernel_modules`, every path a
  version has used) and, transitively, the same distribution's modules they import (found by
  reading their ``import`` statements, :func:`closure`); no package ``__init__``;
* the wheel's own ``RECORD`` (gzip, deterministic), against which every file is checked
  before it is loaded (:mod:`contract.kernel_only`);
* a manifest: distribution, version, wheel file name, size and sha256, each kept file and
  its sha256, the modules found and those ``not in this version``, every import of another
  distribution (``foreign``; also the distribution's own modules that :data:`CUT_MODULES`
  cuts off, served by a substitute or a stand-in) and, where there are some, the imports
  under a ``try:`` that catches ImportError (``optional``);
* on request only (``--extensions``; tens of MB each), the compiled :data:`EXTENSIONS`
  (vllm's ``_C_stable_libtorch.abi3.so``) with the torch their wheel requires
  (:mod:`contract.extension_files`), in ``<root>/<distribution>-<version>/``.

Layout, content-addressed (identical files across versions are stored once)::

    <root>/objects/<sha256>.py | <sha256>.RECORD.gz
    <root>/manifests/<distribution>-<version>.json

The root must stay out of git (third-party source): the default, ``.carry/kernel-wheelhouse``,
is ignored by ``.gitignore`` and carried to the GPU host with the project.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gate_residual_matrix.contract.wheel_record import (
    PROJECT_ROOT,
    WheelhouseError,
    manifest_path,
    parse_record,
    resolve_root,
    sha256_bytes,
    sha256_file,
)

MANIFEST_SCHEMA = 1

def kernel_modules() -> dict[str, tuple[str, ...]]:
    """Module paths the library implementations call, by distribution: every op's
    ``library_modules`` (:class:`ops.spec.OpSpec`; every layout a version has used), merged
    in the order of :data:`ops.OPS`. The specs import no torch."""
    from gate_residual_matrix import ops
    found: dict[str, dict[str, None]] = {}
    for op in ops.OPS:
        for distribution, modules in ops.get(op).library_modules.items():
            found.setdefault(distribution, {}).update(dict.fromkeys(modules))
    return {d: tuple(m) for d, m in found.items()}


#: Modules of a distribution that its kernel modules import but that kernel-only loading
#: never takes from the wheel (their closure is the serving stack): recorded like imports of
#: another distribution, and served by a substitute or a stand-in
#: (contract.kernel_only.SUBSTITUTES, STAND_INS) or the load fails naming them.
CUT_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm.envs", "vllm.platforms", "vllm.platforms.interface",
             "vllm.triton_utils", "vllm.utils.mem_utils", "vllm.utils.nccl",
             "vllm.utils.platform_utils", "vllm.utils.torch_utils"),
}

#: Compiled extensions a wheel may contribute, by distribution (path inside the wheel): kept
#: only on request (``--extensions``: tens of MB each), beside the wheelhouse's objects
#: (contract.extension).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm/_C_stable_libtorch.abi3.so",),
}


def module_path(module: str) -> str:
    """``a.b.c`` -> ``a/b/c.py``."""
    return module.replace(".", "/") + ".py"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str) -> list[tuple[str, tuple[str, ...], bool]]:
    """``(module, names, lazy)`` of every import in ``source`` (of ``module``, for relative
    imports), except those under ``if TYPE_CHECKING:``; ``lazy``: inside a function."""
    found: list[tuple[str, tuple[str, ...], bool]] = []
    package = module.rpartition(".")[0]

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other, lazy)
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, (), lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parent = ".".join(parts[:len(parts) - child.level + 1])
                    base = f"{parent}.{base}" if base else parent
                found.append((base, tuple(a.name for a in child.names), lazy))
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in _IMPORT_ERRORS for k in kinds)


def guarded_imports(source: str, module: str) -> set[str]:
    """The modules ``source`` imports only inside a ``try:`` whose handler catches ImportError
    (or a base of it), or inside that handler (the fallback): optional, the module runs
    without them (``try: import peft``) or with one of them."""
    every = Counter(target for target, _, _ in imports_of(source, module))
    guarded: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            parts = [*node.body, *(s for h in node.handlers if _catches_import_error(h)
                                   for s in h.body)]
            body = ast.Module(body=parts, type_ignores=[])
            guarded.update(target for target, _, _ in imports_of(ast.unparse(body), module))
    return {target for target, n in guarded.items() if n >= every[target]}


@dataclass
class Closure:
    """What :func:`closure` found: ``files`` (wheel path -> module), ``foreign`` (module of
    another distribution -> names imported from it, for eager imports), ``problems`` (one
    line each: an eager import the wheel's files cannot serve without a package __init__),
    ``optional`` (modules of another distribution imported under a ``try:`` that catches
    ImportError: the module loads without them)."""

    files: dict[str, str]
    foreign: dict[str, list[str]]
    problems: list[str]
    optional: list[str] = field(default_factory=list)


def _cut(target: str, cut: Iterable[str]) -> bool:
    return any(target == c or target.startswith(c + ".") for c in cut)


def closure(entry: str, read: Mapping[str, bytes], tops: Iterable[str],
            cut: Iterable[str] = ()) -> Closure:
    """The files ``entry`` needs from a wheel whose ``.py`` files are ``read`` (path ->
    bytes), whose top-level packages are ``tops``: the entry module, and transitively each
    module of the same distribution it imports when it loads (imports inside functions are
    not followed; the standard library is not listed as foreign). Modules in ``cut``
    (:data:`CUT_MODULES`) are not followed: they are listed as foreign. An import under a
    ``try:`` that catches ImportError is optional: listed in ``optional`` when it is of
    another distribution, skipped without a problem when the wheel lacks it."""
    tops, cut = set(tops), tuple(cut)
    optional: set[str] = set()
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    files: dict[str, str] = {}
    foreign: dict[str, list[str]] = {}
    problems: list[str] = []
    todo = [(entry, False)]
    while todo:
        module, lazy = todo.pop()
        path = module_path(module)
        if path in files:
            continue
        if path not in read:
            if not lazy:
                problems.append(f"{module} is not a module file of the wheel")
            continue
        files[path] = module
        text = read[path].decode("utf-8")
        guarded = guarded_imports(text, module)
        for target, names, is_lazy in imports_of(text, module):
            lazy_here = lazy or is_lazy
            if lazy_here:
                continue  # runs only if that function is called: not followed, not required
            outside = target.split(".")[0] not in tops
            if target in guarded and (outside or module_path(target) not in read):
                if outside and target.split(".")[0] not in stdlib:
                    optional.add(target)
                continue
            if outside or _cut(target, cut):
                if target.split(".")[0] not in stdlib:
                    foreign.setdefault(target, [])
                    foreign[target] = sorted({*foreign[target], *names})
                continue
            if module_path(target) in read:
                todo.append((target, lazy_here))
                continue
            package_init = target.replace(".", "/") + "/__init__.py"
            for name in names:
                sub = f"{target}.{name}"
                if module_path(sub) in read:
                    todo.append((sub, lazy_here))
                elif not lazy_here:
                    where = ("its package __init__" if package_init in read
                             else "a module the wheel does not have")
                    problems.append(f"{module} imports {name!r} from {target}: that is "
                                    f"{where}, which kernel-only loading does not run")
            if not names and not lazy_here and module_path(target) not in read:
                problems.append(f"{module} imports {target}, a package whose __init__ "
                                "kernel-only loading does not run")
    return Closure(files, foreign, sorted(set(problems)), sorted(optional - set(foreign)))


def _write_object(root: Path, name: str, data: bytes) -> None:
    path = root / "objects" / name
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def extract(wheel: Path, distribution: str, version: str, root: Path,
            extensions: bool = False) -> dict:
    """Keep the kernel files and RECORD of ``wheel`` under ``root``; write and return its
    manifest. With ``extensions``, also keep the distribution's :data:`EXTENSIONS`
    (contract.extension.keep). Raises :class:`WheelhouseError` for a wheel
    without RECORD or a kept file whose bytes do not match RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
        if len(records) != 1:
            raise WheelhouseError(f"{wheel.name}: expected one .dist-info/RECORD, found "
                                  f"{len(records)}")
        record_text = zf.read(records[0]).decode("utf-8")
        read = {n: zf.read(n) for n in names if n.endswith(".py")}
    record = parse_record(record_text)
    tops = {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n
            and ".data/" not in n}
    modules: dict[str, dict] = {}
    kept: dict[str, str] = {}
    for entry in kernel_modules().get(distribution, ()):
        if module_path(entry) not in read:
            modules[entry] = {"status": "not in this version"}
            continue
        found = closure(entry, read, tops, CUT_MODULES.get(distribution, ()))
        if found.problems:  # keep nothing of it: it cannot load without its package __init__
            modules[entry] = {"status": "not kernel-only loadable", "files": [],
                              "foreign": found.foreign, "problems": found.problems[:3],
                              "closure_files": len(found.files)}
            continue
        for path in found.files:
            digest = sha256_bytes(read[path])
            if record.get(path) != digest:
                raise WheelhouseError(f"{wheel.name}: {path} does not match the wheel's RECORD")
            kept[path] = digest
            _write_object(root, f"{digest}.py", read[path])
        modules[entry] = {"status": "found", "files": sorted(found.files),
                          "foreign": found.foreign, "problems": found.problems}
        if found.optional:  # only where there are some: older manifests stay as they were
            modules[entry]["optional"] = found.optional
    record_gz = gzip.compress(record_text.encode("utf-8"), mtime=0)
    record_sha = sha256_bytes(record_text.encode("utf-8"))
    _write_object(root, f"{record_sha}.RECORD.gz", record_gz)
    manifest = {
        "schema": MANIFEST_SCHEMA, "distribution": distribution, "version": version,
        "wheel": {"filename": wheel.name, "sha256": sha256_file(wheel),
                  "size": wheel.stat().st_size},
        "record": {"path": records[0], "sha256": record_sha},
        "packages": sorted(tops), "files": dict(sorted(kept.items())), "modules": modules,
    }
    out = manifest_path(root, distribution, version)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if extensions and EXTENSIONS.get(distribution):
        from gate_residual_matrix.contract import extension_files

        for path in EXTENSIONS[distribution]:
            extension_files.keep(wheel, manifest, path, root)
    return manifest


def download(distribution: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps --only-binary :all: distribution==version`` into ``dest``;
    the wheel's path. Raises :class:`WheelhouseError` (one line) when pip fails."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{distribution}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines()
                 if ln.strip() and not ln.startswith("WARNING")]
        raise WheelhouseError(f"pip download {distribution}=={version} failed: "
                              f"{(lines or ['no output'])[-1].strip()}")
    stem = re.sub(r"[-_.]+", "_", distribution).lower()
    wheels = [p for p in dest.glob("*.whl")
              if p.name.lower().startswith(f"{stem}-{version}-")]
    if not wheels:
        raise WheelhouseError(f"pip download {distribution}=={version} left no wheel in {dest}")
    return sorted(wheels)[-1]


def build(versions: Mapping[str, Iterable[str]], root: Path,
          cache: Path | None = None, extensions: bool = False) -> list[dict]:
    """Download each ``{distribution: [version, ...]}`` and :func:`extract` it into ``root``;
    the manifests. ``cache`` keeps the wheels (default: a temporary directory, removed);
    ``extensions`` keeps the compiled :data:`EXTENSIONS` too."""
    manifests = []
    with tempfile.TemporaryDirectory(prefix="kernel-wheels-") as tmp:
        where = Path(cache) if cache else Path(tmp)
        for distribution, vs in versions.items():
            for version in vs:
                wheel = download(distribution, version, where)
                manifests.append(extract(wheel, distribution, version, root, extensions))
    return manifests


def summary(manifest: Mapping) -> str:
    """One line per module of ``manifest``: found (files) or ``not in this version``."""
    lines = []
    for module, info in manifest["modules"].items():
        head = f"{manifest['distribution']} {manifest['version']}: {module}"
        if info["status"] == "not kernel-only loadable":
            lines.append(f"{head}: {info['status']}: {info['problems'][0]}")
            continue
        if info["status"] != "found":
            lines.append(f"{head}: {info['status']}")
            continue
        extra = "; ".join(info["problems"]) or "kernel-only loadable"
        foreign = ", ".join(sorted(info["foreign"])) or "none"
        lines.append(f"{head}: {len(info['files'])} file(s); other distributions: {foreign}; "
                     f"{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m gate_residual_matrix.runner.wheelhouse [--matrix FILE ...] [--out DIR]
    [--cache DIR] [--extensions]``: build the wheelhouse for the matrix files'
    ``libraries.versions`` (their union; default matrix.yaml); one line per module, and per
    extension kept."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m gate_residual_matrix.runner.wheelhouse",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, action="append", default=None,
                        help="a matrix file (repeat for several; default: matrix.yaml)")
    parser.add_argument("--out", type=Path, default=None,
                        help="wheelhouse root (default: libraries.wheelhouse of the matrix)")
    parser.add_argument("--cache", type=Path, default=None, help="keep the wheels here")
    parser.add_argument("--extensions", action="store_true",
                        help="also keep the compiled extensions the library rows load "
                             f"({', '.join(p for ps in EXTENSIONS.values() for p in ps)}: "
                             "tens of MB each; off by default)")
    args = parser.parse_args(argv)
    matrices = args.matrix or [PROJECT_ROOT / "matrix.yaml"]
    try:
        versions: dict[str, list[str]] = {}
        configured = None
        for matrix in matrices:
            libraries = (yaml.safe_load(matrix.read_text()) or {}).get("libraries") or {}
            configured = configured or libraries.get("wheelhouse")
            for dist, listed in (libraries.get("versions") or {}).items():
                versions[dist] = list(dict.fromkeys([*versions.get(dist, []), *listed]))
        if not versions:
            raise WheelhouseError(f"{', '.join(map(str, matrices))}: no libraries.versions "
                                  "to fetch")
        root = args.out or resolve_root(configured)
        manifests = build(versions, root, args.cache, args.extensions)
    except (OSError, WheelhouseError, yaml.YAMLError) as err:
        print(f"kernel wheelhouse: {err}".splitlines()[0], file=sys.stderr)
        return 1
    for manifest in manifests:
        print(summary(manifest))
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    print(f"wheelhouse {root}: {len(manifests)} wheel(s) kept as {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
