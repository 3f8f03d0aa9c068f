"""No FMA contraction in the indexed ops' kernels: compiled to PTX for sm_90 and read.

numba-cuda contracts a plain ``a * b + c`` into ``fma.rn.f32`` by default (measured on the
H200; ``test_detector_sees_contraction`` shows it here too for each op's expression). Our
kernels must contain no ``fma`` at all and must use ``mul.rn.f32`` / ``add.rn.f32``, which
ptxas never contracts. Each check runs for every op of :data:`KERNELS`, a table keyed by the
registered op's name with what differs between them: the kernel module, the reduction's
signature and the plain expression the detector compiles. (The RMSNorm kernels carry
intended FMAs: tests/test_rms_norm_ptx.py.) Needs NVVM (the numba-cuda[cu13] wheels bring
it), not a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

import pytest
from numba import cuda

from gate_residual_matrix import ops
from gate_residual_matrix.kernels import gate_residual, indexed_scale_shift

STORAGE = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}
INDEX_DTYPES = ("int64", "int32")
FMA = re.compile(r"\bfma\.")
VEC_LOAD = re.compile(r"\bld\.global\.v4\.(u32|b32|f32)\b")
VEC_STORE = re.compile(r"\bst\.global\.v4\.(u32|b32|f32)\b")
NAMES = ("forward", "backward_chunks", "reduce_chunks", "backward_chunks_global")
PARTIAL = "float32[:, :, ::1]"


def naive_gate_residual(out, residual, gate, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = residual[i] + gate[i] * y[i]


def naive_scale_shift(out, x, t, h):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] * t[i] + h[i]


@dataclass(frozen=True)
class Kernels:
    """What differs between two indexed ops' kernels, for these checks."""

    module: ModuleType  # has kernels_for(dtype) -> the four element kernels of NAMES
    reduce_args: int  # storage arrays reduce_chunks writes (grad_gate; grad_scale, grad_shift)
    naive: object  # the op's plain expression as a kernel, for the detector
    expression: str


KERNELS = {
    "gate_residual": Kernels(gate_residual, 1, naive_gate_residual, "r + g*y"),
    "indexed_scale_shift": Kernels(indexed_scale_shift, 2, naive_scale_shift, "x*t + h"),
}


def ptx_of(kernel, signature: str) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx


def signatures(op: str, dtype: str, index: str) -> dict[str, str]:
    """numba signature of each element kernel of ``op`` (kernels_for order)."""
    a = f"{STORAGE[dtype]}[:, ::1]"
    backward = f"void({a}, {PARTIAL}, {a}, {a}, {a}, {index}[::1], uint8[::1])"
    reduce_args = ", ".join([a] * KERNELS[op].reduce_args + [PARTIAL])
    return {"forward": f"void({a}, {a}, {a}, {a}, {index}[::1], uint8[::1])",
            "backward_chunks": backward, "reduce_chunks": f"void({reduce_args})",
            "backward_chunks_global": backward}


def test_table_holds_registered_ops():
    assert set(KERNELS) <= set(ops.OPS), sorted(set(KERNELS) - set(ops.OPS))


@pytest.mark.parametrize("op", KERNELS)
def test_detector_sees_contraction(op):
    """The checks below can fail: numba-cuda turns the op's plain expression into an FMA."""
    k = KERNELS[op]
    ptx = ptx_of(cuda.jit(k.naive), "void(float32[::1], float32[::1], float32[::1], float32[::1])")
    assert FMA.search(ptx), f"numba-cuda no longer contracts {k.expression}: update NOTES.md"


@pytest.mark.parametrize("op", KERNELS)
@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", INDEX_DTYPES)
def test_kernels_have_no_fma(op, dtype, index):
    kernels = dict(zip(NAMES, KERNELS[op].module.kernels_for(dtype), strict=True))
    for name, sig in signatures(op, dtype, index).items():
        ptx = ptx_of(kernels[name], sig)
        where = f"{op} {name}[{dtype}, {index}]"
        assert not FMA.search(ptx), f"{where} contains an FMA"
        assert "add.rn.f32" in ptx, f"{where} lost its explicit-rounding add"
        if name != "reduce_chunks":
            assert "mul.rn.f32" in ptx, f"{where} lost its explicit-rounding multiply"
        if dtype == "float16":  # storage conversions: the instructions c10::Half uses
            assert "cvt.rn.f16.f32" in ptx, f"{where}: no cvt.rn.f16.f32"


@pytest.mark.parametrize("op", KERNELS)
@pytest.mark.parametrize("dtype", sorted(STORAGE))
def test_backward_keeps_its_sums_where_it_says(op, dtype):
    """backward_chunks sums in shared memory; backward_chunks_global (parameter rows too many
    for it) in the partials buffer; neither spills to local memory."""
    sig = signatures(op, dtype, "int64")["backward_chunks"]
    _, shared, _, in_global = KERNELS[op].module.kernels_for(dtype)
    ptx = ptx_of(shared, sig)
    assert "st.shared.f32" in ptx and "ld.shared.f32" in ptx, f"{op}: shared accumulators"
    ptx_global = ptx_of(in_global, sig)
    assert "ld.shared" not in ptx_global and "ld.global.f32" in ptx_global, (
        f"{op}: global accumulators")
    for text in (ptx, ptx_global):
        assert ".local" not in text, f"{op}: local memory"


# ------------------------------------------------------------------ gate_residual only


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", INDEX_DTYPES)
def test_gate_residual_vector_kernels_have_no_fma_and_no_local_memory(dtype, index):
    """The 16-byte kernels: explicit-rounding arithmetic, 16-byte loads and stores, no local
    memory; float16 converts with the hardware instructions eager uses."""
    w = "uint32[:, ::1]"
    sigs = {
        "forward": f"void({w}, {w}, {w}, {w}, {index}[::1], uint8[::1])",
        "backward_chunks": f"void({w}, {PARTIAL}, {w}, {w}, {w}, {index}[::1], uint8[::1])",
        "backward_fused": (f"void({w}, {w}, {w}, uint32[::1], {w}, {w}, {w}, {index}[::1], "
                           "uint8[::1])"),
    }
    kernels = dict(zip(("forward", "backward_chunks", "backward_fused"),
                       gate_residual.vec_kernels_for(dtype), strict=True))
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


# ------------------------------------------------------------ indexed_scale_shift only


@pytest.mark.parametrize("dtype", sorted(STORAGE))
@pytest.mark.parametrize("index", INDEX_DTYPES)
def test_scale_shift_torch_launch_signatures_compile_and_match_the_packed_parameters(dtype,
                                                                                     index):
    """What the CUDA entry points launch without numba's dispatcher (kernels/launch.py): each
    launcher's signature compiles for its kernel, and the parameters packed from tensors (CPU
    tensors here: only pointers, shapes and item sizes are read) are as many 8-byte words as
    that signature takes in numba's array ABI (5 + 2 * ndim per array)."""
    import torch

    K = indexed_scale_shift
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
