"""The indexed ops' CPU twins against eager PyTorch, their documented summation order and
float64; then each op's own checks.

The CPU twins (kernels/gate_residual_cpu.py, kernels/indexed_scale_shift_cpu.py) run the
numba.cuda kernels' algorithm. Each shared check runs for every op of :data:`TWINS`, a table
keyed by the registered op's name with what differs: inputs, the twin's and eager's outputs,
the outputs that must equal eager's, the parameter sums (per-row float32 terms, summed in
``SUMMATION_ORDER``) and the shapes. The RMSNorm twins' target is a numpy oracle of the
libraries' order, not eager (tests/test_rms_norm_kernels_cpu.py); their bad inputs are
checked here with the indexed ops'.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise, inputs
from scale_shift_cases import TORCH_DTYPES, make_case
from scale_shift_cases import eager as scale_shift_eager

from gate_residual_matrix import ops
from gate_residual_matrix.kernels import gate_residual as G
from gate_residual_matrix.kernels import indexed_scale_shift as S
from gate_residual_matrix.kernels import rms_norm_cpu
from gate_residual_matrix.kernels.errors import OpInputError
from gate_residual_matrix.kernels.gate_residual_cpu import (
    BLOCK_ROWS,
    gate_residual_backward_cpu,
    gate_residual_cpu,
)
from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
    IndexedScaleShiftCPU,
    indexed_scale_shift_backward_cpu,
    indexed_scale_shift_cpu,
)


def _gate_residual_inputs(n, d, g, dtype, index_dtype, seed, specials=True, kind="normal"):
    assert kind == "normal", kind
    return inputs(n, d, g, dtype, index_dtype, seed, specials=specials)


def _gate_residual_ours(x) -> dict:
    grad_y, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    return {"out": gate_residual_cpu(x["residual"], x["gate"], x["y"], x["index"]),
            "input_grad": grad_y, "grad_gate": grad_gate}


def _gate_residual_eager(x) -> dict:
    r, g, y = (x[k].clone().requires_grad_() for k in ("residual", "gate", "y"))
    out = r + g.index_select(0, x["index"]) * y
    out.backward(x["grad_out"])
    return {"out": out.detach(), "input_grad": y.grad, "grad_gate": g.grad}


def _scale_shift_ours(x) -> dict:
    grads = indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], x["index"])
    return dict(zip(("out", "input_grad", "grad_scale", "grad_shift"),
                    (indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], x["index"]),
                     *grads), strict=True))


def _scale_shift_eager(x) -> dict:
    return dict(zip(("out", "input_grad", "grad_scale", "grad_shift"), scale_shift_eager(x),
                    strict=True))


@dataclass(frozen=True)
class Twin:
    """What differs between the indexed ops for these checks. ``input_grad`` is the gradient
    of the row input (gate_residual's ``grad_y``, indexed_scale_shift's ``grad_x``)."""

    make: Callable  # (n, d, g, dtype, index_dtype, seed, specials=, kind=) -> inputs
    ours: Callable  # inputs -> {"out", "input_grad", parameter gradients...}
    eager: Callable  # inputs -> the same names, eager PyTorch with autograd
    sums: dict  # parameter gradient -> the inputs whose product (or one input) it sums
    chunk_rows: int
    shapes: tuple  # (N, D, G) of the eager comparison
    order_shapes: tuple  # (N, D, G) of the summation-order check
    order_index: str  # index dtype of the summation-order check
    kinds: tuple = ("normal",)  # input kinds of the eager comparison


TWINS = {
    "gate_residual": Twin(
        _gate_residual_inputs, _gate_residual_ours, _gate_residual_eager,
        {"grad_gate": ("grad_out", "y")},
        G.CHUNK_ROWS,
        ((0, 5, 3), (1, 1, 1), (7, 33, 3), (130, 5, 9), (G.CHUNK_ROWS * 2 + 1, 17, 4),
         (BLOCK_ROWS * 2 + G.CHUNK_ROWS + 3, 7, 4)),  # three blocks of rows, the last short
        ((1, 3, 2), (G.CHUNK_ROWS * 3 + 5, 11, 5), (BLOCK_ROWS * 2 + G.CHUNK_ROWS + 3, 11, 5)),
        "int64"),
    "indexed_scale_shift": Twin(
        make_case, _scale_shift_ours, _scale_shift_eager,
        {"grad_scale": ("grad_out", "x"), "grad_shift": ("grad_out",)},
        S.CHUNK_ROWS,
        ((0, 5, 3), (1, 1, 1), (1, 7, 4), (7, 33, 3), (130, 5, 9),
         (S.CHUNK_ROWS * 2 + 1, 17, 4)),
        ((1, 3, 2), (S.CHUNK_ROWS * 3 + 5, 11, 5)), "int32", ("normal", "bits")),
}


def _shape_id(s) -> str:
    return "x".join(map(str, s))


def test_table_holds_registered_ops():
    assert set(TWINS) <= set(ops.OPS), sorted(set(TWINS) - set(ops.OPS))


EAGER_CASES = [pytest.param(op, dtype, ix, shape, kind,
                            id=f"{op}-{dtype}-{ix}-{_shape_id(shape)}-{kind}")
               for op, t in TWINS.items() for dtype in DTYPES for ix in INDEX_DTYPES
               for shape in t.shapes for kind in t.kinds]


@pytest.mark.parametrize(("op", "dtype", "index_dtype", "shape", "kind"), EAGER_CASES)
def test_forward_and_input_grad_bitwise_equal_to_eager(op, dtype, index_dtype, shape, kind,
                                                       fresh_seed):
    twin = TWINS[op]
    x = twin.make(*shape, dtype, index_dtype, fresh_seed, specials=True, kind=kind)
    ours, eager = twin.ours(x), twin.eager(x)
    # eager's own CPU NaN encoding depends on the element's position; NaN places must match
    for name in ("out", "input_grad"):
        assert_bitwise(ours[name], eager[name], f"{op} {name}", nan_payload_ok=True)


def terms(twin: Twin, x: dict, exact: bool) -> dict:
    """Each parameter gradient's per-row terms: float32 products rounded once (numpy), or
    float64 products of the exact float32 values (``exact``)."""
    out = {}
    with np.errstate(all="ignore"):
        out.update(_terms(twin, x, exact))
    return out


def _terms(twin: Twin, x: dict, exact: bool):
    for name, factors in twin.sums.items():
        if exact:
            yield name, torch.stack([x[f].double() for f in factors]).prod(0)
        else:
            arrays = [x[f].float().numpy() for f in factors]  # exact for every storage dtype
            yield name, np.multiply(*arrays) if len(arrays) == 2 else arrays[0]


def oracle_sums(terms: dict, idx: torch.Tensor, g: int, chunk_rows: int,
                dtype: torch.dtype) -> dict:
    """SUMMATION_ORDER with numpy float32 ufuncs: each parameter gradient's per-row terms
    (separately rounded products, computed before) added per chunk, then over chunks."""
    idx_np = idx.long().numpy()
    out = {}
    with np.errstate(all="ignore"):
        for name, term in terms.items():
            total = np.zeros((g, term.shape[1]), dtype=np.float32)
            for start in range(0, term.shape[0], chunk_rows):
                acc = np.zeros_like(total)
                for i in range(start, min(start + chunk_rows, term.shape[0])):
                    acc[idx_np[i]] = np.add(acc[idx_np[i]], term[i])
                total = np.add(total, acc)
            out[name] = torch.from_numpy(total).to(dtype)  # float32 -> storage: nearest even
    return out


ORDER_CASES = [pytest.param(op, dtype, shape, specials,
                            id=f"{op}-{dtype}-{_shape_id(shape)}-{specials}")
               for op, t in TWINS.items() for dtype in DTYPES for shape in t.order_shapes
               for specials in (False, True)]


@pytest.mark.parametrize(("op", "dtype", "shape", "specials"), ORDER_CASES)
def test_param_grads_follow_documented_order(op, dtype, shape, specials, fresh_seed):
    twin = TWINS[op]
    x = twin.make(*shape, dtype, twin.order_index, fresh_seed, specials=specials)
    ours = twin.ours(x)
    expected = oracle_sums(terms(twin, x, exact=False), x["index"], shape[2], twin.chunk_rows,
                           TORCH_DTYPES[dtype])
    assert expected
    again = twin.ours(x)
    for name, want in expected.items():
        assert_bitwise(ours[name], want, f"{op} {name} vs numpy oracle", nan_payload_ok=True)
        assert_bitwise(again[name], ours[name], f"{op} {name} repeat")


@pytest.mark.parametrize("op", TWINS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_param_grads_within_one_storage_ulp_of_fp64(op, dtype, fresh_seed):
    """float32 sums have ~16 bits to spare over bf16/fp16 storage at this N, so the one final
    rounding dominates. (float32 storage has no such headroom: not claimed.)"""
    twin = TWINS[op]
    x = twin.make(2000, 64, 3, dtype, "int64", fresh_seed, specials=False)
    ours = twin.ours(x)
    eps = torch.finfo(TORCH_DTYPES[dtype]).eps
    for name, exact in terms(twin, x, exact=True).items():
        ref = torch.zeros(3, 64, dtype=torch.float64).index_add_(0, x["index"], exact)
        bound = eps * 2.0 ** np.floor(np.log2(float(ref.abs().max())))
        assert float((ours[name].double() - ref).abs().max()) <= bound, f"{op} {name}"


@pytest.mark.parametrize("op", TWINS)
def test_empty_batch_gives_empty_out_and_zero_param_grads(op):
    twin = TWINS[op]
    x = twin.make(0, 6, 3, "bfloat16", "int64", 1, specials=False)
    ours = twin.ours(x)
    assert ours["out"].shape == (0, 6) and ours["input_grad"].shape == (0, 6)
    params = [k for k in ours if k not in ("out", "input_grad")]
    assert params
    for name in params:
        assert_bitwise(ours[name], torch.zeros(3, 6, dtype=torch.bfloat16), f"{op} {name}")


def _fp32_gate_residual():
    """g*y = 1 + 2**-11 + 2**-24 rounds (tie to even) to 1 + 2**-11; r cancels it: two
    roundings give 0, one FMA would give 2**-24. The CPU path must give eager's 0."""
    g = torch.full((1, 4), 1 + 2**-12, dtype=torch.float32)
    y = torch.full((3, 4), 1 + 2**-12, dtype=torch.float32)
    r = torch.full((3, 4), -(1 + 2**-11), dtype=torch.float32)
    idx = torch.zeros(3, dtype=torch.int64)
    eager_out = r + g.index_select(0, idx) * y
    assert torch.all(eager_out == 0)
    assert_bitwise(gate_residual_cpu(r, g, y, idx), eager_out, "fp32 out")
    grad_y, _ = gate_residual_backward_cpu(-r, g, y, idx)
    assert_bitwise(grad_y, -r * g.index_select(0, idx), "fp32 grad_y")


