"""gate_residual's numba.cuda kernels, their launch geometry and their simulator launchers.

    out = residual + gate.index_select(0, index) * y

Shapes: ``residual``, ``y``, ``out``: (N, D); ``gate``: (G, D); ``index``: (N,) int64 or int32
in [0, G). Storage dtypes: bfloat16, float16, float32. Backward, for upstream ``grad_out``
(N, D): ``grad_residual = grad_out`` (the same tensor, as autograd passes it through an add);
``grad_y = gate[index] * grad_out``; ``grad_gate[k] = sum over rows i with index[i] == k of
grad_out[i] * y[i]``.

Bits (see ``kernels/rounding.py`` and ``../shared/NOTES.md``):

* forward and ``grad_y`` follow eager PyTorch: the product is rounded to the storage dtype,
  then the sum is computed in float32 and rounded again. No FMA contraction.
* ``grad_gate`` is accumulated in float32 in the fixed order of :data:`SUMMATION_ORDER`,
  then rounded once to the storage dtype. The order depends only on N and
  :data:`CHUNK_ROWS` (a constant of the algorithm), never on the GPU, the block size, the
  grid or timing; there are no atomics. ``kernels/gate_residual_cpu.py`` runs the same
  order on the CPU and gives the same bits.

The 16-byte-vector kernels (the forward, the chunked backward, and the fused backward that
finishes ``grad_gate`` in the last block of each column block, in one launch for up to
:data:`FUSED_MAX_CHUNKS` chunks) are built in :mod:`kernels.gate_residual_vec`, with the same
operations in the same order.

An index outside [0, G) goes to :func:`kernels.device_assert.index_fault` (a device-side
assert, or a NaN row, as the launch's flag says). The torch entry points and the autograd
Function are in :mod:`kernels.gate_residual`; how they pack and launch these kernels, in
:mod:`kernels.gate_residual_plans`. The launchers here (``launch_forward`` ...) take numba or
numpy arrays and go through numba's dispatcher: the CUDA simulator's path (CI).

Example::

    >>> launch_forward(out, residual, gate, y, index, "float32")   # doctest: +SKIP
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from gate_residual_matrix.kernels.chunk_sums import accumulator_slots, bad_index_value, chunk_count
from gate_residual_matrix.kernels.device_assert import index_fault
from gate_residual_matrix.kernels.gate_residual_vec import make_vec_kernels
from gate_residual_matrix.kernels.geometry import (
    BLOCK_COLS,
    MAX_GRID_Y,
    backward_geometry,
    block_cols_for,
    forward_geometry,
    pick_width,
    reduce_geometry,
    shared_fits,
)
from gate_residual_matrix.kernels.rounding import CODECS, LANE_CODECS, add_rn, mul_rn

#: Rows per chunk of the grad_gate reduction. Part of the algorithm (it fixes the summation
#: order), not a launch parameter.
CHUNK_ROWS = 128

SUMMATION_ORDER = (
    "grad_gate[k, d]: rows are split into consecutive chunks of CHUNK_ROWS=128; within a "
    "chunk, s = +0.0 then s = fadd_rn(s, fmul_rn(grad_out[i, d], y[i, d])) for rows i with "
    "index[i] == k in increasing i; then t = +0.0 and t = fadd_rn(t, s_c) over chunks c in "
    "increasing c; float32 throughout; t rounded once to the storage dtype."
)

def _make_element_backward(load, store, in_shared: bool):
    """The element backward_chunks kernel, with its accumulators (one float32 per gate row
    per thread) in shared memory (``in_shared``) or in ``partial`` itself (for G too large
    for shared memory): :func:`kernels.chunk_sums.accumulator_slots`. Same operations in the
    same order either way: the same bits."""
    accumulators, slot, flush = accumulator_slots(in_shared)

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index, flag):
        # grid: x over column blocks, y over chunks of CHUNK_ROWS rows (strided)
        acc = accumulators(partial)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        col = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        if col >= grad_out.shape[1]:
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            for k in range(n_gate):
                acc[slot(chunk, k, col, tx, width)] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            for i in range(start, stop):
                k = index[i]
                if k < 0 or k >= n_gate:
                    index_fault(flag)
                    grad_y[i, col] = store(bad_index_value())
                    continue
                go = load(grad_out[i, col])
                grad_y[i, col] = store(mul_rn(go, load(gate[k, col])))
                s = slot(chunk, k, col, tx, width)
                acc[s] = add_rn(acc[s], mul_rn(go, load(y[i, col])))
            flush(partial, acc, chunk, n_gate, col, tx, width)
            chunk += cuda.gridDim.y

    return backward_chunks


def _make_kernels(load, store):
    """Build the element kernels for one storage dtype's ``load``/``store`` device functions."""

    @cuda.jit
    def forward(out, residual, gate, y, index, flag):
        # grid: x over column blocks, y over rows (strided when N > MAX_GRID_Y); ``flag``
        # (uint8, 1 element) is set to 0 on an index outside [0, G), whose row is NaN
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col >= out.shape[1]:
            return
        row = cuda.blockIdx.y
        while row < out.shape[0]:
            k = index[row]
            if k < 0 or k >= gate.shape[0]:
                index_fault(flag)
                out[row, col] = store(bad_index_value())
            else:
                product = store(mul_rn(load(gate[k, col]), load(y[row, col])))
                out[row, col] = store(add_rn(load(residual[row, col]), load(product)))
            row += cuda.gridDim.y

    @cuda.jit
    def reduce_chunks(grad_gate, partial):
        # one thread per (k, d) element of grad_gate; chunks summed in increasing order
        flat = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n_gate = grad_gate.shape[0]
        width = grad_gate.shape[1]
        if flat >= n_gate * width:
            return
        k = flat // width
        col = flat - k * width
        # Software-pipelined: the next eight chunks' loads are issued before the previous
        # eight are added (16 loads in flight per thread; the additions stay in chunk order)
        total = float32(0.0)
        chunks = partial.shape[0]
        c = 0
        if chunks >= 8:
            p0 = partial[0, k, col]
            p1 = partial[1, k, col]
            p2 = partial[2, k, col]
            p3 = partial[3, k, col]
            p4 = partial[4, k, col]
            p5 = partial[5, k, col]
            p6 = partial[6, k, col]
            p7 = partial[7, k, col]
            c = 8
            while c + 8 <= chunks:
                n0 = partial[c, k, col]
                n1 = partial[c + 1, k, col]
                n2 = partial[c + 2, k, col]
                n3 = partial[c + 3, k, col]
                n4 = partial[c + 4, k, col]
                n5 = partial[c + 5, k, col]
                n6 = partial[c + 6, k, col]
                n7 = partial[c + 7, k, col]
                total = add_rn(add_rn(add_rn(add_rn(total, p0), p1), p2), p3)
                total = add_rn(add_rn(add_rn(add_rn(total, p4), p5), p6), p7)
                p0, p1, p2, p3, p4, p5, p6, p7 = n0, n1, n2, n3, n4, n5, n6, n7
                c += 8
            total = add_rn(add_rn(add_rn(add_rn(total, p0), p1), p2), p3)
            total = add_rn(add_rn(add_rn(add_rn(total, p4), p5), p6), p7)
        while c < chunks:
            total = add_rn(total, partial[c, k, col])
            c += 1
        grad_gate[k, col] = store(total)

    backward_chunks = _make_element_backward(load, store, in_shared=True)
    backward_chunks_global = _make_element_backward(load, store, in_shared=False)
    return forward, backward_chunks, reduce_chunks, backward_chunks_global


