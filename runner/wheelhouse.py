"""The kernel wheelhouse: a few kilobytes of a library's released wheel, enough to load its
kernel modules on an offline GPU host (issue 13). Built by ``nox -s kernel_wheelhouse``.

For each (distribution, version) that matrix.yaml's ``libraries.versions`` names, :func:`build`
runs ``pip download --no-deps`` and keeps, from the wheel:

* the modules that the library implementations call (:data:`KERNEL_MODULES`, every path a
  version has used) and, transitively, the same distribution's modules they import (found by
  reading their ``import`` statements, :func:`closure`); no package ``__init__``;
* the wheel's own ``RECORD`` (gzip, deterministic), against which every file is checked
  before it is loaded (:mod:`runner.implementations.kernel_only`);
* a manifest: distribution, version, wheel file name, size and sha256, each kept file and
  its sha256, the modules found and those ``not in this version``, and every import of
  another distribution (``foreign``).

Layout, content-addressed (identical files across versions are stored once)::

    <root>/objects/<sha256>.py | <sha256>.RECORD.gz
    <root>/manifests/<distribution>-<version>.json

The root must stay out of git (third-party source): the default, ``.carry/kernel-wheelhouse``,
is ignored by ``.gitignore`` and carried to the GPU host with the project.
"""

from __future__ import annotations

import ast
import base64
import csv
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = PROJECT_ROOT / ".carry" / "kernel-wheelhouse"
ENV_ROOT = "GATE_RESIDUAL_WHEELHOUSE"
MANIFEST_SCHEMA = 1

#: Module paths the library implementations call, by distribution: every layout a version
#: has used (runner/implementations/sglang_ops.py and vllm_omni_ops.py name the functions).
KERNEL_MODULES: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton",
               "sglang.kernels.kda_kernels.residual_gate_add_jit"),
    "vllm-omni": ("vllm_omni.diffusion.layers.indexed_modulation",            # 0.30.0
                  "vllm_omni.diffusion.attention.ops.minimax_h3_modulation"),  # 0.28.0
}


class WheelhouseError(RuntimeError):
    """A wheelhouse that cannot be built or read; the message is one line."""


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def record_digest(entry: str) -> str | None:
    """The hex sha256 of a RECORD hash field (``sha256=<urlsafe base64, no padding>``), or
    None for an empty field (RECORD itself) or another algorithm."""
    algo, _, value = entry.partition("=")
    if algo != "sha256" or not value:
        return None
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def parse_record(text: str) -> dict[str, str | None]:
    """``{path: hex sha256 or None}`` from a wheel's RECORD (CSV: path, hash, size)."""
    return {row[0]: record_digest(row[1] if len(row) > 1 else "")
            for row in csv.reader(io.StringIO(text)) if row}


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


@dataclass
class Closure:
    """What :func:`closure` found: ``files`` (wheel path -> module), ``foreign`` (module of
    another distribution -> names imported from it, for eager imports), ``problems`` (one
    line each: an eager import the wheel's files cannot serve without a package __init__)."""

    files: dict[str, str]
    foreign: dict[str, list[str]]
    problems: list[str]


def closure(entry: str, read: Mapping[str, bytes], tops: Iterable[str]) -> Closure:
    """The files ``entry`` needs from a wheel whose ``.py`` files are ``read`` (path ->
    bytes), whose top-level packages are ``tops``: the entry module, and transitively each
    module of the same distribution it imports when it loads (imports inside functions are
    not followed; the standard library is not listed as foreign)."""
    tops = set(tops)
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
        for target, names, is_lazy in imports_of(read[path].decode("utf-8"), module):
            lazy_here = lazy or is_lazy
            if lazy_here:
                continue  # runs only if that function is called: not followed, not required
            if target.split(".")[0] not in tops:
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
    return Closure(files, foreign, sorted(set(problems)))


def manifest_path(root: Path, distribution: str, version: str) -> Path:
    """Where the manifest of ``distribution`` ``version`` lives under ``root``."""
    return root / "manifests" / f"{distribution}-{version}.json"


def _write_object(root: Path, name: str, data: bytes) -> None:
    path = root / "objects" / name
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def extract(wheel: Path, distribution: str, version: str, root: Path) -> dict:
    """Keep the kernel files and RECORD of ``wheel`` under ``root``; write and return its
    manifest. Raises :class:`WheelhouseError` for a wheel without RECORD or a kept file
    whose bytes do not match RECORD."""
    data = wheel.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
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
    for entry in KERNEL_MODULES.get(distribution, ()):
        if module_path(entry) not in read:
            modules[entry] = {"status": "not in this version"}
            continue
        found = closure(entry, read, tops)
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
    record_gz = gzip.compress(record_text.encode("utf-8"), mtime=0)
    record_sha = sha256_bytes(record_text.encode("utf-8"))
    _write_object(root, f"{record_sha}.RECORD.gz", record_gz)
    manifest = {
        "schema": MANIFEST_SCHEMA, "distribution": distribution, "version": version,
        "wheel": {"filename": wheel.name, "sha256": sha256_bytes(data), "size": len(data)},
        "record": {"path": records[0], "sha256": record_sha},
        "packages": sorted(tops), "files": dict(sorted(kept.items())), "modules": modules,
    }
    out = manifest_path(root, distribution, version)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
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
          cache: Path | None = None) -> list[dict]:
    """Download each ``{distribution: [version, ...]}`` and :func:`extract` it into ``root``;
    the manifests. ``cache`` keeps the wheels (default: a temporary directory, removed)."""
    manifests = []
    with tempfile.TemporaryDirectory(prefix="kernel-wheels-") as tmp:
        where = Path(cache) if cache else Path(tmp)
        for distribution, vs in versions.items():
            for version in vs:
                wheel = download(distribution, version, where)
                manifests.append(extract(wheel, distribution, version, root))
    return manifests


def resolve_root(configured: str | os.PathLike | None = None) -> Path:
    """The wheelhouse root: ``$GATE_RESIDUAL_WHEELHOUSE``, else ``configured`` (relative to
    the project root), else :data:`DEFAULT_ROOT`."""
    value = os.environ.get(ENV_ROOT) or configured
    if not value:
        return DEFAULT_ROOT
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


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
    """``python -m runner.wheelhouse [--matrix matrix.yaml] [--out DIR] [--cache DIR]``:
    build the wheelhouse for matrix.yaml's ``libraries.versions``; one line per module."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m runner.wheelhouse",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=PROJECT_ROOT / "matrix.yaml")
    parser.add_argument("--out", type=Path, default=None,
                        help="wheelhouse root (default: libraries.wheelhouse of the matrix)")
    parser.add_argument("--cache", type=Path, default=None, help="keep the wheels here")
    args = parser.parse_args(argv)
    try:
        data = yaml.safe_load(args.matrix.read_text()) or {}
        libraries = data.get("libraries") or {}
        versions = libraries.get("versions") or {}
        if not versions:
            raise WheelhouseError(f"{args.matrix}: no libraries.versions to fetch")
        root = args.out or resolve_root(libraries.get("wheelhouse"))
        manifests = build(versions, root, args.cache)
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
