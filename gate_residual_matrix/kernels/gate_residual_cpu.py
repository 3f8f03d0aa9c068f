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

from gate_residual_matrix.kernels.checks import check_backward_inputs, check_inputs
from gate_residual_matrix.kernels.gate_residual import CHUNK_ROWS
from gate_residual_matrix.kernels.rounding_cpu import (
    add_rn,
    mul_rn,
    round_bf16,
    round_f16,
    round_f32,
)
from gate_residual_matrix.kernels.rounding_cpu import as_f32 as _as_f32
from gate_residual_matrix.kernels.rounding_cpu import from_f32 as _from_f32


def _make_loops(rnd):
    @njit(cache=False)
    def forward(out, residual, gate, y, index):
        for i in range(out.shape[0]):
            k = index[i]
            for c in range(out.shape[1]):
                product = rnd(mul_rn(gate[k, c], y[i, c]))
                out[i, c] = rnd(add_rn(residual[i, c], product))

    @njit(cache=False)
    def backward(grad_y, total, grad_out, gate, y, index, chunk_rows):
        # rows of one block (a whole number of chunks, but the last block's last chunk);
        # each chunk's partial sums add into ``total`` in chunk order, as the GPU's
        # reduction adds the chunk partials
        n_rows, width = grad_out.shape
        acc = np.zeros(total.shape, dtype=np.float32)
        for start in range(0, n_rows, chunk_rows):
            acc[:, :] = np.float32(0.0)
            for i in range(start, min(start + chunk_rows, n_rows)):
                k = index[i]
                for c in range(width):
                    go = grad_out[i, c]
                    grad_y[i, c] = rnd(mul_rn(go, gate[k, c]))
                    acc[k, c] = add_rn(acc[k, c], mul_rn(go, y[i, c]))
            for k in range(total.shape[0]):
                for c in range(width):
                    total[k, c] = add_rn(total[k, c], acc[k, c])

    @njit(cache=False)
    def finish(grad_gate, total):
        for k in range(total.shape[0]):
            for c in range(total.shape[1]):
                grad_gate[k, c] = rnd(total[k, c])

    return forward, backward, finish


_LOOPS = {
    torch.bfloat16: _make_loops(round_bf16),
    torch.float16: _make_loops(round_f16),
    torch.float32: _make_loops(round_f32),
}

BLOCK_ROWS = 8 * CHUNK_ROWS
"""Rows decoded to float32 at a time (1024: 22 MB per float32 tensor at D = 5376), a whole
number of the backward's chunks, so the chunks add in the same order as over all rows. Whole,
the float32 copies and their conversions were the CPU cell's memory peak at N = 32768."""


def gate_residual_cpu(residual, gate, y, index):
    """Forward on CPU tensors: the GPU kernel's result, bit for bit.

    Shapes and dtypes as in :mod:`kernels.gate_residual`; returns a new (N, D) tensor.
    Computed by blocks of :data:`BLOCK_ROWS` rows. Raises :class:`kernels.errors.OpInputError`
    for bad input.
    """
    residual, gate, y, index = check_inputs(residual, gate, y, index, device="cpu")
    forward = _LOOPS[residual.dtype][0]
    out = torch.empty(residual.shape, dtype=residual.dtype)
    gate32, index_np = _as_f32(gate), index.detach().numpy()
    for start in range(0, residual.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        part = np.empty((len(index_np[rows]), residual.shape[1]), dtype=np.float32)
        forward(part, _as_f32(residual[rows]), gate32, _as_f32(y[rows]), index_np[rows])
        out[rows] = _from_f32(part, residual.dtype)
    return out


def gate_residual_backward_cpu(grad_out, gate, y, index, *, check_index: bool = True):
    """(grad_y, grad_gate) on CPU tensors, in SUMMATION_ORDER; the GPU kernels' bits.

    ``grad_out`` (N, D) of ``y``'s dtype, ``gate`` (G, D), ``y`` (N, D), ``index`` (N,).
    Computed by blocks of :data:`BLOCK_ROWS` rows (whole chunks: the same order of
    additions). Raises :class:`kernels.errors.OpInputError` for bad input
    (``check_index=False`` skips the index range, for callers that checked it, as the
    autograd Function's forward did).
    """
    grad_out, gate, y, index = check_backward_inputs(grad_out, gate, y, index, device="cpu",
                                                     check_index=check_index)
    _, backward, finish = _LOOPS[grad_out.dtype]
    grad_y = torch.empty(grad_out.shape, dtype=grad_out.dtype)
    total = np.zeros(tuple(gate.shape), dtype=np.float32)
    gate32, index_np = _as_f32(gate), index.detach().numpy()
    for start in range(0, grad_out.shape[0], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        part = np.empty((len(index_np[rows]), grad_out.shape[1]), dtype=np.float32)
        backward(part, total, _as_f32(grad_out[rows]), gate32, _as_f32(y[rows]),
                 index_np[rows], CHUNK_ROWS)
        grad_y[rows] = _from_f32(part, grad_out.dtype)
    grad_gate = np.empty(tuple(gate.shape), dtype=np.float32)
    finish(grad_gate, total)
    return grad_y, _from_f32(grad_gate, gate.dtype)


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
