"""Bad and awkward input at the op's entry points, on the CPU path and (marked gpu) on CUDA.

kernels/checks.py is shared by both paths. What eager rejects is rejected, with a one-line
OpInputError; what eager accepts in a layout of its own (non-contiguous views, offsets,
expanded gates, N = 0, D = 0) gives eager's bits; NaN and +-Inf propagate as in eager. On
the CPU eager's own NaN encoding depends on the element's position (kernels/
gate_residual_cpu.py), so NaN there must match in place, not in payload; on CUDA all bits.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise, inputs

from gate_residual_matrix.contract.inputs import TORCH_DTYPES, special_values
from gate_residual_matrix.runner.errors import OpInputError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def entry_points(device):
    """(forward, differentiable op, backward or None) of our op on ``device``."""
    if device == "cpu":
        from gate_residual_matrix.kernels.gate_residual_cpu import (
            GateResidualCPU,
            gate_residual_backward_cpu,
            gate_residual_cpu,
        )

        return gate_residual_cpu, GateResidualCPU.apply, gate_residual_backward_cpu
    from gate_residual_matrix.kernels.gate_residual import (
        gate_residual,
        gate_residual_backward,
        gate_residual_forward,
    )

    # check_index="sync": an index outside [0, G) raises OpInputError at once, as on the CPU
    # (the default checks on the device: tests/test_kernels_gpu.py, in a subprocess)
    return (lambda *a: gate_residual_forward(*a, check_index="sync"),
            lambda *a: gate_residual(*a, check_index="sync"),
            lambda *a: gate_residual_backward(*a, check_index="sync"))


def eager(r, g, y, idx, go):
    """Eager forward and the three gradients, from fresh leaves."""
    rr, gg, yy = (t.detach().requires_grad_() for t in (r, g, y))  # layouts kept
    out = rr + gg.index_select(0, idx) * yy
    out.backward(go)
    return {"out": out.detach(), "res": rr.grad, "y": yy.grad, "gate": gg.grad}


def ours(device, r, g, y, idx, go):
    """Our forward (the plain entry point) and our three gradients (the autograd Function)."""
    forward, op, _ = entry_points(device)
    plain = forward(r, g, y, idx)
    rr, gg, yy = (t.detach().requires_grad_() for t in (r, g, y))  # layouts kept
    out = op(rr, gg, yy, idx)
    out.backward(go)
    assert_bitwise(plain, out.detach(), "plain entry point vs autograd Function")
    return {"out": out.detach(), "res": rr.grad, "y": yy.grad, "gate": gg.grad}


def assert_like_eager(device, got, want):
    """out, grad_residual and grad_y: eager's bits (the op's bitwise claims). grad_gate sums
    in SUMMATION_ORDER with one final rounding, so only its NaN, infinities and values (not
    the sign of a zero from an underflowed product) are eager's when each sum has one term."""
    for name in ("out", "res", "y"):
        assert_bitwise(got[name].contiguous(), want[name].contiguous(), name,
                       nan_payload_ok=device == "cpu")


def assert_same_values(got, want, what):
    """Same NaN places, same values elsewhere (+0.0 == -0.0), infinities included."""
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaN places differ"
    assert torch.equal(got[~nan], want[~nan]), f"{what}: values differ"


# ------------------------------------------------------------------ rejected, with eager


