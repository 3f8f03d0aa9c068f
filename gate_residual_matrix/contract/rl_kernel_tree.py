"""Which RL-Kernel source tree ``rl_kernel_h3`` runs, and why it cannot.

RL-Kernel is not on PyPI. The runner takes a source tree: the standalone folder of its H3
gated residual op (``../shared/third_party/rl-kernel-h3``: upstream files verbatim, stand-ins
listed in ``PROVENANCE.json``; the extension is built by its first import), or a real
checkout. Nothing of it is copied into this repository.

:func:`resolve` picks the tree: ``$GATE_RESIDUAL_RL_KERNEL`` (``GATE_RESIDUAL_RL_KERNEL=PATH
nox -s matrix`` on the command line), else matrix.yaml's ``libraries.rl_kernel``, else the first of
:data:`DEFAULT_TREES` that exists (``.carry/rl-kernel-h3`` in the project, git-ignored, which
a GPU run carries; then ``../shared/third_party/rl-kernel-h3``). Relative paths are relative to
the project root. :func:`problem` says in one line why the tree cannot run (a bad path, a CPU
build of torch, no nvcc where the extension must be built); :func:`provenance` names the tree
that ran: the sha256 of ``PROVENANCE.json``, or the checkout's commit.

The extension's build cache is ``$RLK_BUILD_DIR``; :func:`prepare` sets it, when unset, to a
fixed directory under /tmp (:data:`BUILD_DIR`) so the cells of one run (one process per mode)
build once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gate_residual_matrix import settings

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENV_TREE = "GATE_RESIDUAL_RL_KERNEL"
ROWS = ("rl_kernel_h3",)
"""The implementations that run on the tree (and so on its extension, once built)."""
DEFAULT_TREES = (PROJECT_ROOT / ".carry" / "rl-kernel-h3",
                 PROJECT_ROOT.parent / "shared" / "third_party" / "rl-kernel-h3")
BUILD_DIR = settings.SETTINGS["RLK_BUILD_DIR"].default


def resolve(configured: str | os.PathLike | None = None) -> Path:
    """The tree to use (see the module docstring); may not exist (:func:`problem` says)."""
    value = settings.get(ENV_TREE) or configured
    if value:
        path = Path(value).expanduser()
        return path if path.is_absolute() else PROJECT_ROOT / path
    for tree in DEFAULT_TREES:
        if tree.is_dir():
            return tree
    return DEFAULT_TREES[0]


def _module_files(tree: Path, modules: tuple[str, ...]) -> list[Path]:
    return [tree / (m.replace(".", "/") + ".py") for m in modules]


def needs_build(tree: Path) -> bool:
    """Whether importing the op builds the extension (no prebuilt ``rl_engine/_C*.so``)."""
    return not any((tree / "rl_engine").glob("_C*.so"))


def problem(tree: Path, modules: tuple[str, ...]) -> str | None:
    """One line why ``tree`` cannot run the op on this host, or None. Checked in order: the
    path, the op's module (one of ``modules``: the implementation's ``tree_entries``),
    ``PROVENANCE.json``'s file digests, torch's CUDA build, nvcc."""
    if not tree.is_dir():
        return (f"RL-Kernel source tree {tree} does not exist (set {ENV_TREE} "
                "or libraries.rl_kernel in matrix.yaml)")
    if not any(f.is_file() for f in _module_files(tree, modules)):
        return (f"RL-Kernel source tree {tree} has neither "
                f"{' nor '.join(m.replace('.', '/') + '.py' for m in modules)}")
    bad = _provenance_mismatch(tree)
    if bad:
        return bad
    import torch

    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build: RL-Kernel's CUDA extension "
                "cannot be built or run")
    if needs_build(tree) and nvcc() is None:
        return ("no nvcc (not on PATH, not in $CUDA_HOME/bin): RL-Kernel's extension is "
                f"built on first import from {tree}")
    return None


def nvcc() -> str | None:
    """The nvcc torch's extension loader would use, or None."""
    home = settings.get("CUDA_HOME") or settings.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _provenance_mismatch(tree: Path) -> str | None:
    path = tree / "PROVENANCE.json"
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        for entry in files:
            data = (tree / entry["path"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                return f"RL-Kernel tree {tree}: {entry['path']} does not match PROVENANCE.json"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"RL-Kernel tree {tree}: PROVENANCE.json unusable: {type(err).__name__}: {err}"
    return None


def provenance(tree: Path) -> str:
    """``tree T, PROVENANCE.json sha256 H`` or ``checkout T at commit C[, dirty]`` or
    ``tree T, no PROVENANCE.json and no git commit``."""
    path = tree / "PROVENANCE.json"
    if path.is_file():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return f"tree {tree}, PROVENANCE.json sha256 {digest}"
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"tree {tree}, no PROVENANCE.json and no git commit"
    return f"checkout {tree} at commit {commit}{', dirty' if dirty else ''}"


def prepare(tree: Path) -> None:
    """Put ``tree`` first on ``sys.path`` and default ``RLK_BUILD_DIR`` to :data:`BUILD_DIR`."""
    settings.setdefault("RLK_BUILD_DIR")
    entry = str(tree)
    if entry not in sys.path:
        sys.path.insert(0, entry)


def imported_from(module, tree: Path) -> str | None:
    """Why ``module`` is not the tree's (imported from elsewhere first), or None."""
    origin = Path(getattr(module, "__file__", "") or "").resolve()
    if tree.resolve() not in origin.parents:
        return f"{module.__name__} was imported from {origin}, not from the tree {tree}"
    return None