def _fp32_scale_shift():
    """x*t = 1 + 2**-11 + 2**-24 rounds (tie to even) to 1 + 2**-11, which the shift cancels:
    0 with eager's two roundings, 2**-24 with an FMA."""
    x = torch.full((3, 4), 1 + 2**-12)
    scale = torch.full((1, 4), 2**-12)
    shift = torch.full((1, 4), -(1 + 2**-11))
    idx = torch.zeros(3, dtype=torch.int64)
    expected = x * (1 + scale.index_select(0, idx)) + shift.index_select(0, idx)
    assert torch.all(expected == 0)
    assert_bitwise(indexed_scale_shift_cpu(x, scale, shift, idx), expected, "fp32 out")


@pytest.mark.parametrize("op", TWINS)
def test_fp32_forward_is_not_contracted(op):
    assert (1 + 2**-12) ** 2 - (1 + 2**-11) == 2**-24  # exact in float64: what an FMA returns
    {"gate_residual": _fp32_gate_residual, "indexed_scale_shift": _fp32_scale_shift}[op]()


# ------------------------------------------------------------ indexed_scale_shift only


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_scale_shift_eager_rounds_each_op_once_in_float32(dtype, fresh_seed):
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


def test_scale_shift_specials_are_planted_and_reach_the_output(fresh_seed):
    """The special-values inputs do exercise NaN, infinities, signed zeros and t = 0."""
    x = make_case(300, 33, 4, "bfloat16", "int64", fresh_seed, specials=True)
    ours = _scale_shift_ours(x)
    out, grad_x = ours["out"], ours["input_grad"]
    assert torch.isnan(out).any() and torch.isinf(out).any() and (out.view(torch.int16) == 0).any()
    assert (grad_x.view(torch.int16) == -32768).any(), "no -0.0 in grad_x"
    assert (x["scale"] == -1).any() and (x["x"].abs() < torch.finfo(torch.bfloat16).tiny).any()