_KERNELS: dict[str, tuple] = {}
_VEC_KERNELS: dict[str, tuple] = {}

#: Most chunks for which the backward runs as one launch (``backward_fused``,
#: kernels/gate_residual_vec.py); above it, ``backward_chunks`` then ``reduce_chunks``. Launch
#: choice only: the same bits. 1 (N <= CHUNK_ROWS), measured: with one chunk the launch is
#: all (H200, kernel-only: 5.5 µs against 6.5 µs for the two launches); from two chunks the
#: last block's serial sum costs more than the second launch saves (2 chunks: 62.9 against
#: 53.8 µs; 8 chunks: 86.1 against 54.2 µs; scripts/backward_ab.py, docs/performance.md).
FUSED_MAX_CHUNKS = 1
#: Threads per block of the vector backward: 32 (one warp), so that up to 32 blocks (1024
#: threads) share an SM instead of 8 of 96 threads (bf16, G = 9: shared memory bound);
#: measured at N = 32768 bf16 on the H200: 335.0 µs against 343.8 µs for 96 threads, the same
#: bits (scripts/backward_ab.py). Launch shape only.
BACKWARD_VEC_BLOCK = 32

#: Rows per loop step of the vectorised forward (its loop body is written for two).
FORWARD_ROWS_PER_STEP = 2
#: grid.y cap of the vectorised forward: a block walks N / (cap * rows per step) steps.
FORWARD_MAX_GRID_Y = 8192


