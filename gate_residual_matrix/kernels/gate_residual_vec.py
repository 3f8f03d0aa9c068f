"""gate_residual's 16-byte-vector numba.cuda kernels: the forward, the chunked backward, and
the fused backward that also finishes ``grad_gate`` in its last block per column.

Same operations in the same order as the element kernels of
:mod:`kernels.gate_residual_kernels` (which documents the op, the bits and
``SUMMATION_ORDER``); this module only builds the kernels, for one storage dtype's lane
codecs (kernels/rounding.py), from :func:`make_vec_kernels`.

Arrays are uint32 views of the tensors' bytes: (N, D * itemsize / 4). A 32-bit word holds
``word_lanes`` lanes (two bfloat16/float16, one float32); vector ``q`` of a row is words
``4q .. 4q + 3``, columns ``q * vec_lanes ..`` (``vec_lanes = 4 * word_lanes``). Needs
D * itemsize % 16 == 0 and 16-byte aligned storage (the launchers check both).

``flag`` (uint8, 1 element): on an index outside [0, G), kernels/device_assert.py's
``index_fault`` (a device-side assert, or flag = 0); that row's output is NaN and ``gate`` is
read at row 0 instead (never outside).

**The fused backward** (``backward_fused``) does what ``backward_chunks`` then the chunk
reduction do, in one launch, with the same float32 operations in the same order:

* each block sums its chunk(s) exactly as ``backward_chunks`` (shared accumulators);
* with one chunk (N <= CHUNK_ROWS) the block holds every term of its columns: it writes
  ``grad_gate = round(+0.0 + s_0)`` itself, and never touches ``partial`` or ``tickets``;
* otherwise it writes its chunk sums into ``partial`` (float32 (chunks * G, D) as words, row
  ``c * G + k``), ``threadfence``, and thread 0 takes a ticket: ``atomic.add`` on
  ``tickets[blockIdx.x]`` (uint32, one per column block, zero before the launch). The block
  that draws the last ticket (every other block of its columns has written and fenced) reads
  the partials through L2 (``ld.global.cg``), sums them per (k, column) from ``+0.0`` over
  chunks in increasing order, rounds once, writes ``grad_gate`` and sets its ticket back to
  zero for the next launch. Atomics touch the tickets only, never a value that is summed, so
  the bits do not depend on which block finishes last.

The last block's sum is serial in the chunks (``SUMMATION_ORDER`` fixes the order): it
reads G * chunks partial vectors per thread, four (k, c) pairs in flight. That suits few
chunks; the plans use it up to ``FUSED_MAX_CHUNKS`` chunks (kernels/gate_residual_plans.py)
and the two-launch path above that, where the reduction kernel spreads the same sums over
one thread per output element.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gate_residual_matrix.kernels.device_assert import index_fault
from gate_residual_matrix.kernels.rounding import add_rn, f32_from_u32, mul_rn, u32_from_f32
from gate_residual_matrix.kernels.vector import load_vec, load_vec_cg, store_vec


def make_vec_kernels(get, put, rnd, word_lanes: int, chunk_rows: int):
    """(forward, backward_chunks, backward_fused) for one dtype's lane codecs.

    ``get(word, j)`` -> float32 of lane j; ``put(x, j)`` -> x rounded and placed in lane j;
    ``rnd(x)`` -> x rounded to the storage dtype, as float32; ``word_lanes``: lanes per
    32-bit word (2 or 1); ``chunk_rows``: CHUNK_ROWS (part of the summation order).
    """
    vec_lanes = 4 * word_lanes
    pv = vec_lanes // 4  # 16-byte vectors of float32 partial sums per thread and gate row
    nan = np.uint32(0x7FFF7FFF if word_lanes == 2 else 0x7FFFFFFF)  # canonical NaN lanes

    @cuda.jit(device=True, inline="always")
    def forward_word(rh, gh, yh):
        o = np.uint32(0)
        for j in range(word_lanes):
            product = rnd(mul_rn(get(gh, j), get(yh, j)))
            o |= put(add_rn(get(rh, j), product), j)
        return o

    @cuda.jit(device=True, inline="always")
    def forward_store(out, row, q, r, g, y, bad):
        if bad:
            store_vec(out, row, q, nan, nan, nan, nan)
        else:
            store_vec(out, row, q, forward_word(r[0], g[0], y[0]),
                      forward_word(r[1], g[1], y[1]), forward_word(r[2], g[2], y[2]),
                      forward_word(r[3], g[3], y[3]))

    @cuda.jit(device=True, inline="always")
    def gate_row(index, row, n_gate, flag):
        """(row of gate to read, whether index[row] is outside [0, G))."""
        k = index[row]
        if k < 0 or k >= n_gate:
            index_fault(flag)
            return 0, True
        return k, False

    @cuda.jit
    def forward(out, residual, gate, y, index, flag):
        # grid: x over 16-byte vectors of a row, y over pairs of rows (strided); two rows
        # per loop step, all their loads issued before any store
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if q >= (out.shape[1] >> 2):
            return
        n_rows = out.shape[0]
        n_gate = gate.shape[0]
        row = 2 * cuda.blockIdx.y
        while row < n_rows:
            has_b = row + 1 < n_rows
            row_b = row + 1 if has_b else row
            ka, bad_a = gate_row(index, row, n_gate, flag)
            kb, bad_b = gate_row(index, row_b, n_gate, flag)
            ra = load_vec(residual, row, q)
            ya = load_vec(y, row, q)
            ga = load_vec(gate, ka, q)
            rb = load_vec(residual, row_b, q)
            yb = load_vec(y, row_b, q)
            gb = load_vec(gate, kb, q)
            forward_store(out, row, q, ra, ga, ya, bad_a)
            if has_b:
                forward_store(out, row_b, q, rb, gb, yb, bad_b)
            row += 2 * cuda.gridDim.y

    @cuda.jit(device=True, inline="always")
    def backward_word(goh, gh, yh, acc, base, width, tx):
        o = np.uint32(0)
        for j in range(word_lanes):
            go = get(goh, j)
            o |= put(mul_rn(go, get(gh, j)), j)
            slot = (base + j) * width + tx
            acc[slot] = add_rn(acc[slot], mul_rn(go, get(yh, j)))
        return o

    @cuda.jit(device=True, inline="always")
    def chunk_sums(acc, grad_y, grad_out, gate, y, index, flag, chunk, q, tx, width, n_rows,
                   n_gate):
        """grad_y of the chunk's rows, and into acc[(k * vec_lanes + lane) * width + tx]
        the chunk's sums from +0.0, rows in increasing order. Each thread owns its slots,
        so no barrier."""
        for slot in range(n_gate * vec_lanes):
            acc[slot * width + tx] = float32(0.0)
        start = chunk * chunk_rows
        stop = min(start + chunk_rows, n_rows)
        # A two-row pipeline: row i has its index and all three vectors loaded; row
        # i + 1 its index and grad_out/y vectors (its gate vector is loaded as soon as
        # its index is known). Loads past the chunk's end re-read its last row.
        k0, bad0 = gate_row(index, start, n_gate, flag)
        go0 = load_vec(grad_out, start, q)
        y0 = load_vec(y, start, q)
        g0 = load_vec(gate, k0, q)
        ahead = min(start + 1, stop - 1)
        k1, bad1 = gate_row(index, ahead, n_gate, flag)
        go1 = load_vec(grad_out, ahead, q)
        y1 = load_vec(y, ahead, q)
        for i in range(start, stop):
            k = k0
            bad = bad0
            go = go0
            yv = y0
            g = g0
            k0 = k1
            bad0 = bad1
            go0 = go1
            y0 = y1
            g0 = load_vec(gate, k0, q)
            ahead = min(i + 2, stop - 1)
            k1, bad1 = gate_row(index, ahead, n_gate, flag)
            go1 = load_vec(grad_out, ahead, q)
            y1 = load_vec(y, ahead, q)
            if bad:
                store_vec(grad_y, i, q, nan, nan, nan, nan)
                continue
            base = k * vec_lanes
            o0 = backward_word(go[0], g[0], yv[0], acc, base, width, tx)
            o1 = backward_word(go[1], g[1], yv[1], acc, base + word_lanes, width, tx)
            o2 = backward_word(go[2], g[2], yv[2], acc, base + 2 * word_lanes, width, tx)
            o3 = backward_word(go[3], g[3], yv[3], acc, base + 3 * word_lanes, width, tx)
            store_vec(grad_y, i, q, o0, o1, o2, o3)

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index, flag):
        # grid: x over 16-byte vectors, y over chunks (strided). Shared memory:
        # acc[(k * vec_lanes + lane) * blockDim.x + threadIdx.x]
        acc = cuda.shared.array(0, dtype=float32)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        q = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        if q >= (grad_out.shape[1] >> 2):
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            chunk_sums(acc, grad_y, grad_out, gate, y, index, flag, chunk, q, tx, width,
                       n_rows, n_gate)
            for k in range(n_gate):
                for j in range(vec_lanes):
                    partial[chunk, k, q * vec_lanes + j] = acc[(k * vec_lanes + j) * width + tx]
            chunk += cuda.gridDim.y

    @cuda.jit(device=True, inline="always")
    def gate_word(acc, base, tx, width, from_zero):
        """One word of a grad_gate vector from the sums in acc (lanes base ..): each sum
        rounded once (with ``from_zero``, first added to +0.0: the one-chunk case)."""
        o = np.uint32(0)
        for j in range(word_lanes):
            t = acc[(base + j) * width + tx]
            if from_zero:
                t = add_rn(float32(0.0), t)
            o |= put(t, j)
        return o

    @cuda.jit(device=True, inline="always")
    def store_gate_row(grad_gate, k, q, acc, tx, width, from_zero):
        base = k * vec_lanes
        store_vec(grad_gate, k, q, gate_word(acc, base, tx, width, from_zero),
                  gate_word(acc, base + word_lanes, tx, width, from_zero),
                  gate_word(acc, base + 2 * word_lanes, tx, width, from_zero),
                  gate_word(acc, base + 3 * word_lanes, tx, width, from_zero))

    @cuda.jit(device=True, inline="always")
    def add_lane(acc, slot, c, word):
        """acc[slot] = (+0.0 if c == 0 else acc[slot]) + the float32 in ``word``."""
        prev = acc[slot] if c > 0 else float32(0.0)
        acc[slot] = add_rn(prev, f32_from_u32(word))

    @cuda.jit(device=True, inline="always")
    def add_vector(acc, lane, c, vec, tx, width):
        w0, w1, w2, w3 = vec
        add_lane(acc, lane * width + tx, c, w0)
        add_lane(acc, (lane + 1) * width + tx, c, w1)
        add_lane(acc, (lane + 2) * width + tx, c, w2)
        add_lane(acc, (lane + 3) * width + tx, c, w3)

    @cuda.jit(device=True, inline="always")
    def add_pair(acc, f, chunks, a, b, tx, width):
        """Chunk c's partial sums of gate row k (flat pair f = k * chunks + c) added to the
        running sums of row k in acc."""
        k = f // chunks
        c = f - k * chunks
        add_vector(acc, k * vec_lanes, c, a, tx, width)
        if pv == 2:
            add_vector(acc, k * vec_lanes + 4, c, b, tx, width)

    @cuda.jit(device=True, inline="always")
    def load_pair(partial, f, chunks, n_gate, q):
        """The partial-sum vector(s) of flat pair f (one for float32, two for 16-bit)."""
        k = f // chunks
        row = (f - k * chunks) * n_gate + k
        a = load_vec_cg(partial, row, q * pv)
        if pv == 2:
            b = load_vec_cg(partial, row, q * pv + 1)
        else:
            b = a
        return a, b

    @cuda.jit(device=True, inline="always")
    def finish_gate(grad_gate, partial, acc, q, tx, width, n_gate, chunks):
        """The last block of a column block: grad_gate[k, columns of q] = round(sum over
        chunks c in increasing order of partial[c * G + k], from +0.0). Flat pairs
        f = k * chunks + c in increasing f, four loaded before their additions (pairs past
        the end re-read the last one and are not added)."""
        total = n_gate * chunks
        last = total - 1
        f = 0
        while f < total:
            a0, b0 = load_pair(partial, f, chunks, n_gate, q)
            a1, b1 = load_pair(partial, min(f + 1, last), chunks, n_gate, q)
            a2, b2 = load_pair(partial, min(f + 2, last), chunks, n_gate, q)
            a3, b3 = load_pair(partial, min(f + 3, last), chunks, n_gate, q)
            add_pair(acc, f, chunks, a0, b0, tx, width)
            if f + 1 < total:
                add_pair(acc, f + 1, chunks, a1, b1, tx, width)
            if f + 2 < total:
                add_pair(acc, f + 2, chunks, a2, b2, tx, width)
            if f + 3 < total:
                add_pair(acc, f + 3, chunks, a3, b3, tx, width)
            f += 4
        for k in range(n_gate):
            store_gate_row(grad_gate, k, q, acc, tx, width, False)

    @cuda.jit(device=True, inline="always")
    def flush_partials(partial, acc, chunk, q, tx, width, n_gate):
        """acc's chunk sums into partial row chunk * G + k, as 16-byte vectors."""
        for k in range(n_gate):
            row = chunk * n_gate + k
            for v in range(pv):
                lane = (k * vec_lanes + 4 * v) * width + tx
                store_vec(partial, row, q * pv + v, u32_from_f32(acc[lane]),
                          u32_from_f32(acc[lane + width]), u32_from_f32(acc[lane + 2 * width]),
                          u32_from_f32(acc[lane + 3 * width]))

    @cuda.jit
    def backward_fused(grad_y, grad_gate, partial, tickets, grad_out, gate, y, index, flag):
        # grid: x over 16-byte vectors, y over chunks (strided); grad_gate: uint32 (G, W);
        # partial: uint32 (chunks * G, D) (float32 sums); tickets: uint32 (grid.x,), zero
        acc = cuda.shared.array(0, dtype=float32)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        q = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        chunks = (n_rows + chunk_rows - 1) // chunk_rows
        active = q < (grad_out.shape[1] >> 2)  # no early return: the barrier below
        if active:
            chunk = cuda.blockIdx.y
            while chunk < chunks:
                chunk_sums(acc, grad_y, grad_out, gate, y, index, flag, chunk, q, tx,
                           width, n_rows, n_gate)
                if chunks == 1:
                    for k in range(n_gate):
                        store_gate_row(grad_gate, k, q, acc, tx, width, True)
                else:
                    flush_partials(partial, acc, chunk, q, tx, width, n_gate)
                chunk += cuda.gridDim.y
        if chunks <= 1:
            return
        cuda.threadfence()  # this thread's partials, before its block's ticket
        mine = 0
        if tx == 0:
            ticket = cuda.atomic.add(tickets, cuda.blockIdx.x, np.uint32(1))
            mine = 1 if ticket == cuda.gridDim.y - 1 else 0
        if cuda.syncthreads_or(mine) == 0:
            return
        cuda.threadfence()  # every other block's partials, before reading them
        if active:
            finish_gate(grad_gate, partial, acc, q, tx, width, n_gate, chunks)
        if tx == 0:
            tickets[cuda.blockIdx.x] = np.uint32(0)

    return forward, backward_chunks, backward_fused


__all__ = ["make_vec_kernels"]
