"""The RMSNorm ops on the CPU with numba: the GPU kernels' algorithm and order, for the
``cpu`` target.

Same ops, shapes, dtypes and errors as :mod:`kernels.rms_norm`. The loops walk each row the
way the GPU's thread block does (``kernels/rms_norm_order.py``: per thread chains of fused
multiply-adds in register order, warp butterflies, the cross-warp combine, blocks in order),
with the same float32 operations (``kernels/rounding_cpu.py``; ``fma`` is LLVM's ``llvm.fma``,
one rounding), so the sums of squares, the backward and the parameter gradients carry the
GPU's bits. Where the GPU forward uses a hardware approximation (``MUFU.RCP``,
``MUFU.SQRT``, ``MUFU.RSQ``), the CPU uses the correctly rounded operation (``rsqrt`` as
``1 / sqrt``, two roundings): forward outputs can differ from the GPU's in rows where the
approximation and the rounded value differ. The backward uses IEEE operations on both, so
its bits are the GPU's (``kernels/rms_norm_backward.py``'s BACKWARD_ORDER).

Example::

    >>> out = rms_norm_cpu(x, weight)                                # doctest: +SKIP
    >>> grad_x, grad_weight = rms_norm_backward_cpu(grad_out, x, weight)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, types
from numba.extending import intrinsic

from gate_residual_matrix.kernels.rms_norm_backward import CHUNK_ROWS, backward_layout
from gate_residual_matrix.kernels.rms_norm_checks import check_index_range, check_tensors, dense
from gate_residual_matrix.kernels.rms_norm_forward import ITEMSIZE, layout_for
from gate_residual_matrix.kernels.rms_norm_order import EPS, Layout
from gate_residual_matrix.kernels.rounding_cpu import (
    NAN32,
    ROUNDINGS,
    add_rn,
    as_f32,
    from_f32,
    mul_rn,
)

_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@intrinsic
def _llvm_fma(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return sig, codegen


@njit(inline="always")
def fma_rn(a, b, c):
    """float32 ``a * b + c`` rounded once, canonical NaN."""
    r = _llvm_fma(np.float32(a), np.float32(b), np.float32(c))
    return NAN32 if r != r else r


@njit(inline="always", error_model="numpy")
def div_rn(a, b):
    """float32 ``a / b`` correctly rounded, canonical NaN."""
    r = np.float32(np.float32(a) / np.float32(b))
    return NAN32 if r != r else r


@njit(inline="always")
def sqrt_rn(a):
    """float32 square root correctly rounded, canonical NaN."""
    r = np.float32(np.sqrt(np.float32(a)))
    return NAN32 if r != r else r


@njit(inline="always")
def _elem(v, first, m, size, span, t):
    col = (first + m // size) * span + t * size + m % size
    return v[col] if col < v.shape[0] else _ZERO


@njit(error_model="numpy")
def _reduce(v, w, threads, size, reps, slots, fused, dot):
    """The thread block's float32 sum over one row (``kernels/rms_norm_order.py``): of the
    squares of ``v`` in the layout's chains (``dot`` False), or of ``mul_rn(w, v)`` added
    from +0.0 in each thread's register order (``dot`` True); then the warp and cross-warp
    butterflies, and the blocks added from +0.0 in increasing order."""
    span = size * threads
    blocks = -(-slots // reps)
    warps = threads // 32
    lanes = np.empty(threads, np.float32)
    pairs = np.empty(threads, np.float32)
    total = _ZERO
    for c in range(blocks):
        first = c * reps
        n = min(reps, slots - first) * size
        for t in range(threads):
            if dot:
                acc = _ZERO
                for m in range(n):
                    col = (first + m // size) * span + t * size + m % size
                    if col < v.shape[0]:
                        acc = add_rn(acc, mul_rn(w[col], v[col]))
            else:
                e0 = _elem(v, first, 0, size, span, t)
                if n == 1:
                    acc = mul_rn(e0, e0)
                else:
                    e1 = _elem(v, first, 1, size, span, t)
                    acc = fma_rn(e0, e0, mul_rn(e1, e1))
                    for m in range(2, n):
                        e = _elem(v, first, m, size, span, t)
                        acc = fma_rn(e, e, acc) if m < fused else add_rn(mul_rn(e, e), acc)
            lanes[t] = acc
        for o in (16, 8, 4, 2, 1):
            for t in range(threads):
                pairs[t] = add_rn(lanes[t], lanes[t ^ o])
            lanes[:] = pairs
        o = warps // 2
        while o:
            for wi in range(warps):
                pairs[wi] = add_rn(lanes[32 * wi], lanes[32 * (wi ^ o)])
            for wi in range(warps):
                lanes[32 * wi] = pairs[wi]
            o //= 2
        total = add_rn(total, lanes[0])
    return total


def _layout_args(layout: Layout) -> tuple[int, int, int, int, int]:
    return layout.threads, layout.size, layout.reps, layout.slots, layout.fused


def _make_forward(rnd):
    @njit(error_model="numpy")
    def add_round(h, x, residual):
        for i in range(x.shape[0]):
            for k in range(x.shape[1]):
                h[i, k] = rnd(add_rn(x[i, k], residual[i, k]))

    @njit(error_model="numpy")
    def vllm_rows(out, v, w, lay, eps):
        d = v.shape[1]
        rcp_d = div_rn(_ONE, np.float32(d))
        for i in range(v.shape[0]):
            ss = _reduce(v[i], w, lay[0], lay[1], lay[2], lay[3], lay[4], False)
            inv = div_rn(_ONE, sqrt_rn(fma_rn(ss, rcp_d, eps)))
            for k in range(d):
                out[i, k] = rnd(mul_rn(mul_rn(v[i, k], inv), w[k]))

    @njit(error_model="numpy")
    def omni_rows(out, v, w, scale, shift, index, lay, eps):
        d = v.shape[1]
        inv_d = div_rn(_ONE, np.float32(d))
        for i in range(v.shape[0]):
            ss = _reduce(v[i], w, lay[0], lay[1], lay[2], lay[3], lay[4], False)
            r = div_rn(_ONE, sqrt_rn(fma_rn(ss, inv_d, eps)))
            g = index[i]
            for k in range(d):
                n = mul_rn(mul_rn(v[i, k], r), w[k])
                out[i, k] = rnd(fma_rn(n, add_rn(_ONE, scale[g, k]), shift[g, k]))

    return add_round, vllm_rows, omni_rows


def _make_backward(rnd):
    @njit(error_model="numpy")
    def row_grad(dv, v, g, w, t1, lay, eps, inv_d, acc_w, acc_s, acc_h, scaled):
        # dv <- the float32 gradient of the row; accumulates the parameter sums
        d = v.shape[0]
        ss = _reduce(v, w, lay[0], lay[1], lay[2], lay[3], lay[4], False)
        r = div_rn(_ONE, sqrt_rn(fma_rn(ss, inv_d, eps)))
        gw = np.empty(d, np.float32)
        for k in range(d):
            u = mul_rn(g[k], add_rn(_ONE, t1[k])) if scaled else g[k]
            n = mul_rn(v[k], r)
            gw[k] = mul_rn(u, w[k])
            acc_w[k] = add_rn(acc_w[k], mul_rn(u, n))
            if scaled:
                acc_s[k] = add_rn(acc_s[k], mul_rn(g[k], mul_rn(n, w[k])))
                acc_h[k] = add_rn(acc_h[k], g[k])
        dot = _reduce(v, gw, lay[0], lay[1], lay[2], lay[3], lay[4], True)
        coef = div_rn(mul_rn(mul_rn(mul_rn(r, r), r), dot), np.float32(d))
        for k in range(d):
            dv[k] = add_rn(mul_rn(gw[k], r), -mul_rn(v[k], coef))

    @njit(error_model="numpy")
    def rows(grad_x, totals, go, v, gh, w, scale, index, lay, eps, chunk_rows, scaled):
        n_rows, d = v.shape
        n_groups = scale.shape[0] if scaled else 0
        inv_d = div_rn(_ONE, np.float32(d))
        acc = np.zeros(totals.shape, np.float32)
        dv = np.empty(d, np.float32)
        for start in range(0, n_rows, chunk_rows):
            stop = min(start + chunk_rows, n_rows)
            acc[:, :] = _ZERO
            for k in range(max(n_groups, 1)):
                for i in range(start, stop):
                    if scaled and index[i] != k:
                        continue
                    t1 = scale[k] if scaled else w
                    row_grad(dv, v[i], go[i], w, t1, lay, eps, inv_d, acc[0],
                             acc[1 + k] if scaled else acc[0],
                             acc[1 + n_groups + k] if scaled else acc[0], scaled)
                    for c in range(d):
                        grad_x[i, c] = rnd(add_rn(gh[i, c], dv[c]) if gh.shape[0] else dv[c])
            for p in range(totals.shape[0]):
                for c in range(d):
                    totals[p, c] = add_rn(totals[p, c], acc[p, c])
        for p in range(totals.shape[0]):
            for c in range(d):
                totals[p, c] = rnd(totals[p, c])

    return rows


_FORWARD: dict[torch.dtype, tuple] = {}
_BACKWARD: dict[torch.dtype, object] = {}


def _forward_loops(dtype):
    if dtype not in _FORWARD:
        _FORWARD[dtype] = _make_forward(ROUNDINGS[dtype])
    return _FORWARD[dtype]


def _backward_loop(dtype):
    if dtype not in _BACKWARD:
        _BACKWARD[dtype] = _make_backward(ROUNDINGS[dtype])
    return _BACKWARD[dtype]


def _lay(op: str, x: torch.Tensor) -> np.ndarray:
    name = _NAMES[x.dtype]
    if op == "backward":
        layout = backward_layout(x.shape[1], ITEMSIZE[name])
    else:
        layout = layout_for(op, x.shape[1], name)
    return np.array(_layout_args(layout), dtype=np.int64)


def _f32(*tensors):
    return [as_f32(dense(t)) for t in tensors]


def _check(op: str, x, weight, residual=None, scale=None, shift=None, index=None):
    rows = {"x": x} if residual is None else {"x": x, "residual": residual}
    params = {"weight": (weight, ("D",))}
    if scale is not None:
        params |= {"scale": (scale, ("G", "D")), "shift": (shift, ("G", "D"))}
    check_tensors(op, "cpu", rows, params, index)
    if index is not None:
        check_index_range(op, index, scale.shape[0])


def _h(x, residual) -> np.ndarray:
    xf, rf = _f32(x, residual)
    h = np.empty_like(xf)
    _forward_loops(x.dtype)[0](h, xf, rf)
    return h


def rms_norm_cpu(x, weight, eps: float = EPS) -> torch.Tensor:
    """rms_norm on CPU tensors (vLLM's order; correctly rounded reciprocal and square
    root). ``x`` (N, D), ``weight`` (D,), one storage dtype. Raises
    :class:`kernels.errors.OpInputError`."""
    _check("rms_norm", x, weight)
    xf, wf = _f32(x, weight)
    out = np.empty_like(xf)
    _forward_loops(x.dtype)[1](out, xf, wf, _lay("rms_norm", x), np.float32(eps))
    return from_f32(out, x.dtype)


def add_rms_norm_cpu(x, residual, weight, eps: float = EPS):
    """``(out, h)`` of add_rms_norm on CPU tensors. Raises
    :class:`kernels.errors.OpInputError`."""
    _check("add_rms_norm", x, weight, residual=residual)
    h = _h(x, residual)
    out = np.empty_like(h)
    _forward_loops(x.dtype)[1](out, h, as_f32(dense(weight)), _lay("rms_norm", x),
                               np.float32(eps))
    return from_f32(out, x.dtype), from_f32(h, x.dtype)


def rms_norm_scale_shift_cpu(x, weight, scale, shift, index, eps: float = EPS):
    """rms_norm_scale_shift on CPU tensors (vllm-omni's order; correctly rounded reciprocal
    square root). ``index`` must lie in [0, G). Raises :class:`kernels.errors.OpInputError`."""
    _check("rms_norm_scale_shift", x, weight, scale=scale, shift=shift, index=index)
    xf, wf, sf, hf = _f32(x, weight, scale, shift)
    out = np.empty_like(xf)
    _forward_loops(x.dtype)[2](out, xf, wf, sf, hf, index.detach().numpy(),
                               _lay("rms_norm_scale_shift", x), np.float32(eps))
    return from_f32(out, x.dtype)


def _backward(op, grad_out, v, weight, eps, grad_h=None, scale=None, index=None):
    """(grad_x, parameter gradients (P, D)) in BACKWARD_ORDER; ``v`` float32 (N, D)."""
    dtype = grad_out.dtype
    d = v.shape[1]
    go, wf = _f32(grad_out, weight)
    gh = as_f32(dense(grad_h)) if grad_h is not None else np.zeros((0, d), np.float32)
    scaled = scale is not None
    sf = as_f32(dense(scale)) if scaled else np.zeros((0, d), np.float32)
    idx = index.detach().numpy().astype(np.int64) if scaled else np.zeros(0, np.int64)
    n_params = 1 + 2 * sf.shape[0]
    grad_x = np.empty_like(v)
    totals = np.zeros((n_params, d), np.float32)
    _backward_loop(dtype)(grad_x, totals, go, v, gh, wf, sf, idx, _lay("backward", grad_out),
                          np.float32(eps), CHUNK_ROWS[op], scaled)
    return from_f32(grad_x, dtype), from_f32(totals, dtype)


def _grad(grad, like, what, op):
    if grad is None:
        return torch.zeros_like(like)
    check_tensors(f"{op} backward", "cpu", {"x": like, what: grad}, {})
    return grad


def rms_norm_backward_cpu(grad_out, x, weight, eps: float = EPS):
    """(grad_x, grad_weight) of rms_norm on CPU tensors: the GPU's bits."""
    _check("rms_norm backward", x, weight)
    grad_out = _grad(grad_out, x, "grad_out", "rms_norm")
    grad_x, params = _backward("rms_norm", grad_out, as_f32(dense(x)), weight, eps)
    return grad_x, params[0]


