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

from gate_residual_matrix.kernels import gate_residual as K

STORAGE = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}
FMA = re.compile(r"\bfma\.")
VEC_LOAD = re.compile(r"\bld\.global\.v4\.(u32|b32|f32)\b")
VEC_STORE = re.compile(r"\bst\.global\.v4\.(u32|b32|f32)\b")


def ptx_of(kernel, signature: str) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx


def signatures(dtype: str, index: str) -> dict[str, str]:
    a = f"{STORAGE[dtype]}[:, ::1]"
    return {
        "forward": f"void({a}, {a}, {a}, {a}, {index}[::1], uint8[::1])",
        "backward_chunks": (f"void({a}, float32[:, :, ::1], {a}, {a}, {a}, {index}[::1], "
                            "uint8[::1])"),
        "reduce_chunks": f"void({a}, float32[:, :, ::1])",
        "backward_chunks_global": (f"void({a}, float32[:, :, ::1], {a}, {a}, {a}, "
                                   f"{index}[::1], uint8[::1])"),
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
    names = ("forward", "backward_chunks", "reduce_chunks", "backward_chunks_global")
    kernels = dict(zip(names, K.kernels_for(dtype), strict=True))
    for name, sig in signatures(dtype, index).items():
        ptx = ptx_of(kernels[name], sig)
        assert not FMA.search(ptx), f"{name}[{dtype}, {index}] contains an FMA"
        assert "add.rn.f32" in ptx, f"{name}[{dtype}] lost its explicit-rounding add"
        if name != "reduce_chunks":
            assert "mul.rn.f32" in ptx, f"{name}[{dtype}] lost its explicit-rounding multiply"


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_vector_kernels_have_no_fma_and_no_local_memory(dtype, index):
    """The 16-byte kernels: explicit-rounding arithmetic, 16-byte loads and stores, no local
    memory; float16 converts with the hardware instructions eager uses."""
    w = "uint32[:, ::1]"
    sigs = {
        "forward": f"void({w}, {w}, {w}, {w}, {index}[::1], uint8[::1])",
        "backward_chunks": (f"void({w}, float32[:, :, ::1], {w}, {w}, {w}, {index}[::1], "
                            "uint8[::1])"),
        "backward_fused": (f"void({w}, {w}, {w}, uint32[::1], {w}, {w}, {w}, {index}[::1], "
                           "uint8[::1])"),
    }
    kernels = dict(zip(("forward", "backward_chunks", "backward_fused"),
                       K.vec_kernels_for(dtype), strict=True))
    for name, sig in sigs.items():
        ptx = ptx_of(kernels[name], sig)
        where = f"vector {name}[{dtype}, {index}]"
        assert not FMA.search(ptx), f"{where} contains an FMA"
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx, where
        assert VEC_LOAD.search(ptx), f"{where}: no 16-byte loads"
        assert VEC_STORE.search(ptx), f"{where}: no 16-byte stores"
        assert "ld.local" not in ptx and "st.local" not in ptx, f"{where}: local memory"
        if dtype == "float16":
            assert "cvt.rn.f16.f32" in ptx and "cvt.f32.f16" in ptx, f"{where}: no hardware cvt"
        if name == "backward_fused":
            # the last block reads the other blocks' partial sums through L2 only, after a
            # fence and the ticket; the atomic touches the tickets (u32), no summed value
            assert re.search(r"\bld\.global\.cg\.v4\.u32\b", ptx), f"{where}: no ld.cg"
            assert "membar.gl" in ptx or "fence.sc.gpu" in ptx, f"{where}: no fence"
            atomics = re.findall(r"\batom\.\S+", ptx)
            assert atomics and all(a.endswith(".u32") for a in atomics), (where, atomics)


@pytest.mark.parametrize("dtype", sorted(STORAGE))
def test_element_backward_keeps_its_sums_where_it_says(dtype):
    """backward_chunks sums in shared memory; backward_chunks_global (G too large for it) in
    the partials buffer; neither spills to local memory."""
    sig = signatures(dtype, "int64")["backward_chunks"]
    _, shared, _, in_global = K.kernels_for(dtype)
    ptx = ptx_of(shared, sig)
    assert "st.shared.f32" in ptx and "ld.shared.f32" in ptx, "shared accumulators"
    ptx_global = ptx_of(in_global, sig)
    assert "ld.shared" not in ptx_global and "ld.global.f32" in ptx_global, "global accumulators"
    for text in (ptx, ptx_global):
        assert ".local" not in text, "local memory"
