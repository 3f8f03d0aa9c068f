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
even, overflow to infinity, float16 subnormals). numba on the CPU does not contract ``a * b +
c`` into an FMA without ``fastmath`` (checked by the fp32 tests against eager).

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

_NAN32 = np.uint32(0x7FFFFFFF).view(np.float32)


@njit(inline="always")
def _canon(x):
    return _NAN32 if x != x else x


@njit(inline="always")
def mul_rn(a, b):
    """float32 product, round to nearest even, canonical NaN."""
    return _canon(np.float32(a * b))


@njit(inline="always")
def add_rn(a, b):
    """float32 sum, round to nearest even, canonical NaN."""
    return _canon(np.float32(a + b))


@njit(inline="always")
def round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), returned as float32."""
    if x != x:
        return _NAN32
    u = np.float32(x).view(np.uint32)
    u = np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return np.uint32(u & np.uint32(0xFFFF0000)).view(np.float32)


@njit(inline="always")
def round_f16(x):
    """float32 -> the nearest float16 value (ties to even, subnormals, overflow), as float32."""
    if x != x:
        return _NAN32
    a = abs(x)
    if a >= np.float32(65520.0):  # max float16 65504 plus half its ULP: ties go to inf
        return np.float32(np.inf) if x > 0 else np.float32(-np.inf)
    if a < np.float32(6.103515625e-05):  # 2**-14: float16 subnormal range, quantum 2**-24
        return np.float32(np.rint(x * np.float32(16777216.0)) * np.float32(5.960464477539063e-08))
    u = np.float32(x).view(np.uint32)
    u = np.uint32(u + np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))
    return np.uint32(u & np.uint32(0xFFFFE000)).view(np.float32)


@njit(inline="always")
def round_f32(x):
    """float32 -> float32 (the storage dtype is float32: nothing to round)."""
    return x


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


def _as_f32(t: torch.Tensor) -> np.ndarray:
    """Exact float32 numpy copy of a CPU tensor of a storage dtype (autograd detached)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32)
    return t.numpy().astype(np.float32)


def _from_f32(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Storage tensor from float32 values that are already representable in ``dtype``."""
    if dtype == torch.bfloat16:
        bits = (a.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    if dtype == torch.float16:
        return torch.from_numpy(a.astype(np.float16))
    return torch.from_numpy(a)


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