def vec_kernels_for(dtype: str):
    """The (forward, backward_chunks, backward_fused) 16-byte-vector numba.cuda kernels for a
    storage dtype (:mod:`kernels.gate_residual_vec`).

    Raises ``KeyError`` for an unknown dtype.
    """
    if dtype not in _VEC_KERNELS:
        _VEC_KERNELS[dtype] = make_vec_kernels(*LANE_CODECS[dtype], CHUNK_ROWS)
    return _VEC_KERNELS[dtype]


def kernels_for(dtype: str):
    """The (forward, backward_chunks, reduce_chunks, backward_chunks_global) element
    numba.cuda kernels for a dtype (the last for G too large for shared memory).

    ``dtype`` is ``"bfloat16"``, ``"float16"`` or ``"float32"``; kernels are built once per
    process and compiled by numba on first launch for each argument type signature.
    Raises ``KeyError`` for any other dtype.
    """
    if dtype not in _KERNELS:
        load, store, _ = CODECS[dtype]
        _KERNELS[dtype] = _make_kernels(load, store)
    return _KERNELS[dtype]


def n_chunks(n_rows: int) -> int:
    """Number of CHUNK_ROWS-row chunks the grad_gate reduction splits N rows into."""
    return chunk_count(n_rows, CHUNK_ROWS)


# --------------------------------------------------------------------------- launch geometry
# Grid and block shapes change which thread computes what, never an operation or its order.