def add_rms_norm_backward_cpu(grad_out, grad_h, h, weight, eps: float = EPS):
    """(grad_x, grad_weight) of add_rms_norm on CPU tensors, given the forward's ``h``
    (None upstreams are zeros); grad_residual equals grad_x. The GPU's bits."""
    _check("add_rms_norm backward", h, weight)
    grad_out = _grad(grad_out, h, "grad_out", "add_rms_norm")
    grad_h = _grad(grad_h, h, "grad_h", "add_rms_norm")
    grad_x, params = _backward("add_rms_norm", grad_out, as_f32(dense(h)), weight, eps,
                               grad_h=grad_h)
    return grad_x, params[0]


def rms_norm_scale_shift_backward_cpu(grad_out, x, weight, scale, index, eps: float = EPS):
    """(grad_x, grad_weight, grad_scale, grad_shift) of rms_norm_scale_shift on CPU tensors:
    the GPU's bits."""
    _check("rms_norm_scale_shift backward", x, weight, scale=scale, shift=scale, index=index)
    grad_out = _grad(grad_out, x, "grad_out", "rms_norm_scale_shift")
    grad_x, params = _backward("rms_norm_scale_shift", grad_out, as_f32(dense(x)), weight, eps,
                               scale=scale, index=index)
    g = scale.shape[0]
    return grad_x, params[0], params[1:1 + g], params[1 + g:]


