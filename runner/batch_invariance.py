"""Batch invariance: does a row's result depend on what else is in the batch?

Three checks for an implementation with a backward, on one case's inputs (the checks its
users rely on; issue 4):

- ``row_alone``: a few rows (first, second, middle, last but one, last), each run alone,
  give the same bits as in the full batch: ``out`` and the row gradients ``res`` and ``y``.
- ``sub_batches``: sub-batches that cover the batch (boundaries at 1, 8 and N/2 + 1), run
  one by one and concatenated, give the full batch's ``out``, ``res`` and ``y``.
- ``size_sweep``: for every size ``s`` of :func:`sweep_sizes` up to ``M = min(N,
  max_size)``, the first ``s`` rows run alone give the ``out``, ``res`` and ``y`` of the
  first ``M`` rows run together; and ``grad_gate`` of the ``s`` rows equals ``grad_gate`` of
  the ``M`` rows with rows ``s..M`` made to contribute exact zeros (``y`` and ``grad_out``
  zeroed there), i.e. the reduction does not depend on how many rows surround it.
  ``first_failing_size`` is the smallest ``s`` that fails (None when none does).

Bits are compared as integers (:func:`runner.compare.bits`), NaN payloads included.

Example::

    >>> sweep_sizes(40)
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 31, 33]
"""

from __future__ import annotations

import itertools

import torch

from runner import compare

ROW_TENSORS = ("out", "res", "y")
_PER_ROW = ("residual", "y", "index", "grad_out")


def sweep_sizes(limit: int) -> list[int]:
    """1..9, then 2^k - 1 and 2^k + 1 for k >= 4, all <= ``limit``, ascending."""
    sizes = set(range(1, 10))
    k = 4
    while (1 << k) - 1 <= limit:
        sizes.update({(1 << k) - 1, (1 << k) + 1})
        k += 1
    return sorted(s for s in sizes if s <= limit)


def _cuts(n: int) -> list[int]:
    """Boundaries of :func:`sub_batches`' parts: 0, 1, 8, N/2 + 1 and N (as far as N goes)."""
    return sorted({0, min(1, n), min(8, n), n // 2 + 1 if n > 1 else n, n})


def row_counts(n: int, max_size: int) -> set[int]:
    """Every batch size (rows) :func:`check` calls the implementation with on an N-row case:
    what a compiler that specialises on shapes compiles for it (runner/precompile.py)."""
    m = min(n, max_size)
    parts = {b - a for a, b in itertools.pairwise(_cuts(n)) if b > a}
    return {s for s in ({1} | parts | {m} | set(sweep_sizes(m))) if s > 0}


def _rows(inputs: dict, start: int, stop: int) -> dict:
    """The inputs of rows ``start:stop`` (the whole gate), contiguous copies."""
    return {k: (v[start:stop] if k in _PER_ROW else v).clone().contiguous()
            for k, v in inputs.items()}


def _run(impl, inputs: dict) -> dict:
    got = impl.run({k: v.clone() for k, v in inputs.items()}, backward=True)
    return {k: v.detach() for k, v in got.items()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(compare.bits(a), compare.bits(b))


def _rows_equal(part: dict, whole: dict, start: int, stop: int) -> bool:
    return all(_same(part[k], whole[k][start:stop]) for k in ROW_TENSORS if k in part)


def row_alone(impl, inputs: dict, full: dict) -> bool:
    """Whether each sampled row run alone equals that row within ``full`` (see module)."""
    n = inputs["residual"].shape[0]
    rows = sorted({r for r in (0, 1, n // 2, n - 2, n - 1) if 0 <= r < n})
    return all(_rows_equal(_run(impl, _rows(inputs, r, r + 1)), full, r, r + 1) for r in rows)


def sub_batches(impl, inputs: dict, full: dict) -> bool:
    """Whether sub-batches covering the batch, concatenated, equal ``full`` (see module)."""
    n = inputs["residual"].shape[0]
    cuts = _cuts(n)
    parts = [_run(impl, _rows(inputs, a, b)) for a, b in itertools.pairwise(cuts) if b > a]
    return all(_same(torch.cat([p[k] for p in parts]), full[k])
               for k in ROW_TENSORS if k in full)


def size_sweep(impl, inputs: dict, max_size: int) -> int | None:
    """The smallest sweep size that breaks the size sweep (see module), or None."""
    m = min(inputs["residual"].shape[0], max_size)
    top = _rows(inputs, 0, m)
    whole = _run(impl, top)
    for s in sweep_sizes(m):
        prefix = _run(impl, _rows(inputs, 0, s))
        if not _rows_equal(prefix, whole, 0, s):
            return s
        if "gate" in prefix:
            padded = dict(top)
            for k in ("y", "grad_out"):
                padded[k] = top[k].clone()
                padded[k][s:] = 0
            if not _same(prefix["gate"], _run(impl, padded)["gate"]):
                return s
    return None


def check(impl, inputs: dict, *, max_size: int = 1025, full: dict | None = None) -> dict:
    """The three checks for one case: ``{"row_alone": bool, "sub_batches": bool,
    "size_sweep": bool, "first_failing_size": int | None, "max_size": M}``.

    ``impl`` must have a backward; ``inputs`` as :meth:`Implementation.run` takes them.
    ``full``: the outputs of one forward+backward call of ``impl`` on the whole of
    ``inputs`` (fresh clones) when the caller has them already (the cell's first repeat);
    else that call is made here.
    """
    if full is None:
        full = _run(impl, inputs)
    first = size_sweep(impl, inputs, max_size)
    return {"row_alone": row_alone(impl, inputs, full),
            "sub_batches": sub_batches(impl, inputs, full),
            "size_sweep": first is None, "first_failing_size": first,
            "max_size": min(inputs["residual"].shape[0], max_size)}
