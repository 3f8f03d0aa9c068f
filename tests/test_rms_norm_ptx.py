"""The RMSNorm kernels' instructions, read from their PTX for sm_90 (needs NVVM, not a GPU).

The forward must carry the libraries' float32 operations and nothing ptxas could change:
exactly one ``fma.rn.f32`` per square after the first of each thread's chain (the rest of
the arithmetic ``mul.rn``/``add.rn``, which ptxas never contracts; no plain ``mul.f32`` /
``add.f32`` / ``fma.f32`` without a rounding modifier), the hardware approximations
``rcp/sqrt/rsqrt.approx.ftz.f32`` where the libraries' SASS has ``MUFU``, 16-byte vector
loads and no local memory (every row value in registers). The backward must use IEEE
operations only.
"""

from __future__ import annotations

import re

import pytest
from numba import cuda

from gate_residual_matrix.kernels.rms_norm_backward import backward_kernel
from gate_residual_matrix.kernels.rms_norm_forward import forward_kernel, layout_for

ELEMENT = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}
CONTRACTIBLE = re.compile(r"\b(mul|add|sub|fma)\.f32\b")


def count(pattern: str, ptx: str) -> int:
    return len(re.findall(pattern, ptx))


def forward_ptx(op: str, dtype: str, d: int, vector: bool) -> str:
    a = "uint32[:, ::1]" if vector else f"{ELEMENT[dtype]}[:, ::1]"
    n_arrays = {"rms_norm": 3, "add_rms_norm": 5, "rms_norm_scale_shift": 5}[op]
    tail = ", int64[::1], uint8[::1]" if op == "rms_norm_scale_shift" else ""
    kernel = forward_kernel(op, d, dtype, 1e-6, vector)
    return cuda.compile_ptx(kernel.py_func, f"void({', '.join([a] * n_arrays)}{tail})",
                            cc=(9, 0))[0]


@pytest.mark.parametrize("dtype", sorted(ELEMENT))
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "rms_norm_scale_shift"])
def test_forward_instructions(op, dtype):
    d = 5376
    layout = layout_for(op, d, dtype)
    ptx = forward_ptx(op, dtype, d, vector=True)
    assert not CONTRACTIBLE.search(ptx), "an operation without rounding modifier"
    assert count(r"\bld\.local|\bst\.local", ptx) == 0, "row values spilled to local memory"
    assert count(r"ld\.global\.v4", ptx) > 0 and count(r"st\.global\.v4", ptx) > 0
    chain_fmas = 0
    for c in range(layout.blocks):
        n = min(layout.reps, layout.slots - c * layout.reps) * layout.size
        chain_fmas += min(n, layout.fused) - 1 if n > 1 else 0
    if op == "rms_norm_scale_shift":
        # the chain, the mean's fma with eps, one output fma per element of the thread
        want = chain_fmas + 1 + layout.slots * layout.size
        assert count(r"rsqrt\.approx\.ftz\.f32", ptx) == 1
        assert count(r"\brcp\.approx|\bsqrt\.approx", ptx) == 0
    else:
        want = chain_fmas + 1
        assert count(r"\brcp\.approx\.ftz\.f32", ptx) == 2  # 1 / D and 1 / rms
        assert count(r"\bsqrt\.approx\.ftz\.f32", ptx) == 1
    assert count(r"\bfma\.rn\.f32", ptx) == want
    assert count(r"shfl\.sync\.bfly", ptx) == 5 * layout.blocks


def test_element_kernels_compile_without_local_memory():
    ptx = forward_ptx("rms_norm", "float16", 37, vector=False)
    assert count(r"\bld\.local|\bst\.local", ptx) == 0
    assert count(r"ld\.global\.v4", ptx) == 0


def test_ieee_variant_has_no_approximation():
    kernel = forward_kernel("rms_norm", 5376, "bfloat16", 1e-6, True, "ieee")
    a = "uint32[:, ::1]"
    ptx = cuda.compile_ptx(kernel.py_func, f"void({a}, {a}, {a})", cc=(9, 0))[0]
    assert count(r"approx", ptx) == 0 and count(r"\bdiv\.rn\.f32|\bsqrt\.rn\.f32", ptx) > 0


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "rms_norm_scale_shift"])
def test_backward_uses_ieee_operations_only(op):
    a = "uint32[:, ::1]"
    rows = {"rms_norm": 3, "add_rms_norm": 4, "rms_norm_scale_shift": 4}[op]
    tail = ", int64[::1], uint8[::1]" if op == "rms_norm_scale_shift" else ""
    sig = f"void({a}, float32[:, :, ::1], {', '.join([a] * rows)}{tail})"
    kernel = backward_kernel(op, 5376, "bfloat16", 1e-6, True)
    ptx = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0]
    assert count(r"approx", ptx) == 0
    assert not CONTRACTIBLE.search(ptx)
    assert count(r"\bld\.local|\bst\.local", ptx) == 0
