"""The RMSNorm numba.cuda kernels on a GPU (run on the H200): against the numpy oracle with
the GPU's own MUFU results, against vLLM's and vllm-omni's Triton kernels (loaded from the
wheels' files by tests/rms_norm_library_kernels.py when present), against the CPU twin for
the backward, and for batch invariance and repeatability. Bits are compared as integers."""

from __future__ import annotations

import numpy as np
import pytest
import rms_norm_gpu_math as M
import rms_norm_oracle as O
import torch
from test_rms_norm_kernels_cpu import DTYPES, G, bits, inputs

from gate_residual_matrix.kernels import rms_norm as K
from gate_residual_matrix.kernels import rms_norm_cpu as C
from gate_residual_matrix.kernels.errors import OpInputError
from gate_residual_matrix.kernels.rms_norm_backward import CHUNK_ROWS
from gate_residual_matrix.kernels.rounding_cpu import as_f32

pytestmark = pytest.mark.gpu

# (N, D): empty, one element, odd D (element loads), vector loads with one and several
# slots per thread, two vLLM blocks, the MiniMax-H3 D
SHAPES = [(0, 16), (1, 1), (7, 37), (5, 64), (9, 1030), (4, 2056), (33, 5376)]
LIB_SHAPES = [(1, 5376), (257, 5376), (31, 1024), (17, 2064), (9, 4096)]


def cuda(ins: dict) -> dict:
    return {k: v.cuda() for k, v in ins.items()}


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    a, b = bits(got.cpu().contiguous()), bits(want.cpu().contiguous())
    differ = np.flatnonzero(a.ravel() != b.ravel())
    assert differ.size == 0, (f"{what}: {differ.size} of {a.size} elements differ, first "
                              f"at {differ[:5].tolist()}")


def assert_bits(got: torch.Tensor, want_bits: np.ndarray, what: str) -> None:
    a = bits(got.cpu().contiguous())
    differ = np.flatnonzero(a.ravel() != want_bits.ravel())
    assert differ.size == 0, (f"{what}: {differ.size} of {a.size} elements differ, first "
                              f"at {differ[:5].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_bitwise_equal_to_oracle_with_gpu_approximations(dtype, shape, fresh_seed):
    n, d = shape
    ins = inputs(n, d, DTYPES[dtype], fresh_seed)
    g = cuda(ins)
    size = ins["x"].element_size()
    x, w = as_f32(ins["x"]), as_f32(ins["weight"])
    assert_bits(K.rms_norm_forward(g["x"], g["weight"]),
                O.storage_bits(O.rms_norm(x, w, size, rcp=M.rcp, sqrt=M.sqrt), dtype),
                "rms_norm")
    out, h = K.add_rms_norm_forward(g["x"], g["residual"], g["weight"])
    h_ref = O.round_storage(O.add(x, as_f32(ins["residual"])), dtype)
    assert_bits(h, O.storage_bits(h_ref, dtype), "add_rms_norm h")
    assert_bits(out, O.storage_bits(O.rms_norm(h_ref, w, size, rcp=M.rcp, sqrt=M.sqrt), dtype),
                "add_rms_norm out")
    out = K.rms_norm_scale_shift_forward(g["x"], g["weight"], g["scale"], g["shift"],
                                         g["index"])
    ref = O.rms_norm_scale_shift(x, w, as_f32(ins["scale"]), as_f32(ins["shift"]),
                                 ins["index"].numpy(), size, rsqrt=M.rsqrt)
    assert_bits(out, O.storage_bits(ref, dtype), "rms_norm_scale_shift")


@pytest.fixture(scope="module")
def libraries():
    from rms_norm_library_kernels import libs_dir, load_all

    libs = load_all()
    if not libs:
        pytest.skip(f"no library files in {libs_dir()} (set RMS_NORM_LIBS)")
    return libs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LIB_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_bitwise_equal_to_library_triton_kernels(libraries, dtype, shape, fresh_seed):
    n, d = shape
    g = cuda(inputs(n, d, DTYPES[dtype], fresh_seed))
    compared = 0
    for label, lib in libraries.items():
        if hasattr(lib, "rms_norm_batch_invariant"):
            assert_same(K.rms_norm_forward(g["x"], g["weight"]),
                        lib.rms_norm_batch_invariant(g["x"], g["weight"], 1e-6),
                        f"rms_norm vs {label}")
            out, h = K.add_rms_norm_forward(g["x"], g["residual"], g["weight"])
            eager_h = g["x"] + g["residual"]
            assert_same(h, eager_h, "add_rms_norm h vs eager x + residual")
            assert_same(out, lib.rms_norm_batch_invariant(eager_h, g["weight"], 1e-6),
                        f"add_rms_norm vs eager add + {label}")
        else:
            ours = K.rms_norm_scale_shift_forward(g["x"], g["weight"], g["scale"],
                                                  g["shift"], g["index"])
            theirs = lib.rms_norm_indexed_scale_shift(g["x"], g["weight"], g["shift"],
                                                      g["scale"], g["index"], 1e-6)
            assert_same(ours, theirs, f"rms_norm_scale_shift vs {label}")
        compared += 1
    assert compared == len(libraries)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (CHUNK_ROWS["rms_norm"] + 3, 37),
                                   (CHUNK_ROWS["rms_norm_scale_shift"] + 5, 64), (70, 5376)],
                         ids=lambda s: "x".join(map(str, s)))
