"""The indexed ops' chunked float32 sums: where the element backward keeps its accumulators.

gate_residual's ``grad_gate`` and indexed_scale_shift's ``grad_scale`` / ``grad_shift`` are
float32 sums over the rows of consecutive chunks of ``CHUNK_ROWS`` rows, then over the chunks
(each op's ``SUMMATION_ORDER``). Their element ``backward_chunks`` kernels
(:mod:`kernels.gate_residual_kernels`, :mod:`kernels.indexed_scale_shift`) hold one float32
accumulator per parameter row r and column, in one of two places, chosen by
:func:`accumulator_slots`:

* shared memory (``in_shared``): slot r of a thread at ``r * blockDim.x + threadIdx.x``, each
  thread owning its slots, so no barrier; ``flush`` copies them to ``partial[chunk]``;
* ``partial`` itself (parameter rows too many for shared memory): slot r at
  ``partial[chunk, r, col]``; ``flush`` does nothing.

Same operations in the same order either way: the same bits. :func:`bad_index_value` is the
value a kernel stores for a row whose index is outside [0, G) (the canonical NaN
``add.rn.f32`` returns), :func:`chunk_count` the number of chunks N rows split into.

Example::

    >>> accumulators, slot, flush = accumulator_slots(in_shared=True)   # doctest: +SKIP
    >>> chunk_count(257, 128)
    3
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gate_residual_matrix.kernels.rounding import add_rn


def accumulator_slots(in_shared: bool) -> tuple:
    """Device functions ``(accumulators, slot, flush)`` for accumulators in shared memory
    (``in_shared``) or in the float32 ``partial`` (chunks, rows, D) buffer.

    ``accumulators(partial)`` is the array the sums live in; ``acc[slot(chunk, r, col, tx,
    width)]`` is accumulator r of column ``col`` (thread ``tx`` of a block ``width`` wide);
    ``flush(partial, acc, chunk, n_slots, col, tx, width)`` leaves the chunk's ``n_slots`` sums
    in ``partial[chunk, :, col]``.
    """
    if in_shared:
        @cuda.jit(device=True, inline="always")
        def accumulators(partial):
            return cuda.shared.array(0, dtype=float32)

        @cuda.jit(device=True, inline="always")
        def slot(chunk, r, col, tx, width):
            return r * width + tx

        @cuda.jit(device=True, inline="always")
        def flush(partial, acc, chunk, n_slots, col, tx, width):
            for r in range(n_slots):
                partial[chunk, r, col] = acc[r * width + tx]
    else:
        @cuda.jit(device=True, inline="always")
        def accumulators(partial):
            return partial

        @cuda.jit(device=True, inline="always")
        def slot(chunk, r, col, tx, width):
            return chunk, r, col

        @cuda.jit(device=True, inline="always")
        def flush(partial, acc, chunk, n_slots, col, tx, width):
            pass

    return accumulators, slot, flush


@cuda.jit(device=True, inline="always")
def bad_index_value():
    """float32 NaN as ``add.rn.f32`` makes it (canonical): the value of a bad index's row."""
    return add_rn(float32(np.nan), float32(0.0))


def chunk_count(n_rows: int, chunk_rows: int) -> int:
    """Number of ``chunk_rows``-row chunks N rows split into (the last one may be short)."""
    return -(-n_rows // chunk_rows)


__all__ = ["accumulator_slots", "bad_index_value", "chunk_count"]
