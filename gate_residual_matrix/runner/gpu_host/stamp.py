"""The source stamp: which commit a copy of the tree is, on a host without git.

Reports name the commit they were made at (``environment.project``), which a copy without
git metadata cannot tell. :func:`write_stamp`, on a clean checkout, records HEAD and the
sha256 of every tracked source file (:data:`SOURCES`) in ``.carry/source.json``. On the GPU
host :func:`check_stamp` hashes the files it has under the same paths: when they are exactly
the stamped ones, ``GATE_RESIDUAL_COMMIT`` and ``GATE_RESIDUAL_DIRTY=0`` are set, so every
report and table of the run names that commit; otherwise nothing is set (the reports say what
git says there, usually nothing) and the first file that differs is named.

``digest`` is the sha256 of ``sha256sum``'s lines (``<sha256>  <path>``, paths sorted by
their bytes): ``find SOURCES -type f | LC_ALL=C sort | xargs sha256sum | sha256sum`` gives it.

Example (on the checkout, then on the host's copy)::

    >>> write_stamp(Path("."))["commit"]  # doctest: +SKIP
    'b30c1b3...'
    >>> apply_stamp(Path("."), os.environ)["matches"]  # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from gate_residual_matrix.runner.errors import ConfigError

STAMP = Path(".carry") / "source.json"
SOURCES = ("gate_residual_matrix", "scripts", "tests", "containers", "docs", "noxfile.py",
           "matrix*.yaml", "pyproject.toml", "README.md")
"""What decides a run's results: the package, its scripts, tests, container recipes and docs,
the nox file, the matrix files and the project's metadata (not ``reports/``, the output)."""


class StampError(ConfigError):
    """The stamp cannot be made here: no git, not a checkout, or uncommitted changes (exit 2)."""


def _skipped(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def source_files(root: Path) -> list[str]:
    """The files under :data:`SOURCES` in ``root`` (relative POSIX paths, sorted by their
    bytes), byte-code caches left out."""
    found: set[str] = set()
    for entry in SOURCES:
        for top in sorted(root.glob(entry)):
            paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
            found |= {p.relative_to(root).as_posix() for p in paths
                      if not _skipped(p.relative_to(root))}
    return sorted(found, key=lambda p: p.encode())


def hashes(root: Path, paths: list[str]) -> dict[str, str]:
    """``{path: sha256 hex}`` of ``paths`` under ``root``."""
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in paths}


def digest(files: dict[str, str]) -> str:
    """One sha256 for ``{path: sha256}`` (see the module docstring)."""
    lines = "".join(f"{files[p]}  {p}\n" for p in sorted(files, key=lambda p: p.encode()))
    return hashlib.sha256(lines.encode()).hexdigest()


def _git(root: Path, *args: str) -> str:
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        raise StampError(f"--stamp: needs git and a checkout; {root.resolve()} is not one")
    done = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True,
                          timeout=60)
    if done.returncode:
        first = (done.stderr.strip().splitlines() or ["?"])[0]
        raise StampError(f"--stamp: git {args[0]} failed: {first}")
    return done.stdout


def write_stamp(root: Path) -> dict:
    """Record HEAD and the tracked source files' hashes in ``root/.carry/source.json``;
    returns what was written.

    Raises:
        StampError: no git or not a checkout, or a tracked file outside ``reports/`` has
            uncommitted changes (the stamp would name a commit these files are not).
    """
    changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                   ":(exclude)reports").splitlines()
    if changed:
        raise StampError(f"--stamp: commit first: {len(changed)} tracked file(s) changed "
                         f"(first: {changed[0][3:]})")
    commit = _git(root, "rev-parse", "HEAD").strip()
    tracked = [p for p in _git(root, "ls-files", "-z", "--", *SOURCES).split("\0")
               if p and (root / p).is_file() and not _skipped(Path(p))]
    files = hashes(root, sorted(tracked, key=lambda p: p.encode()))
    stamp = {"commit": commit, "digest": digest(files), "files": files}
    path = root / STAMP
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
    return stamp


def read_stamp(root: Path) -> dict | None:
    """``root/.carry/source.json``, or None when there is none.

    Raises:
        ValueError: the file is not a stamp (with what is wrong).
    """
    path = root / STAMP
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not (isinstance(data, dict) and isinstance(data.get("commit"), str)
            and isinstance(data.get("files"), dict)):
        raise ValueError("expected {commit, digest, files}")
    return data


def check_stamp(root: Path, stamp: dict) -> dict:
    """Whether the source files in ``root`` are exactly ``stamp``'s: ``{"commit",
    "matches", "note"}``, ``note`` naming the first difference (changed, missing, extra)."""
    here = hashes(root, source_files(root))
    want = stamp["files"]
    if here == want:
        return {"commit": stamp["commit"], "matches": True,
                "note": f"{len(here)} source files are commit {stamp['commit']}'s"}
    differ = sorted(({p for p in here if p in want and here[p] != want[p]}
                     | (set(here) ^ set(want))), key=lambda p: p.encode())
    first = differ[0]
    how = "changed" if first in here and first in want else "missing" if first in want else \
        "extra"
    return {"commit": stamp["commit"], "matches": False,
            "note": f"{len(differ)} source file(s) differ from commit {stamp['commit']}'s "
                    f"stamp (first: {first}, {how})"}


def apply_stamp(root: Path, environ: dict) -> dict:
    """Check ``root``'s stamp (if any) and, when it matches, set ``GATE_RESIDUAL_COMMIT``
    and ``GATE_RESIDUAL_DIRTY=0`` in ``environ``; returns ``{"commit", "matches", "note"}``
    for steps.json (``matches`` None: no stamp or an unreadable one)."""
    try:
        stamp = read_stamp(root)
    except (OSError, ValueError) as err:
        return {"commit": None, "matches": None, "note": f"{STAMP} unreadable: {err}"}
    if stamp is None:
        return {"commit": None, "matches": None, "note": f"no {STAMP}: reports say what git "
                                                         "says here"}
    checked = check_stamp(root, stamp)
    if checked["matches"]:
        environ["GATE_RESIDUAL_COMMIT"] = stamp["commit"]
        environ["GATE_RESIDUAL_DIRTY"] = "0"
    else:
        checked["note"] += ": reports say what git says here"
    return checked
