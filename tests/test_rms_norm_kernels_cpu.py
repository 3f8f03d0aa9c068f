"""The RMSNorm CPU twins (kernels/rms_norm_cpu.py) against the numpy oracle
(tests/rms_norm_oracle.py), bit for bit, special values included; the gradients against
float64 autograd (close, not bitwise); batch invariance. (Their input errors:
tests/test_kernels_cpu.py, with the other ops'.)"""

from __future__ import annotations

import numpy as np
import pytest
import rms_norm_oracle as O
import torch

from gate_residual_matrix.kernels import rms_norm_cpu as C
from gate_residual_matrix.kernels.rms_norm_backward import CHUNK_ROWS
from gate_residual_matrix.kernels.rounding_cpu import as_f32

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# (N, D): empty, one element, odd D (element loads on the GPU), two vLLM blocks, vllm-omni
# with three slots per thread, the MiniMax-H3 D
SHAPES = [(0, 16), (1, 1), (5, 37), (4, 1030), (3, 2056), (2, 5376)]
G = 3


def bits(t: torch.Tensor) -> np.ndarray:
    unsigned = np.uint32 if t.element_size() == 4 else np.uint16
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16).numpy().view(unsigned)


def special_rows(n: int, d: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random normal rows; rows 1.. get NaN, +Inf, -Inf, zeros and -0.0, subnormals, the
    largest finite values and tiny normals."""
    fi = torch.finfo(dtype)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    plant = [
        lambda r: r.index_fill_(0, torch.tensor([d // 2]), float("nan")),
        lambda r: r.index_fill_(0, torch.tensor([0]), float("inf")),
        lambda r: r.index_fill_(0, torch.tensor([d - 1]), float("-inf")),
        lambda r: r.copy_(torch.where(torch.arange(d) % 2 == 0, -0.0, 0.0)),
        lambda r: r.mul_(fi.smallest_normal / 4),
        lambda r: r.copy_(torch.where(r > 0, fi.max, -fi.max)),
        lambda r: r.mul_(fi.smallest_normal * 8),
        lambda r: r.mul_(1e3 if dtype == torch.float16 else 1e18),
    ]
    for i, f in enumerate(plant):
        if i + 1 < n:
            f(x[i + 1])
    return x.to(dtype)


def inputs(n: int, d: int, dtype: torch.dtype, seed: int, specials: bool = True) -> dict:
    gen = torch.Generator().manual_seed(seed)
    x = special_rows(n, d, dtype, gen) if specials else torch.randn(n, d, generator=gen).to(
        dtype)
    return {
        "x": x,
        "residual": torch.randn(n, d, generator=gen).to(dtype),
        "weight": torch.randn(d, generator=gen).to(dtype),
        "scale": (0.5 * torch.randn(G, d, generator=gen)).to(dtype),
        "shift": torch.randn(G, d, generator=gen).to(dtype),
        "index": torch.randint(0, G, (n,), generator=gen),
        "grad_out": torch.randn(n, d, generator=gen).to(dtype),
        "grad_h": torch.randn(n, d, generator=gen).to(dtype),
    }


def f32(t: torch.Tensor) -> np.ndarray:
    return as_f32(t)


def assert_bits(got: torch.Tensor, want_bits: np.ndarray, what: str) -> None:
    g = bits(got.contiguous())
    differ = np.flatnonzero(g.ravel() != want_bits.ravel())
    assert differ.size == 0, (f"{what}: {differ.size} of {g.size} elements differ, first at "
                              f"{differ[:5].tolist()}: {g.ravel()[differ[:5]]} vs "
                              f"{want_bits.ravel()[differ[:5]]}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_bitwise_equal_to_oracle(dtype, shape, fresh_seed):
    n, d = shape
    ins = inputs(n, d, DTYPES[dtype], fresh_seed)
    size = ins["x"].element_size()
    x, w = f32(ins["x"]), f32(ins["weight"])

    assert_bits(C.rms_norm_cpu(ins["x"], ins["weight"]),
                O.storage_bits(O.rms_norm(x, w, size), dtype), "rms_norm")

    out, h = C.add_rms_norm_cpu(ins["x"], ins["residual"], ins["weight"])
    h_ref = O.round_storage(O.add(x, f32(ins["residual"])), dtype)
    assert_bits(h, O.storage_bits(h_ref, dtype), "add_rms_norm h")
    assert_bits(out, O.storage_bits(O.rms_norm(h_ref, w, size), dtype), "add_rms_norm out")

    out = C.rms_norm_scale_shift_cpu(ins["x"], ins["weight"], ins["scale"], ins["shift"],
                                     ins["index"])
    ref = O.rms_norm_scale_shift(x, w, f32(ins["scale"]), f32(ins["shift"]),
                                 ins["index"].numpy(), size)
    assert_bits(out, O.storage_bits(ref, dtype), "rms_norm_scale_shift")


BACKWARD_SHAPES = [(0, 8), (1, 1), (CHUNK_ROWS["rms_norm"] + 3, 37), (3, 1030)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_bitwise_equal_to_oracle(dtype, shape, fresh_seed):
    n, d = shape
    ins = inputs(n, d, DTYPES[dtype], fresh_seed)
    size = ins["x"].element_size()
    x, w, go = f32(ins["x"]), f32(ins["weight"]), f32(ins["grad_out"])

    grad_x, grad_w = C.rms_norm_backward_cpu(ins["grad_out"], ins["x"], ins["weight"])
    dv, sums = O.backward(go, x, w, size, CHUNK_ROWS["rms_norm"])
    assert_bits(grad_x, O.storage_bits(dv, dtype), "rms_norm grad_x")
    assert_bits(grad_w, O.storage_bits(sums[0], dtype), "rms_norm grad_weight")

    h = O.round_storage(O.add(x, f32(ins["residual"])), dtype)
    _, h_twin = C.add_rms_norm_cpu(ins["x"], ins["residual"], ins["weight"])
    grad_x, grad_w = C.add_rms_norm_backward_cpu(ins["grad_out"], ins["grad_h"], h_twin,
                                                 ins["weight"])
    dv, sums = O.backward(go, h, w, size, CHUNK_ROWS["add_rms_norm"], gh=f32(ins["grad_h"]))
    assert_bits(grad_x, O.storage_bits(dv, dtype), "add_rms_norm grad_x")
    assert_bits(grad_w, O.storage_bits(sums[0], dtype), "add_rms_norm grad_weight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 8), (1, 3), (CHUNK_ROWS["rms_norm_scale_shift"] + 5, 24),
                                   (4, 1030)], ids=lambda s: "x".join(map(str, s)))
def test_scale_shift_backward_bitwise_equal_to_oracle(dtype, shape, fresh_seed):
    n, d = shape
    ins = inputs(n, d, DTYPES[dtype], fresh_seed)
    grads = C.rms_norm_scale_shift_backward_cpu(ins["grad_out"], ins["x"], ins["weight"],
                                                ins["scale"], ins["index"])
    dv, sums = O.backward(f32(ins["grad_out"]), f32(ins["x"]), f32(ins["weight"]),
                          ins["x"].element_size(), CHUNK_ROWS["rms_norm_scale_shift"],
                          scale=f32(ins["scale"]), index=ins["index"].numpy())
    want = (dv, sums[0], sums[1:1 + G], sums[1 + G:])
    for name, got, ref in zip(("grad_x", "grad_weight", "grad_scale", "grad_shift"), grads,
                              want, strict=True):
        assert_bits(got, O.storage_bits(ref, dtype), f"rms_norm_scale_shift {name}")


def _float64_reference(op: str, ins: dict) -> dict:
    f = {k: v.double().requires_grad_() for k, v in ins.items() if k != "index"}
    x = f["x"]
    if op == "add_rms_norm":
        h = f["x"] + f["residual"]
        x = h + (h.to(ins["x"].dtype).double() - h).detach()  # the rounded h, gradient 1
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * f["weight"]
    if op == "rms_norm_scale_shift":
        out = out * (1 + f["scale"][ins["index"]]) + f["shift"][ins["index"]]
    ups = [(out, f["grad_out"])] + ([(x, f["grad_h"])] if op == "add_rms_norm" else [])
    torch.autograd.backward([a for a, _ in ups], [b.detach() for _, b in ups])
    return {"out": out.detach(), **{k: t.grad for k, t in f.items() if t.grad is not None}}


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "rms_norm_scale_shift"])
def test_gradients_close_to_float64_autograd(op, fresh_seed):
    """The backward's formula: every gradient within a few float32 roundings (relative to
    the largest value) of float64 autograd on float32 inputs."""
    ins = inputs(CHUNK_ROWS[op] + 7, 96, torch.float32, fresh_seed, specials=False)
    ref = _float64_reference(op, ins)
    Fn = {"rms_norm": C.RMSNormCPU, "add_rms_norm": C.AddRMSNormCPU,
          "rms_norm_scale_shift": C.RMSNormScaleShiftCPU}[op]
    names = {"rms_norm": ("x", "weight"), "add_rms_norm": ("x", "residual", "weight"),
             "rms_norm_scale_shift": ("x", "weight", "scale", "shift")}[op]
    leaves = [ins[k].clone().requires_grad_() for k in names]
    extra = (ins["index"],) if op == "rms_norm_scale_shift" else ()
    out = Fn.apply(*leaves, *extra)
    if op == "add_rms_norm":
        torch.autograd.backward(out, (ins["grad_out"], ins["grad_h"]))
    else:
        out.backward(ins["grad_out"])
    for k, t in zip(names, leaves, strict=True):
        err = float((t.grad.double() - ref[k]).abs().max())
        scale = float(ref[k].abs().max())
        assert err <= 1e-5 * scale, f"{op} grad {k}: max error {err} vs max |grad| {scale}"


def test_batch_invariant_forward_and_grad_x(fresh_seed):
    """A row's forward and grad_x do not depend on the other rows: rows of N = 70 equal the
    same rows computed in a batch of 3."""
    ins = inputs(70, 200, torch.bfloat16, fresh_seed)
    pick = torch.tensor([0, 33, 69])
    sub = {k: (v[pick] if v.dim() and v.shape[0] == 70 else v) for k, v in ins.items()}
    full = C.rms_norm_scale_shift_cpu(ins["x"], ins["weight"], ins["scale"], ins["shift"],
                                      ins["index"])
    part = C.rms_norm_scale_shift_cpu(sub["x"], sub["weight"], sub["scale"], sub["shift"],
                                      sub["index"])
    assert np.array_equal(bits(full[pick]), bits(part))
    gx_full, _ = C.rms_norm_backward_cpu(ins["grad_out"], ins["x"], ins["weight"])
    gx_part, _ = C.rms_norm_backward_cpu(sub["grad_out"], sub["x"], sub["weight"])
    assert np.array_equal(bits(gx_full[pick]), bits(gx_part))


def test_orders_are_distinguishable(fresh_seed):
    """The bitwise comparisons can fail: on random float32 rows, the two libraries' orders
    and a plain sequential float32 sum give different sums of squares in some rows."""
    x = np.random.default_rng(fresh_seed).standard_normal((64, 5376)).astype(np.float32)
    vllm, omni = O.sum_squares(x, "vllm", 4), O.sum_squares(x, "omni", 4)
    sequential = np.zeros(64, np.float32)
    for k in range(x.shape[1]):
        sequential = O.add(sequential, O.mul(x[:, k], x[:, k]))
    assert (vllm != omni).any() and (vllm != sequential).any() and (omni != sequential).any()


def test_fma_oracle_is_exact():
    """O.fma rounds once: a case where mul-then-add double-rounds."""
    a = np.float32(1 + 2**-12)
    c = np.float32(-(1 + 2**-11))
    assert O.fma(a, a, c) == np.float32(2**-24)
    assert O.add(O.mul(a, a), c) == np.float32(0.0)
    assert C.fma_rn(a, a, c) == np.float32(2**-24)
