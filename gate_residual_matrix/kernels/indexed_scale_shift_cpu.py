"""indexed_scale_shift on the CPU with numba: the GPU kernels' algorithm, bit for bit.

Same op, shapes, dtypes and errors as :mod:`kernels.indexed_scale_shift`. The loops compute
every value with the same float32 operations in the same order as the numba.cuda kernels
(``kernels/rounding_cpu.py`` gives each operation the GPU's result, canonical NaN included),
so forward, ``grad_x``, ``grad_scale`` and ``grad_shift`` carry the GPU's bits; the parameter
sums follow :data:`kernels.indexed_scale_shift.SUMMATION_ORDER`. Forward and ``grad_x`` also
equal eager's bits on the CPU except in NaN payloads: eager's own CPU bfloat16/float16 NaN
encoding depends on whether an element falls in a vectorised block or the tail (see
``kernels/gate_residual_cpu.py``), so the CPU tests compare NaN places, not payloads.

Example::

    >>> out = indexed_scale_shift_cpu(x, scale, shift, index)                # doctest: +SKIP
    >>> gx, gscale, gshift = indexed_scale_shift_backward_cpu(go, x, scale, index)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from gate_residual_matrix.kernels.indexed_scale_shift import CHUNK_ROWS
from gate_residual_matrix.kernels.indexed_scale_shift_checks import (
    check_backward_inputs,
    check_inputs,
)
from gate_residual_matrix.kernels.rounding_cpu import ROUNDINGS, add_rn, as_f32, from_f32, mul_rn

_ONE = np.float32(1.0)


def _make_loops(rnd):
    @njit(cache=False)
    def forward(out, x, scale, shift, index):
        for i in range(out.shape[0]):
            k = index[i]
            for c in range(out.shape[1]):
                t = rnd(add_rn(_ONE, scale[k, c]))
                product = rnd(mul_rn(x[i, c], t))
                out[i, c] = rnd(add_rn(product, shift[k, c]))

    @njit(cache=False)
    def backward(grad_x, grad_scale, grad_shift, grad_out, x, scale, index, chunk_rows):
        n_rows, width = grad_out.shape
        n_gate = scale.shape[0]
        total = np.zeros((2 * n_gate, width), dtype=np.float32)
        acc = np.zeros((2 * n_gate, width), dtype=np.float32)
        for start in range(0, n_rows, chunk_rows):
            acc[:, :] = np.float32(0.0)
            for i in range(start, min(start + chunk_rows, n_rows)):
                k = index[i]
                for c in range(width):
                    go = grad_out[i, c]
                    t = rnd(add_rn(_ONE, scale[k, c]))
                    grad_x[i, c] = rnd(mul_rn(go, t))
                    acc[k, c] = add_rn(acc[k, c], mul_rn(go, x[i, c]))
                    acc[n_gate + k, c] = add_rn(acc[n_gate + k, c], go)
            for r in range(2 * n_gate):
                for c in range(width):
                    total[r, c] = add_rn(total[r, c], acc[r, c])
        for k in range(n_gate):
            for c in range(width):
                grad_scale[k, c] = rnd(total[k, c])
                grad_shift[k, c] = rnd(total[n_gate + k, c])

    return forward, backward


_LOOPS: dict[torch.dtype, tuple] = {}


def _loops(dtype: torch.dtype):
    """(forward, backward) numba loops of a storage dtype, built on first use."""
    if dtype not in _LOOPS:
        _LOOPS[dtype] = _make_loops(ROUNDINGS[dtype])
    return _LOOPS[dtype]


def indexed_scale_shift_cpu(x, scale, shift, index):
    """Forward on CPU tensors: ``x * (1 + scale[index]) + shift[index]``, the GPU's bits.

    ``x`` (N, D); ``scale``, ``shift`` (G, D) of ``x``'s dtype (bfloat16, float16, float32);
    ``index`` (N,) int64/int32 in [0, G). Returns a new (N, D) tensor. Raises
    :class:`kernels.errors.OpInputError` for bad input.
    """
    x, scale, shift, index = check_inputs(x, scale, shift, index, device="cpu")
    out = np.empty(tuple(x.shape), dtype=np.float32)
    _loops(x.dtype)[0](out, as_f32(x), as_f32(scale), as_f32(shift), index.detach().numpy())
    return from_f32(out, x.dtype)


def indexed_scale_shift_backward_cpu(grad_out, x, scale, index, *, check_index: bool = True):
    """(grad_x, grad_scale, grad_shift) on CPU tensors; the GPU kernels' bits.

    ``grad_out``, ``x`` (N, D), ``scale`` (G, D), one storage dtype; ``index`` (N,).
    ``grad_scale`` and ``grad_shift`` follow SUMMATION_ORDER. Raises
    :class:`kernels.errors.OpInputError` for bad input (``check_index=False`` skips the index
    range, for callers that checked it, as the autograd Function's forward did).
    """
    grad_out, x, scale, index = check_backward_inputs(grad_out, x, scale, index, device="cpu",
                                                      check_index=check_index)
    grad_x = np.empty(tuple(x.shape), dtype=np.float32)
    grad_scale = np.empty(tuple(scale.shape), dtype=np.float32)
    grad_shift = np.empty(tuple(scale.shape), dtype=np.float32)
    _loops(x.dtype)[1](grad_x, grad_scale, grad_shift, as_f32(grad_out), as_f32(x),
                       as_f32(scale), index.detach().numpy(), CHUNK_ROWS)
    return (from_f32(grad_x, x.dtype), from_f32(grad_scale, x.dtype),
            from_f32(grad_shift, x.dtype))


class IndexedScaleShiftCPU(torch.autograd.Function):
    """Autograd Function over :func:`indexed_scale_shift_cpu` /
    :func:`indexed_scale_shift_backward_cpu`: ``IndexedScaleShiftCPU.apply(x, scale, shift,
    index)``."""

    @staticmethod
    def forward(ctx, x, scale, shift, index):
        out = indexed_scale_shift_cpu(x, scale, shift, index)
        ctx.save_for_backward(x, scale, index)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, scale, index = ctx.saved_tensors
        grads = indexed_scale_shift_backward_cpu(grad_out, x, scale, index, check_index=False)
        return (*grads, None)


__all__ = ["IndexedScaleShiftCPU", "indexed_scale_shift_backward_cpu",
           "indexed_scale_shift_cpu"]
