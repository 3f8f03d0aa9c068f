"""The RMSNorm forward kernels (numba.cuda), one thread block per row, the row in registers.

Three kernels, built per (storage dtype, D, eps, vector or element loads) by
:func:`forward_kernel`; their orders and instructions are ``kernels/rms_norm_order.py``'s:

* ``rms_norm``: vLLM's batch-invariant order (``vllm_layout``); ``out = round((x * inv) * w)``
  with ``inv = rcp(sqrt(fma(sum_sq, rcp(D), eps)))`` (``rcp``, ``sqrt``: ``MUFU.RCP``,
  ``MUFU.SQRT``, what Triton's ``1.0 / tl.sqrt(sum_sq / n_cols + eps)`` becomes).
* ``add_rms_norm``: ``h = round(x + residual)`` (one ``add.rn.f32``, rounded to the storage
  dtype, written out), then ``rms_norm``'s forward on ``h``.
* ``rms_norm_scale_shift``: vllm-omni's order (``omni_layout``); ``r = rsqrt(fma(sum,
  RN(1 / D), eps))`` (``MUFU.RSQ``; ``RN(1 / D)`` the correctly rounded reciprocal, what ptxas
  folds ``tl.sum(...) / hidden_size`` into for a constexpr D), ``n = (x * r) * w``,
  ``out = round(fma(n, 1 + scale[k], shift[k]))`` with ``k = index[row]``. An index
  outside [0, G) clears ``flag[0]`` and gives a NaN row; no parameter row outside [0, G) is
  read.

Launch: grid (rows,) (looped when N is larger), block T = ``layout.threads``. Arrays are
uint32 word views (vector mode) or element views (bfloat16 as int16), 2-D; ``weight`` is
(1, D), ``scale``/``shift`` (G, D).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import cuda, float32

from gate_residual_matrix.kernels.rms_norm_order import (
    Layout,
    omni_layout,
    vector_elements,
    vllm_layout,
)
from gate_residual_matrix.kernels.rms_norm_ptx import (
    div_rn,
    fma_rn,
    rcp_approx,
    rsqrt_approx,
    sqrt_approx,
    sqrt_rn,
)
from gate_residual_matrix.kernels.rms_norm_rows import make_row_functions, vector_mode
from gate_residual_matrix.kernels.rounding import add_rn, mul_rn

OPS = ("rms_norm", "add_rms_norm", "rms_norm_scale_shift")
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
_ONE = np.float32(1.0)
_NAN = np.float32(np.nan)


def layout_for(op: str, d: int, dtype: str) -> Layout:
    """The layout (threads, slots, order) of ``op``'s kernels for D columns of ``dtype``."""
    if op not in OPS:
        raise ValueError(f"unknown RMSNorm op {op!r}: expected one of {', '.join(OPS)}")
    itemsize = ITEMSIZE[dtype]
    return omni_layout(d, itemsize) if op == "rms_norm_scale_shift" else vllm_layout(d, itemsize)


#: Variants of the forward: the libraries' instructions ("triton"), IEEE division and square
#: root instead of the approximate ones ("ieee"), or no FMA in the sums of squares ("nofma").
#: Only "triton" is the op; the others exist to show that the probe and the tests can tell.
VARIANTS = ("triton", "ieee", "nofma")


@cuda.jit(device=True, inline="always")
def _rsqrt_rn(a):
    return div_rn(_ONE, sqrt_rn(a))


@cuda.jit(device=True, inline="always")
def _rcp_rn(a):
    return div_rn(_ONE, a)


