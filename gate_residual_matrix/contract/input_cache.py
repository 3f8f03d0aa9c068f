"""An on-disk cache of input values shared by the cell processes of one host.

A case's float32 values are a pure function of their stream (:mod:`contract.inputs`: the
stream keys, the count and the table of special values), the same in every dtype (each
dtype rounds them) and in every mode. On a GPU host every mode's cell builds the same
cases again, each in several processes (one per dtype group), and the values of one large
tensor cost seconds of CPU each time (at N = 32768 and D = 5376, 176M SplitMix64 words).
With ``GATE_RESIDUAL_INPUT_CACHE`` naming a folder, the first process to build a large
tensor's values stores them there (``.npy``, written to a temporary name and renamed, so a
reader sees a whole file or none) and the others read them back.

The file's name is a sha256 of the stream's arguments and of the source of the module that
computes the values, so a change to how values are made never reads an older file. A file
that cannot be read, or holds another shape or dtype, is computed again; a folder that
cannot be written costs time, never bits. Only the computation is skipped: what a cell
hashes, records and runs are the same bits (``tests/test_inputs.py`` checks a cached build
against a fresh one).

Example::

    >>> values = cached(key, pick_key, count, table, compute)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gate_residual_matrix import settings

ENV = "GATE_RESIDUAL_INPUT_CACHE"

AT_LEAST = 1 << 20
"""Tensors with fewer elements are computed each time (milliseconds: not worth a file)."""


def folder() -> Path | None:
    """The cache folder (``GATE_RESIDUAL_INPUT_CACHE``), or None: no cache."""
    raw = settings.get(ENV)
    return Path(raw) if raw else None


def file_for(source: bytes, key: int, pick_key: int, count: int,
             table: np.ndarray | None) -> str:
    """The file name of one stream's values: a sha256 of ``source`` (the computing module's
    code), the stream keys, the count and the special values' bytes (None: no specials)."""
    digest = hashlib.sha256(source)
    digest.update(f"{key}/{pick_key}/{count}/".encode())
    digest.update(b"-" if table is None else table.astype("<f8").tobytes())
    return digest.hexdigest()[:40] + ".npy"


def cached(key: int, pick_key: int, count: int, table: np.ndarray | None,
           compute: Callable[[int, int, int, np.ndarray | None], np.ndarray],
           source: bytes) -> np.ndarray:
    """``compute(key, pick_key, count, table)`` (a float32 array of ``count`` values), read
    from the cache folder when a process stored it there, else computed and stored (see
    module). ``source``: the bytes of the module that defines ``compute``."""
    where = folder()
    if where is None or count < AT_LEAST:
        return compute(key, pick_key, count, table)
    path = where / file_for(source, key, pick_key, count, table)
    try:
        values = np.load(path, allow_pickle=False)
        if values.dtype == np.float32 and values.shape == (count,):
            return values
    except (OSError, ValueError):  # not there yet, or unreadable: computed again
        pass
    values = compute(key, pick_key, count, table)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        where.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.save(f, values, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:  # a full disk or a read-only folder: no file, the same values
        tmp.unlink(missing_ok=True)
    return values
