"""The GPU kernels' float32 arithmetic and storage roundings, on the CPU with numba.

Shared by the CPU twins of every op (``kernels/*_cpu.py``): each computes with the same float32
operations, in the same order, as its numba.cuda kernels, and these functions give each
operation the GPU's result bit for bit (``kernels/rounding.py`` documents the GPU side):

* :func:`mul_rn` / :func:`add_rn`: one float32 multiply or add, round to nearest even, and any
  NaN made the canonical ``0x7FFFFFFF`` that the GPU's ``mul.rn.f32`` / ``add.rn.f32`` return.
  numba on the CPU does not contract ``a * b + c`` into an FMA without ``fastmath`` (the
  fp32 tests of each op check this against eager with an input where the two differ).
* :func:`round_bf16` / :func:`round_f16` / :func:`round_f32`: float32 -> the nearest value of
  the storage dtype (ties to even, overflow to infinity, float16 subnormals), kept as float32;
  NaN -> canonical NaN, which :func:`from_f32` stores as ``0x7FFF`` (bfloat16/float16), as
  ``cvt.rn.bf16.f32`` / ``cvt.rn.f16.f32`` do.
* :func:`as_f32` / :func:`from_f32`: a CPU tensor of a storage dtype <-> an exact float32 numpy
  array (bfloat16 through its bits; float16 through numpy's exact widening).

Example::

    >>> float(round_bf16(np.float32(1.00390625)))   # 1 + 2**-8: a tie, to even
    1.0
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

NAN32 = np.uint32(0x7FFFFFFF).view(np.float32)


@njit(inline="always")
def _canon(x):
    return NAN32 if x != x else x


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
        return NAN32
    u = np.float32(x).view(np.uint32)
    u = np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return np.uint32(u & np.uint32(0xFFFF0000)).view(np.float32)


@njit(inline="always")
def round_f16(x):
    """float32 -> the nearest float16 value (ties to even, subnormals, overflow), as float32."""
    if x != x:
        return NAN32
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


#: torch storage dtype -> its rounding function
ROUNDINGS = {torch.bfloat16: round_bf16, torch.float16: round_f16, torch.float32: round_f32}


def as_f32(t: torch.Tensor) -> np.ndarray:
    """Exact float32 numpy copy of a CPU tensor of a storage dtype (autograd detached)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32)
    return t.numpy().astype(np.float32)


def from_f32(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Storage tensor from float32 values that are already representable in ``dtype``."""
    if dtype == torch.bfloat16:
        bits = (a.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    if dtype == torch.float16:
        return torch.from_numpy(a.astype(np.float16))
    return torch.from_numpy(a)


__all__ = ["NAN32", "ROUNDINGS", "add_rn", "as_f32", "from_f32", "mul_rn", "round_bf16",
           "round_f16", "round_f32"]