class RMSNormCPU(torch.autograd.Function):
    """Autograd Function over :func:`rms_norm_cpu` / :func:`rms_norm_backward_cpu`."""

    @staticmethod
    def forward(ctx, x, weight, eps=EPS):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return rms_norm_cpu(x, weight, eps)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return (*rms_norm_backward_cpu(grad_out, x, weight, ctx.eps), None)


class AddRMSNormCPU(torch.autograd.Function):
    """Autograd Function over :func:`add_rms_norm_cpu`: ``(out, h)``."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps=EPS):
        out, h = add_rms_norm_cpu(x, residual, weight, eps)
        ctx.save_for_backward(h, weight)
        ctx.eps = eps
        return out, h

    @staticmethod
    def backward(ctx, grad_out, grad_h):
        h, weight = ctx.saved_tensors
        grad_x, grad_weight = add_rms_norm_backward_cpu(grad_out, grad_h, h, weight, ctx.eps)
        return grad_x, grad_x, grad_weight, None


class RMSNormScaleShiftCPU(torch.autograd.Function):
    """Autograd Function over :func:`rms_norm_scale_shift_cpu`."""

    @staticmethod
    def forward(ctx, x, weight, scale, shift, index, eps=EPS):
        ctx.save_for_backward(x, weight, scale, index)
        ctx.eps = eps
        return rms_norm_scale_shift_cpu(x, weight, scale, shift, index, eps)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, scale, index = ctx.saved_tensors
        grads = rms_norm_scale_shift_backward_cpu(grad_out, x, weight, scale, index, ctx.eps)
        return (*grads, None, None)


__all__ = ["AddRMSNormCPU", "RMSNormCPU", "RMSNormScaleShiftCPU", "add_rms_norm_backward_cpu",
           "add_rms_norm_cpu", "rms_norm_backward_cpu", "rms_norm_cpu",
           "rms_norm_scale_shift_backward_cpu", "rms_norm_scale_shift_cpu"]