def forward_vec_geometry(n_rows: int, vectors: int, block_cols: int | None = None,
                         max_grid_y: int = FORWARD_MAX_GRID_Y) -> tuple[tuple, int]:
    """(grid, block) of the vectorised forward: one 16-byte vector per thread, a block of
    :data:`FORWARD_ROWS_PER_STEP` rows per grid.y step. ``vectors``: 16-byte vectors per row."""
    width = block_cols or pick_width(vectors, 256)
    steps = -(-n_rows // FORWARD_ROWS_PER_STEP)
    return (math.ceil(vectors / width), max(1, min(steps, max_grid_y))), width


def backward_vec_geometry(chunks: int, vectors: int, n_gate: int, lanes: int,
                          block_cols: int | None = None,
                          max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int, int]:
    """(grid, block, shared bytes) of the vectorised backward: one vector per thread, a
    chunk per grid.y step, G * lanes float32 accumulators per thread in shared memory."""
    block_cols_for(n_gate * lanes)  # ValueError where not even 32 threads' sums fit
    width = block_cols or BACKWARD_VEC_BLOCK
    return (math.ceil(vectors / width), min(chunks, max_grid_y)), width, n_gate * lanes * width * 4


def _flag_array():
    return np.ones(1, dtype=np.uint8)


# ------------------------------------------------ launches on numba/numpy arrays (simulator)


def launch_forward_vec(out, residual, gate, y, index, dtype: str, stream=0, *, flag=None,
                       block_cols: int | None = None,
                       max_grid_y: int = FORWARD_MAX_GRID_Y) -> None:
    """Vectorised forward on uint32 views: ``out``/``residual``/``y`` (N, W), ``gate`` (G,
    W), W = D * itemsize / 4 (a multiple of 4). ``flag``: uint8 (1,), set to 0 on an index
    outside [0, G). ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_vec_geometry(out.shape[0], out.shape[1] // 4, block_cols,
                                       max_grid_y)
    flag = _flag_array() if flag is None else flag
    vec_kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index, flag)


def launch_backward_vec(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                        stream=0, *, flag=None, block_cols: int | None = None,
                        max_grid_y: int = MAX_GRID_Y, fused: bool = False,
                        tickets=None) -> None:
    """Vectorised backward on uint32 views (``grad_gate`` and the float32 ``partial``
    (chunks, G, D) are element arrays), then the chunk reduction. ``fused``: one launch of
    ``backward_fused`` instead (any number of chunks here, for the tests; ``grad_gate`` as
    element array, ``tickets``: uint32 zeros, one per column block, default fresh zeros)."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    flag = _flag_array() if flag is None else flag
    lanes = 4 * LANE_CODECS[dtype][3]
    if partial.shape[0]:
        grid, block, shared = backward_vec_geometry(partial.shape[0], grad_out.shape[1] // 4,
                                                    gate.shape[0], lanes, block_cols,
                                                    max_grid_y)
        if fused:
            tickets = np.zeros(grid[0], dtype=np.uint32) if tickets is None else tickets
            words = partial.reshape(partial.shape[0] * partial.shape[1], -1).view(np.uint32)
            gate_words = grad_gate.view(np.uint32)
            vec_kernels_for(dtype)[2][grid, block, stream, shared](
                grad_y, gate_words, words, tickets, grad_out, gate, y, index, flag)
            return
        vec_kernels_for(dtype)[1][grid, block, stream, shared](
            grad_y, partial, grad_out, gate, y, index, flag)
    grid, block = reduce_geometry(grad_gate.size)
    kernels_for(dtype)[2][grid, block, stream](grad_gate, partial)


def launch_forward(out, residual, gate, y, index, dtype: str, stream=0, *, flag=None,
                   block_cols: int = BLOCK_COLS, max_grid_y: int = MAX_GRID_Y) -> None:
    """Element forward on element arrays (bfloat16 as int16 bits); shapes as in the module
    docstring. ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_geometry(*out.shape, block_cols, max_grid_y)
    flag = _flag_array() if flag is None else flag
    kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index, flag)


def launch_backward(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                    stream=0, *, flag=None, block_cols: int | None = None,
                    max_grid_y: int = MAX_GRID_Y) -> None:
    """Element backward: writes ``grad_y`` (N, D) and ``grad_gate`` (G, D) in full
    (``grad_gate`` is +0.0 where no row selects a gate row); ``partial`` is float32 scratch
    (n_chunks(N), G, D)."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    _, backward_chunks, reduce_chunks, backward_global = kernels_for(dtype)
    flag = _flag_array() if flag is None else flag
    if partial.shape[0] and shared_fits(gate.shape[0]):
        grid, block, shared = backward_geometry(partial.shape[0], grad_out.shape[1],
                                                gate.shape[0], block_cols, max_grid_y)
        backward_chunks[grid, block, stream, shared](grad_y, partial, grad_out, gate, y, index,
                                                     flag)
    elif partial.shape[0]:
        grid, block = forward_geometry(partial.shape[0], grad_out.shape[1],
                                       block_cols or BLOCK_COLS, max_grid_y)
        backward_global[grid, block, stream](grad_y, partial, grad_out, gate, y, index, flag)
    grid, block = reduce_geometry(grad_gate.size)
    reduce_chunks[grid, block, stream](grad_gate, partial)


__all__ = [
    "BACKWARD_VEC_BLOCK",
    "CHUNK_ROWS",
    "FORWARD_MAX_GRID_Y",
    "FORWARD_ROWS_PER_STEP",
    "FUSED_MAX_CHUNKS",
    "SUMMATION_ORDER",
    "backward_vec_geometry",
    "forward_vec_geometry",
    "kernels_for",
    "launch_backward",
    "launch_backward_vec",
    "launch_forward",
    "launch_forward_vec",
    "n_chunks",
    "vec_kernels_for",
]
