"""Launch shapes of the element kernels: one element per thread, rows (or chunks) on grid.y.

Shared by every op's numba.cuda kernels. Grid and block shapes change which thread computes
what, never an operation or its order: the bits of every kernel are independent of them (the
simulator tests run two launch shapes per case and compare bits).

The chunked reductions keep, per thread, one float32 accumulator per (parameter row, lane) in
shared memory; :func:`block_cols_for` narrows the block until they fit in
:data:`MAX_SHARED_BYTES`, and :func:`shared_fits` tells a launcher when even 32 threads do not
(it then uses a kernel that accumulates in global memory, in the same order).
"""

from __future__ import annotations

import math

#: Threads per block along the columns.
BLOCK_COLS = 128
#: Dynamic shared memory per block for the reductions' accumulators, bytes (portable limit).
MAX_SHARED_BYTES = 48 * 1024
#: Largest grid.y: the hardware limit is 65535; rows (or chunks) beyond it are looped.
MAX_GRID_Y = 65535


def pick_width(units: int, cap: int) -> int:
    """Threads per block (a multiple of 32, at most ``cap``) that covers ``units`` with the
    fewest idle threads; ties go to the larger block. Launch shape only: bits never depend
    on it."""
    best, best_waste = 32, None
    for width in range(32, cap + 1, 32):
        waste = -(-units // width) * width - units
        if best_waste is None or waste <= best_waste:
            best, best_waste = width, waste
    return best


def block_cols_for(n_accumulators: int) -> int:
    """Threads per block so that ``n_accumulators`` float32 per thread fit in shared memory.

    Raises ``ValueError`` when more than MAX_SHARED_BYTES / (4 * 32) = 384 accumulators per
    thread are asked for (see :func:`shared_fits`).
    """
    width = BLOCK_COLS
    while width > 32 and n_accumulators * width * 4 > MAX_SHARED_BYTES:
        width //= 2
    if n_accumulators * width * 4 > MAX_SHARED_BYTES:
        raise ValueError(
            f"{n_accumulators} float32 accumulators per thread (gate rows x lanes) exceed the "
            f"{MAX_SHARED_BYTES // (4 * 32)} that fit in shared memory"
        )
    return width


def forward_geometry(n_rows: int, width: int, block_cols: int = BLOCK_COLS,
                     max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int]:
    """(grid, block) of an element kernel over (n_rows, width): one element per thread."""
    return (math.ceil(width / block_cols), min(n_rows, max_grid_y)), block_cols


def backward_geometry(chunks: int, width: int, n_accumulators: int,
                      block_cols: int | None = None,
                      max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int, int]:
    """(grid, block, shared bytes) of a chunked element reduction with ``n_accumulators``
    float32 per thread in shared memory."""
    cols = block_cols or block_cols_for(n_accumulators)
    return (math.ceil(width / cols), min(chunks, max_grid_y)), cols, n_accumulators * cols * 4


def shared_fits(n_accumulators: int) -> bool:
    """Whether ``n_accumulators`` float32 per thread fit in shared memory at 32 threads."""
    return n_accumulators * 32 * 4 <= MAX_SHARED_BYTES


def reduce_geometry(numel: int) -> tuple[int, int]:
    """(grid, block) of a chunk reduction: one thread per output element."""
    return max(1, math.ceil(numel / 256)), 256


__all__ = ["BLOCK_COLS", "MAX_GRID_Y", "MAX_SHARED_BYTES", "backward_geometry",
           "block_cols_for", "forward_geometry", "pick_width", "reduce_geometry", "shared_fits"]
