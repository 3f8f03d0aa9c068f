"""Device functions that move whole rows between memory and registers, and sum their squares
in the order of ``kernels/rms_norm_order.py``; shared by the RMSNorm forward and backward.

One thread block of T threads handles one row at a time. A thread holds the row's columns of
the layout's slots in a local float32 array ``vals`` of ``slots * S`` elements (element
``s * S + k`` is column ``s * S * T + t * S + k``; 0.0 beyond D); every loop over it has a
compile-time trip count, so after unrolling it lives in registers.

Two ways to fetch a slot, fixed per kernel when it is built (:func:`make_row_functions`):

* *vector* (D * itemsize a multiple of 16 and S * itemsize == 16): a row is read as uint32
  words, one 16-byte ``ld.global.v4`` per slot (``kernels/vector.py``), the lanes decoded with
  the lane codecs of ``kernels/rounding.py``;
* *element*: one element load per column from an array of the storage element type (bfloat16
  as int16 bits), for any D.

Both give the same float32 values, so the same bits. Under the CUDA simulator, which has no
warp shuffles, the warp butterfly exchanges the same values through shared memory.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import config, cuda, float32, uint32

from gate_residual_matrix.kernels.rms_norm_order import Layout
from gate_residual_matrix.kernels.rms_norm_ptx import fma_rn
from gate_residual_matrix.kernels.rounding import CODECS, LANE_CODECS, add_rn, mul_rn
from gate_residual_matrix.kernels.vector import load_vec, store_vec

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = np.uint32(0xFFFFFFFF)
_ZERO = np.float32(0.0)


def vector_mode(layout: Layout, itemsize: int) -> bool:
    """Whether a kernel for ``layout`` reads rows as 16-byte vectors."""
    return layout.size * itemsize == 16 and (layout.d * itemsize) % 16 == 0


class RowFunctions(NamedTuple):
    """The device functions of one layout and dtype (see :func:`make_row_functions`)."""

    fetch: object
    emit: object
    fetch_slot: object
    emit_slot: object
    rnd: object
    sum_squares: object
    block_sum: object
    stage_buffer: object
    stage: object
    unstage: object


def make_row_functions(layout: Layout, dtype: str, vector: bool) -> RowFunctions:
    """The device functions that move rows and reduce them, for one layout and dtype.

    * ``fetch(vals, arr, row, t)``: thread ``t``'s values of ``row`` of ``arr`` into ``vals``
      (slot ``s`` at ``vals[s * S ..]``; ``arr`` a uint32 word view in vector mode, else the
      element view; 0.0 beyond D);
    * ``emit(arr, row, t, vals)``: ``vals`` rounded to the storage dtype into ``row``;
    * ``fetch_slot(vals, at, arr, row, t, s)`` / ``emit_slot(arr, row, t, s, vals, at)``: the
      same for slot ``s`` alone, at ``vals[at ..]`` (so that a kernel need not hold a whole
      parameter row in registers);
    * ``rnd(x)``: float32 rounded to the storage dtype, as float32;
    * ``sum_squares(vals, t, part, base)``: the row's float32 sum of squares in the layout's
      order (``part[base ..]``: shared float32 scratch of ``blocks * warps``);
    * ``block_sum(value, t, part, base)``: a thread value summed over the block by the same
      warp and cross-warp butterflies (``part[base ..]``: ``warps`` floats).

    * ``stage_buffer()``, ``stage(buf, arr, row, t)``, ``unstage(vals, buf)``: a row's loads
      issued into a buffer (raw 16-byte words in vector mode) and decoded later, so that a
      kernel can load the next row while it computes one.

    Each reduction has one barrier, between the warps' writes and the reads: a caller
    alternates between two scratch areas from one call to the next (the reads of call k are
    done before any thread passes the barrier of call k + 1, so call k + 2 may write the
    first area again).
    """
    size, threads, span, reps = layout.size, layout.threads, layout.span, layout.reps
    slots, blocks, fused, d, warps = layout.slots, layout.blocks, layout.fused, layout.d, \
        layout.warps
    get, put, rnd, word_lanes = LANE_CODECS[dtype]
    # a row's raw data as loaded: 4 words per slot (vector mode) or its float32 values
    n_stage = 4 * slots if vector else slots * size
    load, store, _ = CODECS[dtype]

    if vector:
        @cuda.jit(device=True, inline="always")
        def _unpack(vals, at, word):
            for j in range(word_lanes):
                vals[at + j] = get(word, j)

        @cuda.jit(device=True, inline="always")
        def fetch_slot(vals, at, arr, row, t, s):
            if s * span + t * size < d:
                w0, w1, w2, w3 = load_vec(arr, row, s * threads + t)
                _unpack(vals, at, w0)
                _unpack(vals, at + word_lanes, w1)
                _unpack(vals, at + 2 * word_lanes, w2)
                _unpack(vals, at + 3 * word_lanes, w3)
            else:
                for k in range(size):
                    vals[at + k] = _ZERO

        @cuda.jit(device=True, inline="always")
        def _pack(vals, at):
            word = np.uint32(0)
            for j in range(word_lanes):
                word |= put(vals[at + j], j)
            return word

        @cuda.jit(device=True, inline="always")
        def emit_slot(arr, row, t, s, vals, at):
            if s * span + t * size < d:
                store_vec(arr, row, s * threads + t, _pack(vals, at),
                          _pack(vals, at + word_lanes), _pack(vals, at + 2 * word_lanes),
                          _pack(vals, at + 3 * word_lanes))
    else:
        @cuda.jit(device=True, inline="always")
        def fetch_slot(vals, at, arr, row, t, s):
            for k in range(size):
                col = s * span + t * size + k
                vals[at + k] = load(arr[row, col]) if col < d else _ZERO

        @cuda.jit(device=True, inline="always")
        def emit_slot(arr, row, t, s, vals, at):
            for k in range(size):
                col = s * span + t * size + k
                if col < d:
                    arr[row, col] = store(vals[at + k])

    if vector:
        @cuda.jit(device=True, inline="always")
        def stage_buffer():
            return cuda.local.array(n_stage, uint32)

        @cuda.jit(device=True, inline="always")
        def stage(buf, arr, row, t):
            for s in range(slots):
                if s * span + t * size < d:
                    w0, w1, w2, w3 = load_vec(arr, row, s * threads + t)
                else:
                    w0 = w1 = w2 = w3 = np.uint32(0)
                buf[4 * s] = w0
                buf[4 * s + 1] = w1
                buf[4 * s + 2] = w2
                buf[4 * s + 3] = w3

        @cuda.jit(device=True, inline="always")
        def unstage(vals, buf):
            for s in range(slots):
                for w in range(4):
                    _unpack(vals, s * size + w * word_lanes, buf[4 * s + w])
    else:
        @cuda.jit(device=True, inline="always")
        def stage_buffer():
            return cuda.local.array(n_stage, float32)

        @cuda.jit(device=True, inline="always")
        def stage(buf, arr, row, t):
            for s in range(slots):
                fetch_slot(buf, s * size, arr, row, t, s)

        @cuda.jit(device=True, inline="always")
        def unstage(vals, buf):
            for i in range(n_stage):
                vals[i] = buf[i]

    @cuda.jit(device=True, inline="always")
    def fetch(vals, arr, row, t):
        for s in range(slots):
            fetch_slot(vals, s * size, arr, row, t, s)

    @cuda.jit(device=True, inline="always")
    def emit(arr, row, t, vals):
        for s in range(slots):
            emit_slot(arr, row, t, s, vals, s * size)

    @cuda.jit(device=True, inline="always")
    def chain(vals, c):
        # one thread's squares of block c, in register order (module docstring of
        # kernels/rms_norm_order.py): fma for the first ``fused``, then rounded square + add
        first = c * reps * size
        n = min(reps * size, slots * size - first)
        if n == 1:
            return mul_rn(vals[first], vals[first])
        if fused > 0:
            acc = fma_rn(vals[first], vals[first], mul_rn(vals[first + 1], vals[first + 1]))
        else:
            acc = add_rn(mul_rn(vals[first], vals[first]), mul_rn(vals[first + 1], vals[first + 1]))
        for m in range(2, n):
            e = vals[first + m]
            if m < fused:
                acc = fma_rn(e, e, acc)
            else:
                acc = add_rn(mul_rn(e, e), acc)
        return acc

    if not SIMULATOR:
        @cuda.jit(device=True, inline="always")
        def warp_butterfly(acc):
            offset = 16
            while offset > 0:
                acc = add_rn(acc, cuda.shfl_xor_sync(FULL_MASK, acc, offset))
                offset >>= 1
            return acc
    else:  # pragma: no cover - the simulator has no shuffles: the same exchange through
        # shared memory (every thread of the block calls it, as every lane calls shfl)
        def warp_butterfly(acc):
            t = cuda.threadIdx.x
            lanes = cuda.shared.array(threads, float32)
            offset = 16
            while offset > 0:
                lanes[t] = acc
                cuda.syncthreads()
                other = lanes[t ^ offset]
                cuda.syncthreads()
                acc = add_rn(acc, other)
                offset >>= 1
            return acc

    if warps == 4:
        @cuda.jit(device=True, inline="always")
        def across(part, b):
            return add_rn(add_rn(part[b], part[b + 2]), add_rn(part[b + 1], part[b + 3]))
    elif warps == 8:
        @cuda.jit(device=True, inline="always")
        def across(part, b):
            return add_rn(add_rn(add_rn(part[b], part[b + 4]), add_rn(part[b + 2], part[b + 6])),
                          add_rn(add_rn(part[b + 1], part[b + 5]),
                                 add_rn(part[b + 3], part[b + 7])))
    else:
        raise ValueError(f"a block of {warps} warps: the layouts use 4 or 8")

    @cuda.jit(device=True, inline="always")
    def sum_squares(vals, t, part, base):
        lane = t & 31
        warp = t >> 5
        for c in range(blocks):
            acc = warp_butterfly(chain(vals, c))
            if lane == 0:
                part[base + c * warps + warp] = acc
        cuda.syncthreads()
        total = _ZERO
        for c in range(blocks):
            total = add_rn(total, across(part, base + c * warps))
        return total

    @cuda.jit(device=True, inline="always")
    def block_sum(value, t, part, base):
        acc = warp_butterfly(value)
        if (t & 31) == 0:
            part[base + (t >> 5)] = acc
        cuda.syncthreads()
        return across(part, base)

    return RowFunctions(fetch, emit, fetch_slot, emit_slot, rnd, sum_squares, block_sum,
                        stage_buffer, stage, unstage)


__all__ = ["FULL_MASK", "make_row_functions", "vector_mode"]