def test_scale_shift_fp32_grad_scale_sum_is_not_contracted():
    """Row 1's product (1 + 2**-12)**2 rounds to 1 + 2**-11, cancelling row 0's: grad_scale
    is 0 with a separate multiply and add, 2**-24 with an FMA."""
    go = torch.tensor([[1.0], [1 + 2**-12]])
    x = torch.tensor([[-(1 + 2**-11)], [1 + 2**-12]])
    _, grad_scale, grad_shift = indexed_scale_shift_backward_cpu(
        go, x, torch.zeros(1, 1), torch.zeros(2, dtype=torch.int64))
    assert grad_scale.item() == 0.0 and grad_shift.item() == 2 + 2**-12


def test_scale_shift_autograd_function_gives_the_functions_bits(fresh_seed):
    x = make_case(131, 9, 3, "bfloat16", "int64", fresh_seed)
    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = IndexedScaleShiftCPU.apply(xx, ss, hh, x["index"])
    out.backward(x["grad_out"])
    for got, (name, want) in zip((out.detach(), xx.grad, ss.grad, hh.grad),
                                 _scale_shift_ours(x).items(), strict=True):
        assert_bitwise(got, want, name)


def test_scale_shift_negative_zero_grad_out_sums_to_positive_zero():
    """A sum starts at +0.0, so -0.0 terms give +0.0, as eager's index_add_ into zeros."""
    x = {"x": torch.ones(3, 2, dtype=torch.float16), "scale": torch.zeros(2, 2).half(),
         "shift": torch.zeros(2, 2).half(), "index": torch.zeros(3, dtype=torch.int64),
         "grad_out": torch.full((3, 2), -0.0, dtype=torch.float16)}
    eager, ours = _scale_shift_eager(x), _scale_shift_ours(x)
    assert (ours["input_grad"].view(torch.int16) == -32768).all()  # -0.0 * 1 keeps its sign
    assert (eager["grad_shift"].view(torch.int16) == 0).all()
    assert (eager["grad_scale"].view(torch.int16) == 0).all()
    assert_bitwise(ours["grad_shift"], eager["grad_shift"], "grad_shift")
    assert_bitwise(ours["grad_scale"], eager["grad_scale"], "grad_scale")


