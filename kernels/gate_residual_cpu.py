"""gate_residual on the CPU with numba: the GPU kernels' algorithm, bit for bit.

Same op, shapes and dtypes as :mod:`kernels.gate_residual`. The loops compute every value
with the same float32 operations in the same order as the numba.cuda kernels (the
``grad_gate`` order is :data:`kernels.gate_residual.SUMMATION_ORDER`), so the results carry the
same bits as the GPU's, NaN included: every NaN produced by arithmetic is the canonical
``0x7FFFFFFF`` the GPU produces, stored as ``0x7FFF`` in bfloat16/float16. (Eager PyTorch on
the CPU is not a fixed target for NaN bits: its bfloat16 NaN encoding depends on whether the
element falls in a vectorised block or the tail; measured with torch 2.13 on AVX512: 0xFFFF
in the blocks, 0x7FC0 in the tail. ``tests/test_kernels_cpu.py`` therefore compares NaN
places, not NaN payloads, with eager.)

Storage values are decoded to float32 with numpy (exact) before the loops, and the loops
round to the storage dtype with integer operations on the float32 bits (round to nearest
even, overflow to infinity, float16 subnormals): ``kernels/rounding_cpu.py``. numba on the CPU
does not contract ``a * b + c`` into an FMA without ``fastmath`` (checked by the fp32 tests
against eager).

Example::

    >>> out = gate_residual_cpu(residual, gate, y, index)                  # doctest: +SKIP
    >>> grad_y, grad_gate = gate_residual_backward_cpu(grad_out, gate, y, index)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from kernels.checks import check_backward_inputs, check_inputs
from kernels.gate_residual import CHUNK_ROWS
from kernels.rounding_cpu import add_rn, mul_rn, round_bf16, round_f16, round_f32
from kernels.rounding_cpu import as_f32 as _as_f32
from kernels.rounding_cpu import from_f32 as _from_f32


def _make_loops(rnd):
    @njit(cache=False)
    def forward(out, residual, gate, y, index):
        for i in range(out.shape[0]):
            k = index[i]
            for c in range(out.shape[1]):
                product = rnd(mul_rn(gate[k, c], y[i, c]))
                out[i, c] = rnd(add_rn(residual[i, c], product))

    @njit(cache=False)
    def backward(grad_y, grad_gate, grad_out, gate, y, index, chunk_rows):
        n_rows, width = grad_out.shape
        n_gate = gate.shape[0]
        total = np.zeros((n_gate, width), dtype=np.float32)
        acc = np.zeros((n_gate, width), dtype=np.float32)
        for start in range(0, n_rows, chunk_rows):
            acc[:, :] = np.float32(0.0)
            for i in range(start, min(start + chunk_rows, n_rows)):
                k = index[i]
                for c in range(width):
                    go = grad_out[i, c]
                    grad_y[i, c] = rnd(mul_rn(go, gate[k, c]))
                    acc[k, c] = add_rn(acc[k, c], mul_rn(go, y[i, c]))
            for k in range(n_gate):
                for c in range(width):
                    total[k, c] = add_rn(total[k, c], acc[k, c])
        for k in range(n_gate):
            for c in range(width):
                grad_gate[k, c] = rnd(total[k, c])

    return forward, backward


_LOOPS = {
    torch.bfloat16: _make_loops(round_bf16),
    torch.float16: _make_loops(round_f16),
    torch.float32: _make_loops(round_f32),
}


def gate_residual_cpu(residual, gate, y, index):
    """Forward on CPU tensors: the GPU kernel's result, bit for bit.

    Shapes and dtypes as in :mod:`kernels.gate_residual`; returns a new (N, D) tensor.
    Raises :class:`kernels.errors.OpInputError` for bad input.
    """
    residual, gate, y, index = check_inputs(residual, gate, y, index, device="cpu")
    forward, _ = _LOOPS[residual.dtype]
    out = np.empty(tuple(residual.shape), dtype=np.float32)
    forward(out, _as_f32(residual), _as_f32(gate), _as_f32(y), index.detach().numpy())
    return _from_f32(out, residual.dtype)


def gate_residual_backward_cpu(grad_out, gate, y, index, *, check_index: bool = True):
    """(grad_y, grad_gate) on CPU tensors, in SUMMATION_ORDER; the GPU kernels' bits.

    ``grad_out`` (N, D) of ``y``'s dtype, ``gate`` (G, D), ``y`` (N, D), ``index`` (N,).
    Raises :class:`kernels.errors.OpInputError` for bad input (``check_index=False`` skips
    the index range, for callers that checked it, as the autograd Function's forward did).
    """
    grad_out, gate, y, index = check_backward_inputs(grad_out, gate, y, index, device="cpu",
                                                     check_index=check_index)
    _, backward = _LOOPS[grad_out.dtype]
    grad_y = np.empty(tuple(grad_out.shape), dtype=np.float32)
    grad_gate = np.empty(tuple(gate.shape), dtype=np.float32)
    backward(grad_y, grad_gate, _as_f32(grad_out), _as_f32(gate), _as_f32(y),
             index.detach().numpy(), CHUNK_ROWS)
    return _from_f32(grad_y, grad_out.dtype), _from_f32(grad_gate, gate.dtype)


class GateResidualCPU(torch.autograd.Function):
    """Autograd Function over :func:`gate_residual_cpu` / :func:`gate_residual_backward_cpu`."""

    @staticmethod
    def forward(ctx, residual, gate, y, index):
        out = gate_residual_cpu(residual, gate, y, index)
        ctx.save_for_backward(gate, y, index)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, y, index = ctx.saved_tensors
        grad_y, grad_gate = gate_residual_backward_cpu(grad_out, gate, y, index,
                                                       check_index=False)
        return grad_out, grad_gate, grad_y, None
