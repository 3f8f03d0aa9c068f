"""The RMSNorm backward kernels (numba.cuda): batch-invariant and repeatable by construction.

For ``y = n * w`` with ``n = v * r``, ``r = 1 / sqrt(mean(v^2) + eps)`` (``v``: the row
``x``, or for add_rms_norm the forward's output ``h = round(x + residual)``, which the
backward reads instead of ``x`` and ``residual``) and an upstream ``u`` into ``y``
(``grad_out``; for rms_norm_scale_shift ``grad_out * (1 + scale[k])``), the gradients are
``grad_v = r * (u * w) - v * (r^3 * sum(u * w * v) / D)``, ``grad_w = sum over rows of
u * n``, and for rms_norm_scale_shift ``grad_scale[k] = sum of grad_out * (n * w)`` and
``grad_shift[k] = sum of grad_out`` over the rows with ``index == k``.
:data:`BACKWARD_ORDER` fixes every operation and its order: the bits depend on the row's
inputs, D and the op's constants only (never on N, the GPU, the launch or timing); there
are no atomics. The CPU twin (``kernels/rms_norm_cpu.py``) computes the same bits: the
backward uses IEEE division and square root only, not the forward's hardware
approximations, so its ``r`` can differ from the forward's in the last bits (it is the
correctly rounded one).

Launch: grid (chunks,), one block of T threads (``omni_layout``) per chunk of
``CHUNK_ROWS[op]`` rows, rows of the chunk one after the other; a second kernel sums the
chunks' float32 partials per column.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from gate_residual_matrix.kernels.rms_norm_order import Layout, omni_layout
from gate_residual_matrix.kernels.rms_norm_ptx import div_rn, fma_rn, sqrt_rn
from gate_residual_matrix.kernels.rms_norm_rows import SIMULATOR, make_row_functions
from gate_residual_matrix.kernels.rounding import CODECS, add_rn, mul_rn

#: Rows per chunk of the parameter-gradient sums, per op. Part of the summation order.
CHUNK_ROWS = {"rms_norm": 64, "add_rms_norm": 64, "rms_norm_scale_shift": 256}

BACKWARD_ORDER = (
    "Per row: v (x, or add_rms_norm's h = round(x + residual)); ss = the sum of squares of "
    "v in vllm-omni's forward order (kernels/rms_norm_order.py: 256 threads, fma chains, "
    "butterflies); "
    "r = div_rn(1, sqrt_rn(fma(ss, RN(1/D), eps))); per column u = grad_out (rms_norm, "
    "add_rms_norm) or mul_rn(grad_out, add_rn(1, scale[k])) (rms_norm_scale_shift), "
    "n = mul_rn(v, r), gw = mul_rn(u, w); dot: each of the 256 threads sums "
    "mul_rn(gw, v) over its columns in the layout's register order from +0.0 with add_rn, "
    "then the same warp and cross-warp butterflies; coef = div_rn(mul_rn(mul_rn(mul_rn(r, r), "
    "r), dot), D); dv = add_rn(mul_rn(gw, r), -mul_rn(v, coef)); grad_x = round(dv), or "
    "round(add_rn(grad_h, dv)) for add_rms_norm (grad_residual is the same tensor's values). "
    "Parameter sums, float32, per column: rows are split into consecutive chunks of "
    "CHUNK_ROWS[op] rows; within a chunk, from +0.0, grad_weight += mul_rn(u, n) and for "
    "rms_norm_scale_shift grad_scale[k] += mul_rn(grad_out, mul_rn(n, w)), grad_shift[k] += "
    "grad_out, over the chunk's rows in increasing order (rms_norm_scale_shift: for k = 0 .. "
    "G-1, the rows with index k in increasing order); then the chunk sums are added from +0.0 "
    "in increasing chunk order and rounded once to the storage dtype."
)

#: Largest shared memory for grad_weight's per-thread accumulators, bytes (static shared
#: memory is at most 48 KiB per block).
SHARED_ACC_BYTES = 40 * 1024

#: Register cap of the backward kernels: two blocks of 256 threads per SM (ptxas fits
#: rms_norm_scale_shift's D = 5376 bfloat16 kernel in it without spilling; uncapped it takes
#: 135 and one block per SM).
MAX_REGISTERS = 128
_OPTIONS = {} if SIMULATOR else {"max_registers": MAX_REGISTERS}  # the simulator has no cap

_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_NAN = np.float32(np.nan)


def backward_layout(d: int, itemsize: int) -> Layout:
    """The layout every backward kernel uses (vllm-omni's forward layout)."""
    return omni_layout(d, itemsize)


def _build(op: str, d: int, dtype: str, eps: float, vector: bool):
    itemsize = 4 if dtype == "float32" else 2
    layout = backward_layout(d, itemsize)
    rows = make_row_functions(layout, dtype, vector)
    fetch, emit, fetch_slot = rows.fetch, rows.emit, rows.fetch_slot
    stage_buffer, stage, unstage = rows.stage_buffer, rows.stage, rows.unstage
    rnd, sum_squares, block_sum = rows.rnd, rows.sum_squares, rows.block_sum
    n_vals = layout.slots * layout.size
    size, span, slots, threads = layout.size, layout.span, layout.slots, layout.threads
    warps = layout.warps
    n_part = layout.blocks * layout.warps
    n_scratch = 2 * (n_part + warps)  # sums of squares, then dot products; two areas each
    chunk_rows = CHUNK_ROWS[op]
    eps32 = np.float32(eps)
    inv_d = np.float32(1.0) / np.float32(d)
    d32 = np.float32(d)
    scaled = op == "rms_norm_scale_shift"
    # rms_norm / add_rms_norm load the next row while computing one, where the two staged
    # rows still leave two blocks per SM (16-byte words of 2-byte dtypes, D = 5376: 128
    # registers); float32 rows would take twice the registers, so they load on demand
    prefetch = vector and itemsize == 2
    # grad_weight's accumulators: in shared memory (slot i of thread t at [i, t]) when they
    # fit, else in registers ([i, 0]); the same operations either way
    in_shared = n_vals * threads * 4 <= SHARED_ACC_BYTES
    acc_cols = threads if in_shared else 1
    sh = 1 if in_shared else 0

    if in_shared:
        @cuda.jit(device=True, inline="always")
        def weight_accumulators():
            return cuda.shared.array((n_vals, acc_cols), float32)
    else:
        @cuda.jit(device=True, inline="always")
        def weight_accumulators():
            return cuda.local.array((n_vals, acc_cols), float32)

    @cuda.jit(device=True, inline="always")
    def put_partial(partial, chunk, p, t, acc):
        for s in range(slots):
            for k in range(size):
                col = s * span + t * size + k
                if col < d:
                    partial[chunk, p, col] = acc[s * size + k]

    @cuda.jit(device=True, inline="always")
    def put_weight_partial(partial, chunk, t, acc_w):
        for s in range(slots):
            for k in range(size):
                col = s * span + t * size + k
                if col < d:
                    partial[chunk, 0, col] = acc_w[s * size + k, t * sh]

    @cuda.jit(device=True, inline="always")
    def row_grad(vals, gv, weight, scale, k_row, wv, sc, acc_w, acc_s, acc_h, t, part, odd):
        # vals: v; gv: grad_out; on return gv holds dv (float32, not rounded). The weight
        # (and scale) slots are read when needed (L1-resident), not held for the row. ``odd``
        # (0 or 1) alternates the scratch areas of part from one row to the next
        ss = sum_squares(vals, t, part, odd * n_part)
        r = div_rn(_ONE, sqrt_rn(fma_rn(ss, inv_d, eps32)))
        p = _ZERO
        for s in range(slots):
            fetch_slot(wv, 0, weight, 0, t, s)
            if scaled:
                fetch_slot(sc, 0, scale, k_row, t, s)
            for j in range(size):
                i = s * size + j
                g = gv[i]
                u = mul_rn(g, add_rn(_ONE, sc[j])) if scaled else g
                n = mul_rn(vals[i], r)
                gw = mul_rn(u, wv[j])
                p = add_rn(p, mul_rn(gw, vals[i]))
                acc_w[i, t * sh] = add_rn(acc_w[i, t * sh], mul_rn(u, n))
                if scaled:
                    acc_s[i] = add_rn(acc_s[i], mul_rn(g, mul_rn(n, wv[j])))
                    acc_h[i] = add_rn(acc_h[i], g)
                gv[i] = gw
        dot = block_sum(p, t, part, 2 * n_part + odd * warps)
        coef = div_rn(mul_rn(mul_rn(mul_rn(r, r), r), dot), d32)
        for i in range(n_vals):
            gv[i] = add_rn(mul_rn(gv[i], r), -mul_rn(vals[i], coef))

    @cuda.jit(device=True, inline="always")
    def clear_weight(acc_w, t):
        for i in range(n_vals):
            acc_w[i, t * sh] = _ZERO

    if op == "rms_norm":
        @cuda.jit(**_OPTIONS)
        def backward(grad_x, partial, grad_out, x, weight):
            t = cuda.threadIdx.x
            vals = cuda.local.array(n_vals, float32)
            gv = cuda.local.array(n_vals, float32)
            wv = cuda.local.array(size, float32)
            acc_w = weight_accumulators()
            part = cuda.shared.array(n_scratch, float32)
            odd = 0
            next_x = stage_buffer()
            next_g = stage_buffer()
            chunk = cuda.blockIdx.x
            while chunk < partial.shape[0]:
                clear_weight(acc_w, t)
                start = chunk * chunk_rows
                stop = min(start + chunk_rows, x.shape[0])
                if prefetch:
                    stage(next_x, x, start, t)
                    stage(next_g, grad_out, start, t)
                for row in range(start, stop):
                    if prefetch:
                        unstage(vals, next_x)
                        unstage(gv, next_g)
                        if row + 1 < stop:  # the next row's loads fly while this one computes
                            stage(next_x, x, row + 1, t)
                            stage(next_g, grad_out, row + 1, t)
                    else:
                        fetch(vals, x, row, t)
                        fetch(gv, grad_out, row, t)
                    row_grad(vals, gv, weight, weight, 0, wv, wv, acc_w, vals, vals, t, part,
                             odd)
                    odd = 1 - odd
                    for i in range(n_vals):
                        gv[i] = rnd(gv[i])
                    emit(grad_x, row, t, gv)
                put_weight_partial(partial, chunk, t, acc_w)
                chunk += cuda.gridDim.x

        return backward

    if op == "add_rms_norm":
        @cuda.jit(**_OPTIONS)
        def backward(grad_x, partial, grad_out, grad_h, h, weight):
            t = cuda.threadIdx.x
            vals = cuda.local.array(n_vals, float32)
            gv = cuda.local.array(n_vals, float32)
            wv = cuda.local.array(size, float32)
            acc_w = weight_accumulators()
            part = cuda.shared.array(n_scratch, float32)
            odd = 0
            next_h = stage_buffer()
            next_g = stage_buffer()
            chunk = cuda.blockIdx.x
            while chunk < partial.shape[0]:
                clear_weight(acc_w, t)
                start = chunk * chunk_rows
                stop = min(start + chunk_rows, h.shape[0])
                if prefetch:
                    stage(next_h, h, start, t)
                    stage(next_g, grad_out, start, t)
                for row in range(start, stop):
                    if prefetch:
                        unstage(vals, next_h)
                        unstage(gv, next_g)
                        if row + 1 < stop:  # the next row's loads fly while this one computes
                            stage(next_h, h, row + 1, t)
                            stage(next_g, grad_out, row + 1, t)
                    else:
                        fetch(vals, h, row, t)
                        fetch(gv, grad_out, row, t)
                    row_grad(vals, gv, weight, weight, 0, wv, wv, acc_w, vals, vals, t, part,
                             odd)
                    odd = 1 - odd
                    fetch(vals, grad_h, row, t)
                    for i in range(n_vals):
                        gv[i] = rnd(add_rn(vals[i], gv[i]))
                    emit(grad_x, row, t, gv)
                put_weight_partial(partial, chunk, t, acc_w)
                chunk += cuda.gridDim.x

        return backward

    @cuda.jit(**_OPTIONS)
    def backward(grad_x, partial, grad_out, x, weight, scale, index, flag):
        t = cuda.threadIdx.x
        vals = cuda.local.array(n_vals, float32)
        gv = cuda.local.array(n_vals, float32)
        wv = cuda.local.array(size, float32)
        sc = cuda.local.array(size, float32)
        acc_w = weight_accumulators()
        acc_s = cuda.local.array(n_vals, float32)
        acc_h = cuda.local.array(n_vals, float32)
        part = cuda.shared.array(n_scratch, float32)
        odd = 0
        n_groups = scale.shape[0]
        chunk = cuda.blockIdx.x
        while chunk < partial.shape[0]:
            start = chunk * chunk_rows
            stop = min(start + chunk_rows, x.shape[0])
            clear_weight(acc_w, t)
            for k in range(n_groups):
                for i in range(n_vals):
                    acc_s[i] = _ZERO
                    acc_h[i] = _ZERO
                for row in range(start, stop):
                    if index[row] == k:
                        fetch(vals, x, row, t)
                        fetch(gv, grad_out, row, t)
                        row_grad(vals, gv, weight, scale, k, wv, sc, acc_w, acc_s, acc_h, t,
                                 part, odd)
                        odd = 1 - odd
                        for i in range(n_vals):
                            gv[i] = rnd(gv[i])
                        emit(grad_x, row, t, gv)
                put_partial(partial, chunk, 1 + k, t, acc_s)
                put_partial(partial, chunk, 1 + n_groups + k, t, acc_h)
            for row in range(start, stop):  # an index outside [0, G): a NaN row
                k = index[row]
                if k < 0 or k >= n_groups:
                    if t == 0:
                        flag[0] = np.uint8(0)
                    for i in range(n_vals):
                        gv[i] = add_rn(_NAN, _ZERO)
                    emit(grad_x, row, t, gv)
            put_weight_partial(partial, chunk, t, acc_w)
            chunk += cuda.gridDim.x

    return backward


def _build_reduce(dtype: str):
    store = CODECS[dtype][1]

    @cuda.jit
    def reduce_chunks(out, partial):
        # one thread per element of out (P, D): chunks summed from +0.0 in increasing order
        flat = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        width = out.shape[1]
        if flat >= out.shape[0] * width:
            return
        p = flat // width
        col = flat - p * width
        total = _ZERO
        for c in range(partial.shape[0]):
            total = add_rn(total, partial[c, p, col])
        out[p, col] = store(total)

    return reduce_chunks


_KERNELS: dict[tuple, object] = {}


def backward_kernel(op: str, d: int, dtype: str, eps: float, vector: bool):
    """The backward kernel of ``op`` for D columns of ``dtype`` ("bfloat16", "float16",
    "float32"), built once per process; ``vector``: 16-byte vector loads (the caller checks
    that D and the pointers allow them)."""
    key = (op, d, dtype, float(eps), vector)
    if key not in _KERNELS:
        _KERNELS[key] = _build(op, d, dtype, eps, vector)
    return _KERNELS[key]


def reduce_kernel(dtype: str):
    """The chunk-sum kernel of ``dtype``: ``reduce_chunks(out (P, D) storage elements,
    partial (chunks, P, D) float32)``."""
    key = ("reduce", dtype)
    if key not in _KERNELS:
        _KERNELS[key] = _build_reduce(dtype)
    return _KERNELS[key]


def n_chunks(op: str, n_rows: int) -> int:
    """Number of chunks the parameter sums of ``op`` split N rows into."""
    return -(-n_rows // CHUNK_ROWS[op])


__all__ = ["BACKWARD_ORDER", "CHUNK_ROWS", "backward_kernel", "backward_layout", "n_chunks",
           "reduce_kernel"]
