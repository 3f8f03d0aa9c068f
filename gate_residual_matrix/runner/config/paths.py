"""The path options (``--matrix``, ``--reports``, ``--out``) checked before anything is
read or written: an empty string is not the current folder, a folder of reports and tables
is a folder, and no run writes its tables over a project's own files.

Example::

    >>> output_folder(Path("reports"), "--reports")
    PosixPath('reports')
    >>> nonempty_path("")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: expected a path, got an empty string
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.untrusted.names import shown

PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "noxfile.py")
"""Files that mark a project's root folder: a folder holding one is never written into
(the tables' README.md would replace the project's)."""
PROJECT_ROOT = Path(__file__).resolve().parents[3]
"""This project's root (as :data:`runner.cell.environment.PROJECT_ROOT`, without importing
torch)."""


def nonempty_path(text: str) -> Path:
    """``argparse`` type of the path options: ``text`` as a path, refused when empty
    (``Path("")`` is the current folder, where a run would write over what is there).

    Raises:
        argparse.ArgumentTypeError: ``text`` is empty or only spaces.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def output_folder(path: Path, option: str) -> Path:
    """``path`` if it can be the folder that reports and tables are written to: it need not
    exist, but if it does it is a folder (symlinks followed); it is not the project's root,
    a folder above it, or a folder holding any of :data:`PROJECT_MARKERS`.

    Raises:
        ConfigError: one line naming ``option`` and the path.
    """
    name = shown(str(path))
    if not str(path).strip():
        raise ConfigError(f"{option}: expected a folder, got an empty string")
    try:
        real = Path(os.path.realpath(path, strict=False))
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ConfigError(f"{option}: cannot resolve {name}: {err}") from err
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            kind = "a broken or looping symlink" if not path.exists() else "not a folder"
            raise ConfigError(f"{option}: expected a folder for reports and tables, got {name} "
                              f"({kind})")
    root = PROJECT_ROOT.resolve()
    if real == root or real in root.parents:
        raise ConfigError(f"{option}: expected a folder of reports, got {name}, the project's "
                          "own folder (its README.md would be replaced); use reports/ or a "
                          "new folder")
    marker = next((m for m in PROJECT_MARKERS if (real / m).exists()), None)
    if marker is not None:
        raise ConfigError(f"{option}: expected a folder of reports, got {name}, which holds "
                          f"{marker} (a project's root: its README.md would be replaced); "
                          "use a folder of its own")
    return path
