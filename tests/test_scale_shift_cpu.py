"""indexed_scale_shift's CPU twin (kernels/indexed_scale_shift_cpu.py) against eager PyTorch,
the documented summation order and float64; eager's own roundings, measured."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise
from scale_shift_cases import TORCH_DTYPES, eager, make_case

from gate_residual_matrix.kernels.errors import OpInputError
from gate_residual_matrix.kernels.indexed_scale_shift import CHUNK_ROWS
from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
    IndexedScaleShiftCPU,
    indexed_scale_shift_backward_cpu,
    indexed_scale_shift_cpu,
)

SHAPES = [(0, 5, 3), (1, 1, 1), (1, 7, 4), (7, 33, 3), (130, 5, 9), (CHUNK_ROWS * 2 + 1, 17, 4)]


def ours(x):
    out = indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], x["index"])
    grads = indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], x["index"])
    return (out, *grads)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_eager_rounds_each_op_once_in_float32(dtype, fresh_seed):
    """The claim the kernels rest on: eager's ``1 + s``, ``x * t`` and ``p + h`` are each the
    float32 result rounded once to the storage dtype (NaN places compared, not payloads).
    ``1 + s`` over all 65536 bit patterns of s; products and sums over random bit patterns."""
    dt = TORCH_DTYPES[dtype]
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)
    assert_bitwise(1 + every, (every.float() + 1).to(dt), "1 + s", nan_payload_ok=True)
    gen = torch.Generator().manual_seed(fresh_seed)
    a, b = (torch.randint(-32768, 32768, (2, 4099), generator=gen).to(torch.int16).view(dt))
    assert_bitwise(a * b, (a.float() * b.float()).to(dt), "a * b", nan_payload_ok=True)
    assert_bitwise(a + b, (a.float() + b.float()).to(dt), "a + b", nan_payload_ok=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["normal", "bits"])
def test_forward_and_grad_x_bitwise_equal_to_eager(dtype, index_dtype, shape, kind,
                                                   fresh_seed):
    x = make_case(*shape, dtype, index_dtype, fresh_seed, specials=True, kind=kind)
    out_e, grad_x_e, _, _ = eager(x)
    out, grad_x, _, _ = ours(x)
    # eager's CPU NaN encoding depends on the element's position: NaN places must match
    assert_bitwise(out, out_e, "out", nan_payload_ok=True)
    assert_bitwise(grad_x, grad_x_e, "grad_x", nan_payload_ok=True)


def test_specials_are_planted_and_reach_the_output(fresh_seed):
    """The special-values inputs do exercise NaN, infinities, signed zeros and t = 0."""
    x = make_case(300, 33, 4, "bfloat16", "int64", fresh_seed, specials=True)
    out, grad_x, *_ = ours(x)
    assert torch.isnan(out).any() and torch.isinf(out).any() and (out.view(torch.int16) == 0).any()
    assert (grad_x.view(torch.int16) == -32768).any(), "no -0.0 in grad_x"
    assert (x["scale"] == -1).any() and (x["x"].abs() < torch.finfo(torch.bfloat16).tiny).any()


def test_fp32_forward_is_not_contracted():
    """x*t = 1 + 2**-11 + 2**-24 rounds (tie to even) to 1 + 2**-11, which the shift cancels:
    0 with eager's two roundings, 2**-24 with an FMA."""
    x = torch.full((3, 4), 1 + 2**-12)
    scale = torch.full((1, 4), 2**-12)
    shift = torch.full((1, 4), -(1 + 2**-11))
    idx = torch.zeros(3, dtype=torch.int64)
    assert (1 + 2**-12) ** 2 - (1 + 2**-11) == 2**-24  # what an FMA would return
    expected = x * (1 + scale.index_select(0, idx)) + shift.index_select(0, idx)
    assert torch.all(expected == 0)
    assert_bitwise(indexed_scale_shift_cpu(x, scale, shift, idx), expected, "fp32 out")