def test_backward_bitwise_equal_to_cpu_twin(dtype, shape, fresh_seed):
    n, d = shape
    ins = inputs(n, d, DTYPES[dtype], fresh_seed)
    g = cuda(ins)
    got = K.rms_norm_backward(g["grad_out"], g["x"], g["weight"])
    want = C.rms_norm_backward_cpu(ins["grad_out"], ins["x"], ins["weight"])
    for name, a, b in zip(("grad_x", "grad_weight"), got, want, strict=True):
        assert_same(a, b, f"rms_norm {name}")
    _, h = K.add_rms_norm_forward(g["x"], g["residual"], g["weight"])
    got = K.add_rms_norm_backward(g["grad_out"], g["grad_h"], h, g["weight"])
    want = C.add_rms_norm_backward_cpu(ins["grad_out"], ins["grad_h"], h.cpu(), ins["weight"])
    for name, a, b in zip(("grad_x", "grad_weight"), got, want, strict=True):
        assert_same(a, b, f"add_rms_norm {name}")
    got = K.rms_norm_scale_shift_backward(g["grad_out"], g["x"], g["weight"], g["scale"],
                                          g["index"])
    want = C.rms_norm_scale_shift_backward_cpu(ins["grad_out"], ins["x"], ins["weight"],
                                               ins["scale"], ins["index"])
    for name, a, b in zip(("grad_x", "grad_weight", "grad_scale", "grad_shift"), got, want,
                          strict=True):
        assert_same(a, b, f"rms_norm_scale_shift {name}")


PARAMETER_GRADS = ("grad_weight", "grad_scale", "grad_shift")


def _all_outputs(g: dict) -> dict:
    """Every output of the three ops' forward and backward for inputs ``g``."""
    out = {"rms_norm": K.rms_norm_forward(g["x"], g["weight"])}
    out["add_rms_norm"], out["h"] = K.add_rms_norm_forward(g["x"], g["residual"], g["weight"])
    out["rms_norm_scale_shift"] = K.rms_norm_scale_shift_forward(
        g["x"], g["weight"], g["scale"], g["shift"], g["index"])
    out["rms_norm grad_x"], out["rms_norm grad_weight"] = K.rms_norm_backward(
        g["grad_out"], g["x"], g["weight"])
    out["add grad_x"], out["add grad_weight"] = K.add_rms_norm_backward(
        g["grad_out"], g["grad_h"], out["h"], g["weight"])
    grads = K.rms_norm_scale_shift_backward(g["grad_out"], g["x"], g["weight"], g["scale"],
                                            g["index"])
    for name, t in zip(("grad_x", "grad_weight", "grad_scale", "grad_shift"), grads,
                       strict=True):
        out[f"scale_shift {name}"] = t
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_batch_invariant_and_repeatable(dtype, fresh_seed):
    """Rows computed in batches of N = 255, 256, 257 and 4097 equal the same rows of an
    N = 4100 batch (forward outputs and grad_x); a second run gives the same bits for every
    output, parameter gradients included."""
    full = cuda(inputs(4100, 5376, DTYPES[dtype], fresh_seed))
    big = _all_outputs(full)
    again = _all_outputs(full)
    for name in big:
        assert_same(again[name], big[name], f"{name} repeated")
    for n in (255, 256, 257, 4097):
        part = _all_outputs({k: (v[:n] if v.dim() and v.shape[0] == 4100 else v)
                             for k, v in full.items()})
        for name, t in part.items():
            if name.split()[-1] in PARAMETER_GRADS:
                continue  # parameter sums cover all rows
            assert_same(t, big[name][:n], f"{name} at N={n}")


def test_misaligned_and_strided_inputs_give_the_same_bits(fresh_seed):
    """A tensor whose data pointer is not 16-byte aligned takes the element-load kernels,
    a strided one is made contiguous: the bits are those of the vector kernels."""
    ins = cuda(inputs(9, 64, torch.bfloat16, fresh_seed))
    flat = torch.empty(9 * 64 + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(9, 64)
    shifted.copy_(ins["x"])
    assert shifted.data_ptr() % 16
    assert_same(K.rms_norm_forward(shifted, ins["weight"]),
                K.rms_norm_forward(ins["x"], ins["weight"]), "misaligned rms_norm")
    wide = torch.zeros(9, 128, dtype=torch.bfloat16, device="cuda")
    wide[:, ::2] = ins["x"]
    assert_same(K.rms_norm_scale_shift_forward(wide[:, ::2], ins["weight"], ins["scale"],
                                               ins["shift"], ins["index"]),
                K.rms_norm_scale_shift_forward(ins["x"], ins["weight"], ins["scale"],
                                               ins["shift"], ins["index"]), "strided")


def test_autograd_functions_match_the_entry_points(fresh_seed):
    ins = cuda(inputs(70, 200, torch.bfloat16, fresh_seed))
    x, w = (ins[k].clone().requires_grad_() for k in ("x", "weight"))
    out = K.rms_norm(x, w)
    out.backward(ins["grad_out"])
    grad_x, grad_w = K.rms_norm_backward(ins["grad_out"], ins["x"], ins["weight"])
    assert_same(x.grad, grad_x, "autograd grad_x")
    assert_same(w.grad, grad_w, "autograd grad_weight")


def test_bad_index(fresh_seed):
    ins = cuda(inputs(5, 32, torch.bfloat16, fresh_seed, specials=False))
    bad = ins["index"].clone()
    bad[2] = G
    with pytest.raises(OpInputError, match="outside"):
        K.rms_norm_scale_shift_forward(ins["x"], ins["weight"], ins["scale"], ins["shift"],
                                       bad, check_index="sync")
    out = K.rms_norm_scale_shift_forward(ins["x"], ins["weight"], ins["scale"], ins["shift"],
                                         bad, check_index=False)
    assert torch.isnan(out[2]).all() and not torch.isnan(out[[0, 1, 3, 4]]).any()
