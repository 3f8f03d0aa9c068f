"""No FMA contraction in our kernels: compile them to PTX for sm_90 and read the instructions.

numba-cuda contracts ``r + g * y`` into ``fma.rn.f32`` by default (measured on the H200;
``test_detector_sees_contraction`` shows it here too). Our kernels must contain no ``fma``
at all, and must use ``mul.rn.f32`` / ``add.rn.f32``, which ptxas never contracts. Needs
NVVM (the numba-cuda[cu13] wheels bring it), not a GPU.
"""

from __future__ import annotations

import re

import pytest
from numba import cuda

from kernels import gate_residual as K

STORAGE = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}
FMA = re.compile(r"\bfma\.")


def ptx_of(kernel, signature: str) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx


def signatures(dtype: str, index: str) -> dict[str, str]:
    a = f"{STORAGE[dtype]}[:, ::1]"
    return {
        "forward": f"void({a}, {a}, {a}, {a}, {index}[::1])",
        "backward_chunks": f"void({a}, float32[:, :, ::1], {a}, {a}, {a}, {index}[::1])",
        "reduce_chunks": f"void({a}, float32[:, :, ::1])",
    }


def naive(out, residual, gate, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = residual[i] + gate[i] * y[i]


def test_detector_sees_contraction():
    """The check below can fail: numba-cuda turns the plain expression into an FMA."""
    ptx = ptx_of(cuda.jit(naive), "void(float32[::1], float32[::1], float32[::1], float32[::1])")
    assert FMA.search(ptx), "numba-cuda no longer contracts r + g*y: update NOTES.md"


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_kernels_have_no_fma(dtype, index):
    names = ("forward", "backward_chunks", "reduce_chunks")
    kernels = dict(zip(names, K.kernels_for(dtype), strict=True))
    for name, sig in signatures(dtype, index).items():
        ptx = ptx_of(kernels[name], sig)
        assert not FMA.search(ptx), f"{name}[{dtype}, {index}] contains an FMA"
        assert "add.rn.f32" in ptx, f"{name}[{dtype}] lost its explicit-rounding add"
        if name != "reduce_chunks":
            assert "mul.rn.f32" in ptx, f"{name}[{dtype}] lost its explicit-rounding multiply"


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_word_kernels_have_no_fma_and_no_local_memory(dtype, index):
    w = "int64[:, ::1]"
    sigs = {
        "forward": f"void({w}, {w}, {w}, {w}, {index}[::1])",
        "backward_chunks": f"void({w}, float32[:, :, ::1], {w}, {w}, {w}, {index}[::1])",
    }
    kernels = dict(zip(("forward", "backward_chunks"), K.word_kernels_for(dtype), strict=True))
    for name, sig in sigs.items():
        ptx = ptx_of(kernels[name], sig)
        assert not FMA.search(ptx), f"word {name}[{dtype}, {index}] contains an FMA"
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx, f"word {name}[{dtype}]"
        assert "ld.global.u64" in ptx or "ld.global.nc.u64" in ptx, f"word {name}: no 8-byte loads"
        assert "ld.local" not in ptx and "st.local" not in ptx, f"word {name}: local memory"
