"""A wheel's RECORD and file digests, the wheelhouse's layout (its root, its manifests) and
its error: shared by the wheelhouse builder (:mod:`runner.wheelhouse`), its compiled extension
files (:mod:`contract.extension_files`) and the loaders that check what they load against
RECORD."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
from pathlib import Path

from gate_residual_matrix import settings

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = PROJECT_ROOT / ".carry" / "kernel-wheelhouse"
ENV_ROOT = "GATE_RESIDUAL_WHEELHOUSE"


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


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def manifest_path(root: Path, distribution: str, version: str) -> Path:
    """Where the manifest of ``distribution`` ``version`` lives under ``root``."""
    return root / "manifests" / f"{distribution}-{version}.json"


def resolve_root(configured: str | os.PathLike | None = None) -> Path:
    """The wheelhouse root: ``$GATE_RESIDUAL_WHEELHOUSE``, else ``configured`` (relative to
    the project root), else :data:`DEFAULT_ROOT`."""
    value = settings.get(ENV_ROOT) or configured
    if not value:
        return DEFAULT_ROOT
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path
