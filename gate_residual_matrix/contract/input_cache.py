"""An on-disk cache of input values shared by the cell processes of one host.

A case's float32 values are a pure function of their stream (:mod:`contract.inputs`: the
stream keys, the count and the table of special values), the same in every dtype (each
dtype rounds them) and in every mode. On a GPU host every mode's cell builds the same
cases again, each in several processes (one per dtype group), and the values of one large
tensor cost seconds of CPU each time (at N = 32768 and D = 5376, 176M SplitMix64 words).
With ``GATE_RESIDUAL_INPUT_CACHE`` naming a folder, the first process to build a large
tensor's values stores them there (``.npy``, written to a temporary file, flushed to disk
and renamed, so a reader sees a whole file or none) and the others read them back.

The file's name is a sha256 of the stream's arguments and of the source of the module that
computes the values, so a change to how values are made never reads an older file. A file
that cannot be read, holds another shape or dtype, or whose first, middle or last values
differ from the same values computed alone is removed and computed again; a folder that
cannot be written costs time, never bits. Nothing is evicted: the folder is a build
folder (the GPU host's ``build/inputs``). Only the computation is skipped: what a cell
hashes, records and runs are the same bits (``tests/test_inputs.py`` checks a cached build
against a fresh one).

Example::

    >>> values = cached(key, pick_key, count, table, compute, source, sample)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
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
           source: Callable[[], bytes],
           sample: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """``compute(key, pick_key, count, table)`` (a float32 array of ``count`` values), read
    from the cache folder when a process stored it there, else computed and stored (see
    module). ``source()``: the bytes of the module that defines ``compute`` (read only when
    the cache is on); ``sample(start, n)``: values ``start .. start + n`` computed alone, to
    check a file against (:func:`_checked`)."""
    where = folder()
    if where is None or count < AT_LEAST:
        return compute(key, pick_key, count, table)
    path = where / file_for(source(), key, pick_key, count, table)
    values = _read(path, count, sample)
    if values is not None:
        return values
    values = compute(key, pick_key, count, table)
    _store(where, path, values)
    return values


SAMPLE = 256
"""Values :func:`_checked` computes at each of a file's three places."""


def _read(path: Path, count: int, sample: Callable[[int, int], np.ndarray]) -> np.ndarray | None:
    """The values in ``path``, or None when it is missing or is not ``count`` float32 values
    that pass :func:`_checked` (then it is removed: the caller computes and stores them)."""
    try:
        values = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except Exception:  # empty, truncated or not an .npy file: computed again
        values = None
    if (isinstance(values, np.ndarray) and values.dtype == np.float32
            and values.shape == (count,) and _checked(values, sample)):
        return values
    with contextlib.suppress(OSError):  # a folder that is not one: nothing to remove
        path.unlink(missing_ok=True)
    return None


def _checked(values: np.ndarray, sample: Callable[[int, int], np.ndarray]) -> bool:
    """Whether the first, middle and last :data:`SAMPLE` values have the bits ``sample``
    computes for those places: a file torn or zeroed in part (a crash, a full disk) is
    caught where it most likely is, at its end."""
    n = min(SAMPLE, values.size)
    starts = sorted({0, (values.size - n) // 2, values.size - n})
    return all(np.array_equal(values[a:a + n].view(np.uint32), sample(a, n).view(np.uint32))
               for a in starts)


def _store(where: Path, path: Path, values: np.ndarray) -> None:
    """Write ``values`` to ``path`` whole or not at all: a temporary file of a unique name in
    the folder, flushed to disk, then renamed. A folder that cannot be written (full, read
    only) leaves no file; the values are the same."""
    tmp = None
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=path.name + ".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, values, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