def _bad_scale_shift_inputs():
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


def _bad_rms_norm_inputs():
    """(op, call on inputs(4, 8, bfloat16) of tests/test_rms_norm_kernels_cpu.py, text)."""
    R = rms_norm_cpu
    yield "rms_norm", lambda i: R.rms_norm_cpu(i["x"], i["weight"][:-1]), (
        "rms_norm: weight must be (D=8,)")
    yield "rms_norm", lambda i: R.rms_norm_cpu(i["x"].double(), i["weight"]), (
        "must be bfloat16, float16")
    yield "rms_norm", lambda i: R.rms_norm_cpu(i["x"], i["weight"].half()), (
        "weight is torch.float16")
    yield "add_rms_norm", lambda i: R.add_rms_norm_cpu(i["x"], i["residual"][1:], i["weight"]), (
        "residual must be (N, D)")
    yield "rms_norm_scale_shift", lambda i: R.rms_norm_scale_shift_cpu(
        i["x"], i["weight"], i["scale"], i["shift"][:, :2], i["index"]), (
        "shift must be (G=3, D=8)")
    yield "rms_norm_scale_shift", lambda i: R.rms_norm_scale_shift_cpu(
        i["x"], i["weight"], i["scale"], i["shift"], i["index"] + 3), "outside [0, G=3)"
    yield "rms_norm_scale_shift", lambda i: R.rms_norm_scale_shift_cpu(
        i["x"], i["weight"], i["scale"], i["shift"], i["index"].float()), (
        "index must be int64 or int32")


BAD_INPUTS = [
    *(pytest.param("indexed_scale_shift", lambda i, a=args: indexed_scale_shift_cpu(**a),
                   rf"^indexed_scale_shift: {message}", id=f"indexed_scale_shift-{message[:30]}")
      for message, args in _bad_scale_shift_inputs()),
    *(pytest.param(op, call, re.escape(text), id=f"{op}-{text[:30]}")
      for op, call, text in _bad_rms_norm_inputs()),
]


@pytest.mark.parametrize(("op", "call", "pattern"), BAD_INPUTS)
def test_bad_input_is_one_line_op_input_error(op, call, pattern):
    """A twin's bad input is one OpInputError (a ValueError) of one line naming the op."""
    from test_rms_norm_kernels_cpu import inputs as rms_inputs

    assert op in ops.OPS
    with pytest.raises(OpInputError, match=pattern) as info:
        call(rms_inputs(4, 8, torch.bfloat16, 0))
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


def test_scale_shift_bad_backward_input_names_the_backward():
    z = torch.zeros
    with pytest.raises(OpInputError, match=r"^indexed_scale_shift backward: grad_out must be "
                                           r"\(N, D\) = \(4, 8\) like x, got \(5, 8\)$"):
        indexed_scale_shift_backward_cpu(z(5, 8), z(4, 8), z(3, 8), torch.zeros(4).long())
    with pytest.raises(OpInputError, match=r"^indexed_scale_shift backward: grad_out is "):
        indexed_scale_shift_backward_cpu(z(4, 8).half(), z(4, 8), z(3, 8), torch.zeros(4).long())


def test_scale_shift_non_contiguous_and_negated_inputs_give_eager_bits(fresh_seed):
    """A transposed x and a lazily negated scale (what autograd can hand over) are read as
    their values, not their storage."""
    x = make_case(40, 24, 3, "float16", "int64", fresh_seed)
    xt = x["x"].t().contiguous().t()
    neg = torch._neg_view(x["scale"])
    out = indexed_scale_shift_cpu(xt, neg, x["shift"], x["index"])
    want = xt * (1 + neg.index_select(0, x["index"])) + x["shift"].index_select(0, x["index"])
    assert not xt.is_contiguous() and neg.is_neg()
    assert_bitwise(out, want, "out", nan_payload_ok=True)