def _t(shape, dtype=torch.bfloat16, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def good(device):
    return {"residual": _t((4, 8), device=device), "gate": _t((3, 8), device=device),
            "y": _t((4, 8), device=device),
            "index": torch.tensor([0, 1, 2, 0], device=device)}


# (test id, change to the good inputs, eager rejects it too, fragment of our message)
BAD = [
    ("float index", lambda x: x.update(index=x["index"].float()), True,
     "index must be int64 or int32, got torch.float32"),
    ("bool index", lambda x: x.update(index=x["index"].bool()), True, "got torch.bool"),
    ("uint8 index", lambda x: x.update(index=x["index"].to(torch.uint8)), True,
     "got torch.uint8"),
    ("index = G", lambda x: x["index"].__setitem__(2, 3), True, "index holds 3, outside [0, G=3)"),
    ("negative index", lambda x: x["index"].__setitem__(1, -1), True,
     "index holds -1, outside [0, G=3)"),
    ("huge index", lambda x: x["index"].__setitem__(0, 2**40), True, "index holds 1099511627776"),
    ("index too short", lambda x: x.update(index=x["index"][:3]), True,
     "index must be (N=4,), got (3,)"),
    ("sparse y", lambda x: x.update(y=x["y"].to_sparse()), False,
     "y must be a dense tensor, got torch.sparse_coo"),
    ("sparse index", lambda x: x.update(index=x["index"].to_sparse()), False,
     "index must be a dense tensor, got torch.sparse_coo"),
    ("index 2-D", lambda x: x.update(index=x["index"][None]), True,
     "index must be (N=4,), got (1, 4)"),
    ("y fewer rows", lambda x: x.update(y=x["y"][:3]), True,
     "residual and y must both be (N, D), got (4, 8) and (3, 8)"),
    ("gate other D", lambda x: x.update(gate=_t((3, 7), device=x["gate"].device)), True,
     "gate must be (G, D=8), got (3, 7)"),
    ("residual 3-D", lambda x: x.update(residual=x["residual"][None], y=x["y"][None]), False,
     "residual and y must both be (N, D), got (1, 4, 8)"),
    ("residual 0-D", lambda x: x.update(residual=x["residual"][0, 0]), False,
     "residual and y must both be (N, D), got ()"),
    ("gate float16, residual bfloat16", lambda x: x.update(gate=x["gate"].half()), False,
     "gate is torch.float16 but residual is torch.bfloat16"),
    ("float64", lambda x: x.update(**{k: x[k].double() for k in ("residual", "gate", "y")}),
     False, "residual must be bfloat16, float16 or float32, got torch.float64"),
    ("integer residual", lambda x: x.update(**{k: x[k].int() for k in ("residual", "gate", "y")}),
     False, "got torch.int32"),
    ("a numpy array", lambda x: x.update(y=x["y"].float().cpu().numpy()), True,
     "y must be a torch.Tensor, got ndarray"),
    ("meta tensors", lambda x: x.update(**{k: v.to("meta") for k, v in x.items()}), False,
     "tensors, got meta"),
    ("index on the meta device", lambda x: x.update(index=x["index"].to("meta")), False,
     "tensors are on different devices"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("change", "eager_rejects", "fragment"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_op_input_error(device, change, eager_rejects, fragment):
    x = good(device)
    change(x)
    forward, op, _ = entry_points(device)
    for entry in (forward, op):
        with pytest.raises(OpInputError) as info:
            entry(x["residual"], x["gate"], x["y"], x["index"])
        message = str(info.value)
        assert fragment in message and message.startswith("gate_residual: "), message
        assert "\n" not in message and isinstance(info.value, ValueError)
    if eager_rejects and device == "cpu":  # eager fails too (on CUDA a bad index would trip
        # a device-side assert and poison the context for later tests: checked on the CPU)
        with pytest.raises((RuntimeError, IndexError, TypeError, ValueError)):
            r, g, y, i = (x[k] for k in ("residual", "gate", "y", "index"))
            r + g.index_select(0, i) * y


def test_cuda_tensors_on_the_cpu_path_are_rejected():
    from gate_residual_matrix.kernels.gate_residual_cpu import gate_residual_cpu

    x = {k: v.to("meta") for k, v in good("cpu").items()}
    with pytest.raises(OpInputError, match=r"^gate_residual: expected cpu tensors, got meta$"):
        gate_residual_cpu(x["residual"], x["gate"], x["y"], x["index"])


BAD_BACKWARD = [
    ("grad_out fewer rows", lambda x: x.update(grad_out=x["grad_out"][:3]),
     "grad_out must be (N, D) = (4, 8) like y, got (3, 8)"),
    ("grad_out float32", lambda x: x.update(grad_out=x["grad_out"].float()),
     "grad_out is torch.float32 but y is torch.bfloat16"),
    ("grad_out on meta", lambda x: x.update(grad_out=x["grad_out"].to("meta")),
     "grad_out is on meta but y is on {device}"),
    ("grad_out sparse", lambda x: x.update(grad_out=x["grad_out"].to_sparse()),
     "grad_out must be a dense tensor, got torch.sparse_coo"),
    ("grad_out a list", lambda x: x.update(grad_out=[[1.0] * 8] * 4),
     "grad_out must be a torch.Tensor, got list"),
    ("y 1-D", lambda x: x.update(y=x["y"][0]), "y must be (N, D), got (8,)"),
    ("y float64", lambda x: x.update(y=x["y"].double()), "y must be bfloat16, float16 or float32"),
    ("index out of range", lambda x: x["index"].__setitem__(0, 7), "index holds 7, outside"),
    ("gate other dtype", lambda x: x.update(gate=x["gate"].half()),
     "backward: gate is torch.float16 but y is torch.bfloat16"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("change", "fragment"), [b[1:] for b in BAD_BACKWARD],
                         ids=[b[0] for b in BAD_BACKWARD])
def test_bad_backward_input_is_rejected_before_the_loops(device, change, fragment):
    """The loops index without bounds checks: unchecked, these used to crash the process
    (the CPU loops) or launch with the wrong sizes (the public CUDA backward)."""
    x = good(device)
    x["grad_out"] = _t((4, 8)).to(device)
    change(x)
    with pytest.raises(OpInputError) as info:
        entry_points(device)[2](x["grad_out"], x["gate"], x["y"], x["index"])
    expected = fragment.format(device=x["y"].device)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("value", ["Sync", "yes", 1, 0, None, "True"])
def test_check_index_takes_only_true_false_or_sync(value):
    """A typo must not turn the index check off: refused before anything else is looked at
    (so on this CPU machine too, with the CUDA entry points)."""
    from gate_residual_matrix.kernels.gate_residual import (
        GateResidual,
        gate_residual,
        gate_residual_backward,
        gate_residual_forward,
    )

    x = good("cpu")
    for entry in (gate_residual_forward, gate_residual, gate_residual_backward):
        with pytest.raises(OpInputError, match=r'^gate_residual: check_index must be True, '
                                               r'False or "sync", got '):
            entry(x["residual"], x["gate"], x["y"], x["index"], check_index=value)
    with pytest.raises(OpInputError, match="check_index must be"):
        GateResidual.apply(x["residual"], x["gate"], x["y"], x["index"], value)


def test_public_cuda_backward_checks_its_inputs():
    """The public CUDA backward refuses CPU tensors with the one-line error the forward gives
    (it used to launch unchecked; torch then failed with an assertion about CUDA)."""
    from gate_residual_matrix.kernels.gate_residual import gate_residual_backward

    x = good("cpu")
    with pytest.raises(OpInputError, match=r"^gate_residual: expected cuda tensors, got cpu$"):
        gate_residual_backward(_t((4, 8)), x["gate"], x["y"], x["index"])


# ------------------------------------------------------------------ accepted, like eager


def _views(x, how):
    """The same values as ``x`` in another memory layout (``how``), as eager accepts them."""
    r, g, y, idx, go = (x[k] for k in ("residual", "gate", "y", "index", "grad_out"))
    n, d = r.shape
    if how == "transposed":
        return {**x, "residual": r.T.contiguous().T, "y": y.T.contiguous().T,
                "gate": g.T.contiguous().T, "grad_out": go.T.contiguous().T}
    if how == "column slices":  # every other column of a wider tensor
        def wide(t):
            w = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=t.device)
            w[:, ::2] = t
            return w[:, ::2]
        return {**x, "residual": wide(r), "y": wide(y), "gate": wide(g), "grad_out": wide(go)}
    if how == "storage offset":  # contiguous, but starting one element into the storage
        def shifted(t):
            flat = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
            flat[1:] = t.reshape(-1)
            return flat[1:].view(t.shape)
        return {**x, "residual": shifted(r), "y": shifted(y), "gate": shifted(g),
                "index": shifted(idx)}
    if how == "strided index":
        both = torch.stack([idx, torch.zeros_like(idx)], dim=1)
        return {**x, "index": both[:, 0]}
    if how == "expanded":  # one gate row broadcast (stride 0), one upstream gradient row
        return {**x, "gate": g[:1].expand(g.shape[0], d), "grad_out": go[:1].expand(n, d)}
    if how == "negated view":  # a lazy negation (as autograd makes): the storage holds -t
        def lazy(t):
            return torch._neg_view(-t)
        return {**x, "residual": lazy(r), "y": lazy(y), "gate": lazy(g), "grad_out": lazy(go)}
    raise AssertionError(how)


LAYOUTS = ["transposed", "column slices", "storage offset", "strided index", "expanded",
           "negated view"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", LAYOUTS)
def test_non_contiguous_inputs_give_eager_bits(device, dtype, how, fresh_seed):
    x = {k: v.to(device) for k, v in inputs(37, 24, 3, dtype, "int64", fresh_seed).items()}
    v = _views(x, how)
    assert any(not t.is_contiguous() or t.storage_offset() or t.is_neg()
               for t in v.values()), how
    want = eager(*(v[k] for k in ("residual", "gate", "y", "index", "grad_out")))
    got = ours(device, *(v[k] for k in ("residual", "gate", "y", "index", "grad_out")))
    assert_like_eager(device, got, want)
    dense = ours(device, *(v[k].contiguous() for k in ("residual", "gate", "y", "index",
                                                        "grad_out")))
    assert_bitwise(got["gate"], dense["gate"], "grad_gate vs the contiguous inputs' grad_gate")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", [(0, 8, 3), (0, 8, 0), (5, 0, 2), (0, 0, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_empty_inputs_give_empty_results_like_eager(device, index_dtype, shape):
    n, d, g = shape
    dt, it = torch.bfloat16, getattr(torch, index_dtype)
    r, y, go = (torch.ones(n, d, dtype=dt, device=device) for _ in range(3))
    gate = torch.ones(g, d, dtype=dt, device=device)
    idx = torch.zeros(n, dtype=it, device=device) if g else torch.empty(0, dtype=it,
                                                                        device=device)
    want = eager(r, gate, y, idx, go)
    got = ours(device, r, gate, y, idx, go)
    for name in ("out", "res", "y", "gate"):
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
    assert_like_eager(device, got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_propagate_as_in_eager(device, dtype):
    """Every (residual, gate, y) triple of special values, one per row; one row per gate row
    so grad_gate is a single product and comparable bit for bit with eager's index_add."""
    values = [float(v) for v in special_values(dtype)] + [1.0, -1.5]
    triples = list(itertools.product(values, repeat=3))
    n, dt = len(triples), TORCH_DTYPES[dtype]
    cols = torch.tensor(triples, dtype=torch.float64).to(dt)  # exact: values are in dtype
    r = cols[:, 0:1].expand(n, 4).contiguous().to(device)
    g = cols[:, 1:2].expand(n, 4).contiguous().to(device)
    y = cols[:, 2:3].expand(n, 4).contiguous().to(device)
    go = torch.flip(cols, dims=[0])[:, [0, 1, 2, 0]].contiguous().to(device)  # specials too
    idx = torch.arange(n, device=device)
    want = eager(r, g, y, idx, go)
    assert torch.isnan(want["out"]).any() and torch.isinf(want["out"]).any()
    assert torch.isnan(want["gate"]).any() and torch.isinf(want["y"]).any()
    got = ours(device, r, g, y, idx, go)
    assert_like_eager(device, got, want)
    if device == "cuda" and dtype == "float32":
        # eager's CUDA index_add sums float32 with atomicAdd, which flushes subnormal
        # results to zero (PTX ISA: atom/red .add.f32 "flushes subnormal inputs and results
        # to sign-preserving zero"; measured on the H200: go=1.0, y=2**-149 gives eager 0.0,
        # ours 2**-149). Ours keeps IEEE subnormals: they differ there and only there.
        tiny = torch.finfo(torch.float32).tiny
        flushed = (want["gate"] == 0) & (got["gate"] != 0) & (got["gate"].abs() < tiny)
        assert flushed.any(), "eager no longer flushes subnormal grad_gate sums: update"
        want = {**want, "gate": torch.where(flushed, got["gate"], want["gate"])}
    assert_same_values(got["gate"], want["gate"], "grad_gate")
    for name in ("out", "y", "gate"):  # NaN where eager has NaN, infinities with their sign
        assert torch.equal(torch.isnan(got[name]), torch.isnan(want[name])), name
        assert torch.equal(torch.isposinf(got[name]), torch.isposinf(want[name])), name
        assert torch.equal(torch.isneginf(got[name]), torch.isneginf(want[name])), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_that_require_grad_work_outside_autograd(dtype):
    """The plain CPU entry points take leaves that require grad (numpy() would refuse them)."""
    from gate_residual_matrix.kernels.gate_residual_cpu import (
        gate_residual_backward_cpu,
        gate_residual_cpu,
    )

    x = inputs(9, 16, 2, dtype, "int64", 7)
    r, g, y = (x[k].clone().requires_grad_() for k in ("residual", "gate", "y"))
    out = gate_residual_cpu(r, g, y, x["index"])
    grad_y, grad_gate = gate_residual_backward_cpu(x["grad_out"], g, y, x["index"])
    want = eager(r, g, y, x["index"], x["grad_out"])
    assert_bitwise(out, want["out"], "out", nan_payload_ok=True)
    assert_bitwise(grad_y, want["y"], "grad_y", nan_payload_ok=True)
    assert grad_gate.shape == g.shape and not out.requires_grad