def _build(op: str, d: int, dtype: str, eps: float, vector: bool, variant: str):
    layout = layout_for(op, d, dtype)
    if variant == "nofma":
        layout = dataclasses.replace(layout, fused=0)
    rcp, sqrt, rsqrt = _MATH[variant == "ieee"]
    rows = make_row_functions(layout, dtype, vector)
    fetch, fetch_slot, emit_slot = rows.fetch, rows.fetch_slot, rows.emit_slot
    rnd, sum_squares = rows.rnd, rows.sum_squares
    size, slots = layout.size, layout.slots
    n_vals = slots * size
    n_part = layout.blocks * layout.warps  # per scratch area; two alternate (rows module)
    n_scratch = 2 * n_part
    eps32 = np.float32(eps)
    inv_d = np.float32(1.0) / np.float32(d)  # what ptxas folds div.full by a constant D into
    # elements per word of the arrays the kernel gets (uint32 words in vector mode)
    per_word = 4 // ITEMSIZE[dtype] if vector else 1

    @cuda.jit(device=True, inline="always")
    def vllm_scale(vals, t, part, base, width):
        # div.full(sum_sq, D) + eps == fma(sum_sq, MUFU.RCP(D), eps) (SASS); D at run time,
        # as vLLM passes n_cols, so that ptxas cannot fold the reciprocal
        mean_eps = fma_rn(sum_squares(vals, t, part, base), rcp(float32(width * per_word)),
                          eps32)
        return rcp(sqrt(mean_eps))

    @cuda.jit(device=True, inline="always")
    def emit_normalized(out, row, t, vals, inv, weight, wv):
        # (x * inv) * w per slot, the weight slot read when needed (L1-resident, and not
        # held in registers for the whole row)
        for s in range(slots):
            fetch_slot(wv, 0, weight, 0, t, s)
            for k in range(size):
                vals[s * size + k] = mul_rn(mul_rn(vals[s * size + k], inv), wv[k])
            emit_slot(out, row, t, s, vals, s * size)

    if op == "rms_norm":
        @cuda.jit
        def forward(out, x, weight):
            t = cuda.threadIdx.x
            vals = cuda.local.array(n_vals, float32)
            wv = cuda.local.array(size, float32)
            part = cuda.shared.array(n_scratch, float32)
            base = 0
            row = cuda.blockIdx.x
            while row < x.shape[0]:
                fetch(vals, x, row, t)
                inv = vllm_scale(vals, t, part, base, x.shape[1])
                base = n_part - base
                emit_normalized(out, row, t, vals, inv, weight, wv)
                row += cuda.gridDim.x

        return forward

    if op == "add_rms_norm":
        @cuda.jit
        def forward(out, h, x, residual, weight):
            t = cuda.threadIdx.x
            vals = cuda.local.array(n_vals, float32)
            res = cuda.local.array(size, float32)
            part = cuda.shared.array(n_scratch, float32)
            base = 0
            row = cuda.blockIdx.x
            while row < x.shape[0]:
                for s in range(slots):
                    fetch_slot(vals, s * size, x, row, t, s)
                    fetch_slot(res, 0, residual, row, t, s)
                    for k in range(size):
                        vals[s * size + k] = rnd(add_rn(vals[s * size + k], res[k]))
                    emit_slot(h, row, t, s, vals, s * size)
                inv = vllm_scale(vals, t, part, base, x.shape[1])
                base = n_part - base
                emit_normalized(out, row, t, vals, inv, weight, res)
                row += cuda.gridDim.x

        return forward

    @cuda.jit
    def forward(out, x, weight, scale, shift, index, flag):
        t = cuda.threadIdx.x
        vals = cuda.local.array(n_vals, float32)
        wv = cuda.local.array(size, float32)
        sc = cuda.local.array(size, float32)
        sh = cuda.local.array(size, float32)
        part = cuda.shared.array(n_scratch, float32)
        base = 0
        row = cuda.blockIdx.x
        while row < x.shape[0]:
            k = index[row]
            fetch(vals, x, row, t)
            r = rsqrt(fma_rn(sum_squares(vals, t, part, base), inv_d, eps32))
            base = n_part - base
            bad = k < 0 or k >= scale.shape[0]
            if bad and t == 0:
                flag[0] = np.uint8(0)
            for s in range(slots):
                at = s * size
                if bad:
                    for j in range(size):
                        vals[at + j] = add_rn(_NAN, np.float32(0.0))
                else:
                    fetch_slot(wv, 0, weight, 0, t, s)
                    fetch_slot(sc, 0, scale, k, t, s)
                    fetch_slot(sh, 0, shift, k, t, s)
                    for j in range(size):
                        n = mul_rn(mul_rn(vals[at + j], r), wv[j])
                        vals[at + j] = fma_rn(n, add_rn(_ONE, sc[j]), sh[j])
                emit_slot(out, row, t, s, vals, at)
            row += cuda.gridDim.x

    return forward


_MATH = {False: (rcp_approx, sqrt_approx, rsqrt_approx), True: (_rcp_rn, sqrt_rn, _rsqrt_rn)}
_KERNELS: dict[tuple, object] = {}


def forward_kernel(op: str, d: int, dtype: str, eps: float, vector: bool | None = None,
                   variant: str = "triton"):
    """The forward kernel of ``op`` for D columns of ``dtype`` ("bfloat16", "float16",
    "float32") and ``eps``, built once per process; ``variant``: one of :data:`VARIANTS`.
    ``vector``: 16-byte vector loads (default: whenever D * itemsize is a multiple of 16;
    ``True`` there raises ``ValueError`` otherwise)."""
    layout = layout_for(op, d, dtype)
    possible = vector_mode(layout, ITEMSIZE[dtype])
    if vector is None:
        vector = possible
    elif vector and not possible:
        raise ValueError(f"{op}: 16-byte vectors need D * itemsize % 16 == 0 and "
                         f"{vector_elements(ITEMSIZE[dtype])} elements per thread, got D={d}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown forward variant {variant!r}: expected one of {VARIANTS}")
    key = (op, d, dtype, float(eps), vector, variant)
    if key not in _KERNELS:
        _KERNELS[key] = _build(op, d, dtype, eps, vector, variant)
    return _KERNELS[key]


__all__ = ["ITEMSIZE", "OPS", "VARIANTS", "forward_kernel", "layout_for"]
