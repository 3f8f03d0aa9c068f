"""indexed_scale_shift's kernels have no FMA contraction: compiled to PTX for sm_90 and read.

``x * t + shift`` and the ``grad_scale`` sum ``acc + grad_out * x`` are the patterns NVVM
contracts into ``fma.rn.f32`` (tests/test_contraction.py shows it does for gate_residual's
``r + g * y``); every multiply and add of these kernels must be ``mul.rn.f32`` /
``add.rn.f32``, which ptxas never contracts. Needs NVVM (numba-cuda[cu13]), not a GPU.
"""

from __future__ import annotations

import re

import pytest
from numba import cuda

from gate_residual_matrix.kernels import indexed_scale_shift as K

STORAGE = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}
FMA = re.compile(r"\bfma\.")
NAMES = ("forward", "backward_chunks", "reduce_chunks", "backward_chunks_global")


def ptx_of(kernel, signature: str) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx


def signatures(dtype: str, index: str) -> dict[str, str]:
    a = f"{STORAGE[dtype]}[:, ::1]"
    p = "float32[:, :, ::1]"
    backward = f"void({a}, {p}, {a}, {a}, {a}, {index}[::1], uint8[::1])"
    return {"forward": f"void({a}, {a}, {a}, {a}, {index}[::1], uint8[::1])",
            "backward_chunks": backward, "reduce_chunks": f"void({a}, {a}, {p})",
            "backward_chunks_global": backward}


def naive(out, x, t, h):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * t[i] + h[i]


def test_detector_sees_contraction_of_the_scale_shift_expression():
    """The check below can fail: the plain expression becomes an FMA."""
    ptx = ptx_of(cuda.jit(naive), "void(float32[::1], float32[::1], float32[::1], float32[::1])")
    assert FMA.search(ptx), "numba-cuda no longer contracts x*t + h: update NOTES.md"


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_kernels_have_no_fma(dtype, index):
    kernels = dict(zip(NAMES, K.kernels_for(dtype), strict=True))
    for name, sig in signatures(dtype, index).items():
        ptx = ptx_of(kernels[name], sig)
        where = f"{name}[{dtype}, {index}]"
        assert not FMA.search(ptx), f"{where} contains an FMA"
        assert "add.rn.f32" in ptx, f"{where} lost its explicit-rounding add"
        if name != "reduce_chunks":
            assert "mul.rn.f32" in ptx, f"{where} lost its explicit-rounding multiply"
        if dtype == "float16":  # storage conversions: the instructions c10::Half uses
            assert "cvt.rn.f16.f32" in ptx, f"{where}: no cvt.rn.f16.f32"


@pytest.mark.parametrize("dtype", sorted(STORAGE))
def test_backward_keeps_its_sums_where_it_says(dtype):
    """backward_chunks sums in shared memory, backward_chunks_global (2G too large for it) in
    the partials buffer; neither spills to local memory."""
    sig = signatures(dtype, "int64")["backward_chunks"]
    _, shared, _, in_global = K.kernels_for(dtype)
    ptx = ptx_of(shared, sig)
    assert "st.shared.f32" in ptx and "ld.shared.f32" in ptx, "shared accumulators"
    ptx_global = ptx_of(in_global, sig)
    assert "ld.shared" not in ptx_global and "ld.global.f32" in ptx_global, "global accumulators"
    for text in (ptx, ptx_global):
        assert ".local" not in text, "local memory"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_torch_launch_signatures_compile_and_match_the_packed_parameters(dtype, index):
    """What the CUDA entry points launch without numba's dispatcher (kernels/launch.py): each
    launcher's signature compiles for its kernel, and the parameters packed from tensors (CPU
    tensors here: only pointers, shapes and item sizes are read) are as many 8-byte words as
    that signature takes in numba's array ABI (5 + 2 * ndim per array)."""
    import torch

    td, ti = getattr(torch, dtype), getattr(torch, index)
    n, d, g = 5, 7, 3
    e = torch.zeros(n, d, dtype=td)
    p = torch.zeros(g, d, dtype=td)
    idx, flag = torch.zeros(n, dtype=ti), torch.ones(1, dtype=torch.uint8)
    partial = torch.zeros(K.n_chunks(n), 2 * g, d)
    packed = {0: (e, e, p, p, idx, flag), 1: (e, partial, e, e, p, idx, flag),
              2: (p, p, partial), 3: (e, partial, e, e, p, idx, flag)}
    for which, tensors in packed.items():
        launcher = K._launcher(which, td, ti)
        ptx = ptx_of(launcher.dispatcher, launcher.argtypes)
        assert ".entry" in ptx and not FMA.search(ptx), NAMES[which]
        words = sum(5 + 2 * a.ndim for a in launcher.argtypes)
        assert len(K._params(*tensors)) == words, NAMES[which]
        assert [a.ndim for a in launcher.argtypes] == [t.dim() for t in tensors], NAMES[which]