def test_fp32_grad_scale_sum_is_not_contracted():
    """Row 1's product (1 + 2**-12)**2 rounds to 1 + 2**-11, cancelling row 0's: grad_scale
    is 0 with a separate multiply and add, 2**-24 with an FMA."""
    go = torch.tensor([[1.0], [1 + 2**-12]])
    x = torch.tensor([[-(1 + 2**-11)], [1 + 2**-12]])
    _, grad_scale, grad_shift = indexed_scale_shift_backward_cpu(
        go, x, torch.zeros(1, 1), torch.zeros(2, dtype=torch.int64))
    assert grad_scale.item() == 0.0 and grad_shift.item() == 2 + 2**-12


def oracle_param_grads(go, x, idx, g):
    """SUMMATION_ORDER with numpy float32 ufuncs (separately rounded multiply and add)."""
    go32, x32 = go.float().numpy(), x.float().numpy()  # exact for every storage dtype
    idx_np = idx.long().numpy()
    total = np.zeros((2, g, go.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        for start in range(0, go.shape[0], CHUNK_ROWS):
            acc = np.zeros_like(total)
            for i in range(start, min(start + CHUNK_ROWS, go.shape[0])):
                k = idx_np[i]
                acc[0, k] = np.add(acc[0, k], np.multiply(go32[i], x32[i]))
                acc[1, k] = np.add(acc[1, k], go32[i])
            total = np.add(total, acc)
    t = torch.from_numpy(total).to(go.dtype)  # float32 -> storage: round to nearest even
    return t[0], t[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3, 2), (CHUNK_ROWS * 3 + 5, 11, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("specials", [False, True])
def test_param_grads_follow_documented_order(dtype, shape, specials, fresh_seed):
    x = make_case(*shape, dtype, "int32", fresh_seed, specials=specials)
    _, _, grad_scale, grad_shift = ours(x)
    exp_scale, exp_shift = oracle_param_grads(x["grad_out"], x["x"], x["index"], shape[2])
    assert_bitwise(grad_scale, exp_scale, "grad_scale vs oracle", nan_payload_ok=True)
    assert_bitwise(grad_shift, exp_shift, "grad_shift vs oracle", nan_payload_ok=True)
    _, _, again_scale, again_shift = ours(x)
    assert_bitwise(again_scale, grad_scale, "grad_scale repeat")
    assert_bitwise(again_shift, grad_shift, "grad_shift repeat")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_param_grads_within_one_storage_ulp_of_fp64(dtype, fresh_seed):
    """float32 sums have ~16 bits to spare over bf16/fp16 at this N: the final rounding
    dominates (float32 storage has no such headroom: not claimed)."""
    x = make_case(2000, 64, 3, dtype, "int64", fresh_seed, specials=False)
    _, _, grad_scale, grad_shift = ours(x)
    go, xx, idx = x["grad_out"].double(), x["x"].double(), x["index"]
    eps = torch.finfo(TORCH_DTYPES[dtype]).eps
    for name, ours_t, terms in (("grad_scale", grad_scale, go * xx),
                                ("grad_shift", grad_shift, go)):
        ref = torch.zeros(3, 64, dtype=torch.float64).index_add_(0, idx, terms)
        bound = eps * 2.0 ** np.floor(np.log2(float(ref.abs().max())))
        assert float((ours_t.double() - ref).abs().max()) <= bound, name


def test_autograd_function_gives_the_functions_bits(fresh_seed):
    x = make_case(131, 9, 3, "bfloat16", "int64", fresh_seed)
    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = IndexedScaleShiftCPU.apply(xx, ss, hh, x["index"])
    out.backward(x["grad_out"])
    for got, want, name in zip((out.detach(), xx.grad, ss.grad, hh.grad), ours(x),
                               ("out", "grad_x", "grad_scale", "grad_shift"), strict=True):
        assert_bitwise(got, want, name)


def test_empty_batch_gives_empty_out_and_zero_param_grads():
    x = make_case(0, 6, 3, "bfloat16", "int64", 1)
    out, grad_x, grad_scale, grad_shift = ours(x)
    assert out.shape == (0, 6) and grad_x.shape == (0, 6)
    zeros = torch.zeros(3, 6, dtype=torch.bfloat16)
    assert_bitwise(grad_scale, zeros, "grad_scale")
    assert_bitwise(grad_shift, zeros, "grad_shift")


def test_negative_zero_grad_out_sums_to_positive_zero():
    """A sum starts at +0.0, so -0.0 terms give +0.0, as eager's index_add_ into zeros."""
    x = {"x": torch.ones(3, 2, dtype=torch.float16), "scale": torch.zeros(2, 2).half(),
         "shift": torch.zeros(2, 2).half(), "index": torch.zeros(3, dtype=torch.int64),
         "grad_out": torch.full((3, 2), -0.0, dtype=torch.float16)}
    _, _, scale_e, shift_e = eager(x)
    _, grad_x, grad_scale, grad_shift = ours(x)
    assert (grad_x.view(torch.int16) == -32768).all()  # -0.0 * 1 keeps its sign
    assert (shift_e.view(torch.int16) == 0).all() and (scale_e.view(torch.int16) == 0).all()
    assert_bitwise(grad_shift, shift_e, "grad_shift")
    assert_bitwise(grad_scale, scale_e, "grad_scale")


def _bad_inputs():
    z = torch.zeros
    ok = dict(x=z(4, 8), scale=z(3, 8), shift=z(3, 8), index=torch.zeros(4, dtype=torch.int64))
    yield r"x must be \(N, D\), got \(4,\)", {**ok, "x": z(4)}
    yield r"scale must be \(G, D=8\), got \(3, 9\)", {**ok, "scale": z(3, 9)}
    yield r"shift must be \(G, D\) = \(3, 8\) like scale, got \(2, 8\)", {**ok, "shift": z(2, 8)}
    yield "shift is torch.float16 but x is torch.float32", {**ok, "shift": z(3, 8).half()}
    yield "index must be int64 or int32", {**ok, "index": z(4)}
    yield r"index must be \(N=4,\)", {**ok, "index": torch.zeros(5, dtype=torch.int64)}
    yield "index holds 3, outside", {**ok, "index": torch.tensor([0, 1, 3, 0])}
    yield "index holds -1, outside", {**ok, "index": torch.tensor([0, -1, 2, 0])}
    yield "x must be bfloat16, float16 or float32", {**ok, "x": z(4, 8).double()}
    yield "expected cpu tensors, got meta", {k: v.to("meta") for k, v in ok.items()}
    yield "scale must be a torch.Tensor", {**ok, "scale": [[0.0] * 8] * 3}


@pytest.mark.parametrize(("message", "args"), list(_bad_inputs()),
                         ids=[m[:30] for m, _ in _bad_inputs()])
def test_bad_input_is_one_line_op_input_error(message, args):
    with pytest.raises(OpInputError, match=rf"^indexed_scale_shift: {message}") as info:
        indexed_scale_shift_cpu(**args)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


def test_bad_backward_input_names_the_backward():
    z = torch.zeros
    with pytest.raises(OpInputError, match=r"^indexed_scale_shift backward: grad_out must be "
                                           r"\(N, D\) = \(4, 8\) like x, got \(5, 8\)$"):
        indexed_scale_shift_backward_cpu(z(5, 8), z(4, 8), z(3, 8), torch.zeros(4).long())
    with pytest.raises(OpInputError, match=r"^indexed_scale_shift backward: grad_out is "):
        indexed_scale_shift_backward_cpu(z(4, 8).half(), z(4, 8), z(3, 8), torch.zeros(4).long())


def test_non_contiguous_and_negated_inputs_give_eager_bits(fresh_seed):
    """A transposed x and a lazily negated scale (what autograd can hand over) are read as
    their values, not their storage."""
    x = make_case(40, 24, 3, "float16", "int64", fresh_seed)
    xt = x["x"].t().contiguous().t()
    neg = torch._neg_view(x["scale"])
    out = indexed_scale_shift_cpu(xt, neg, x["shift"], x["index"])
    want = xt * (1 + neg.index_select(0, x["index"])) + x["shift"].index_select(0, x["index"])
    assert not xt.is_contiguous() and neg.is_neg()
    assert_bitwise(out, want, "out", nan_payload_ok=True)
