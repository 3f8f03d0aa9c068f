"""A wheel's RECORD and file digests, and the wheelhouse's error: shared by the wheelhouse
(:mod:`runner.wheelhouse`), its compiled extension files (:mod:`runner.extension_files`) and
the loaders that check what they load against RECORD."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from pathlib import Path


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
