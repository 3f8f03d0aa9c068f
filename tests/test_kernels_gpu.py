"""The indexed ops' numba.cuda kernels on a real GPU against eager CUDA PyTorch and their CPU
twins (run on the H200).

Bitwise equality here is strict, NaN encodings included: the kernels and eager use the same
GPU arithmetic (``add.rn.f32``/``mul.rn.f32``, canonical NaN) and conversions. Each shared
check runs for every op of :data:`KERNELS`, a table keyed by the registered op's name with
what differs: inputs, entry points, eager, the outputs that must equal eager's, the shapes.
Launch machinery: tests/test_kernels_gpu_launch.py; the RMSNorm kernels:
tests/test_rms_norm_kernels_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise, inputs
from scale_shift_cases import eager as scale_shift_eager
from scale_shift_cases import make_case

from gate_residual_matrix import ops
from gate_residual_matrix.kernels.errors import OpInputError

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent


def on_gpu(x):
    return {k: v.cuda() for k, v in x.items()}


# ------------------------------------------------------------------ per op: what differs


def _gate_residual_inputs(n, d, g, dtype, index_dtype, seed, specials=True, kind="normal"):
    assert kind == "normal", kind
    return inputs(n, d, g, dtype, index_dtype, seed, specials=specials)


def _gate_residual_run(x, fn):
    r, g, y = (x[k].clone().requires_grad_() for k in ("residual", "gate", "y"))
    out = fn(r, g, y)
    out.backward(x["grad_out"])
    return {"out": out.detach(), "grad_residual": r.grad, "input_grad": y.grad,
            "grad_gate": g.grad}


def _gate_residual_ours(x, index=None, check_index=True):
    """The public entry point; ``GateResidual.apply`` itself for another index or check."""
    from gate_residual_matrix.kernels.gate_residual import GateResidual, gate_residual

    if index is None and check_index is True:
        return _gate_residual_run(x, lambda r, g, y: gate_residual(r, g, y, x["index"]))
    return _gate_residual_run(x, lambda r, g, y: GateResidual.apply(r, g, y, index,
                                                                      check_index))


def _gate_residual_eager(x):
    return _gate_residual_run(x, lambda r, g, y: r + g.index_select(0, x["index"]) * y)


def _gate_residual_param_grads(x, cpu: bool) -> dict:
    if cpu:
        from gate_residual_matrix.kernels.gate_residual_cpu import gate_residual_backward_cpu

        return {"grad_gate": gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"],
                                                        x["index"])[1]}
    from gate_residual_matrix.kernels.gate_residual import gate_residual_backward

    return {"grad_gate": gate_residual_backward(x["grad_out"], x["gate"], x["y"],
                                                x["index"])[1]}


NAMES = ("out", "input_grad", "grad_scale", "grad_shift")


def _scale_shift_ours(x, index=None, check_index=True):
    from gate_residual_matrix.kernels.indexed_scale_shift import IndexedScaleShift

    index = x["index"] if index is None else index
    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = IndexedScaleShift.apply(xx, ss, hh, index, check_index)
    out.backward(x["grad_out"])
    return dict(zip(NAMES, (out.detach(), xx.grad, ss.grad, hh.grad), strict=True))


def _scale_shift_eager(x):
    return dict(zip(NAMES, scale_shift_eager(x), strict=True))


def _scale_shift_param_grads(x, cpu: bool) -> dict:
    if cpu:
        from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
            indexed_scale_shift_backward_cpu,
        )

        grads = indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], x["index"])
        return dict(zip(NAMES[1:], grads, strict=True))
    ours = _scale_shift_ours(x)
    return {k: ours[k] for k in NAMES[1:]}


@dataclass(frozen=True)
class Kernels:
    """What differs between the indexed ops for these checks. ``input_grad``: the row
    input's gradient (gate_residual's ``grad_y``, indexed_scale_shift's ``grad_x``)."""

    make: Callable  # (n, d, g, dtype, index_dtype, seed, specials=, kind=) -> CPU inputs
    ours: Callable  # (inputs, index=None, check_index=True) -> outputs through autograd
    eager: Callable  # inputs -> the same names
    vs_eager: tuple  # outputs bitwise equal to eager's
    param_grads: Callable  # (inputs, cpu) -> backward outputs compared with the CPU twin
    shapes: tuple  # (N, D, G) against eager
    param_shapes: tuple  # (N, D, G) of the parameter gradients; the last: global sums
    nan_row_d: tuple  # D of the unchecked bad-index check
    nan_row_same: tuple  # outputs whose valid rows must equal eager's there
    kinds: tuple = ("normal",)


KERNELS = {
    # element kernels where D * itemsize % 16 != 0 (D = 1, 33, 129, and 132 for bfloat16/
    # float16), 16-byte vector kernels otherwise (D = 128, 132 for float32, 5376)
    "gate_residual": Kernels(
        _gate_residual_inputs, _gate_residual_ours, _gate_residual_eager,
        ("out", "grad_residual", "input_grad"), _gate_residual_param_grads,
        ((0, 5, 3), (1, 1, 1), (7, 33, 3), (300, 129, 9), (300, 128, 9), (301, 132, 9),
         (1025, 5376, 9)),
        ((1, 7, 2), (4097, 5376, 9), (300, 64, 400)), (128, 129), ("out",)),
    # N = 0 and 1, odd D, D = 5376 (H3's hidden size), N > 65535 (grid.y strided rows)
    "indexed_scale_shift": Kernels(
        make_case, _scale_shift_ours, _scale_shift_eager, ("out", "input_grad"),
        _scale_shift_param_grads,
        ((0, 5, 3), (1, 1, 1), (7, 33, 3), (300, 129, 9), (300, 128, 9), (1025, 5376, 9),
         (70001, 8, 3)),
        ((1, 7, 2), (4097, 5376, 9), (300, 64, 200)), (65,), ("out", "input_grad"),
        ("normal", "bits")),
}


def _shape_id(s) -> str:
    return "x".join(map(str, s))


def test_table_holds_registered_ops():
    assert set(KERNELS) <= set(ops.OPS), sorted(set(KERNELS) - set(ops.OPS))


EAGER_CASES = [pytest.param(op, dtype, ix, shape, kind,
                            id=f"{op}-{dtype}-{ix}-{_shape_id(shape)}-{kind}")
               for op, k in KERNELS.items() for dtype in DTYPES for ix in INDEX_DTYPES
               for shape in k.shapes for kind in k.kinds]


@pytest.mark.parametrize(("op", "dtype", "index_dtype", "shape", "kind"), EAGER_CASES)
def test_forward_and_grads_bitwise_equal_to_eager(op, dtype, index_dtype, shape, kind,
                                                  fresh_seed):
    k = KERNELS[op]
    x = on_gpu(k.make(*shape, dtype, index_dtype, fresh_seed, specials=True, kind=kind))
    ours, eager = k.ours(x), k.eager(x)
    for name in k.vs_eager:
        assert_bitwise(ours[name], eager[name], f"{op} {name}")


PARAM_CASES = [pytest.param(op, dtype, shape, id=f"{op}-{dtype}-{_shape_id(shape)}")
               for op, k in KERNELS.items() for dtype in DTYPES for shape in k.param_shapes]


@pytest.mark.parametrize(("op", "dtype", "shape"), PARAM_CASES)
def test_param_grads_repeatable_and_equal_to_cpu_twin(op, dtype, shape, fresh_seed):
    k = KERNELS[op]
    x = k.make(*shape, dtype, "int64", fresh_seed, specials=True)
    g = on_gpu(x)
    runs = [k.param_grads(g, cpu=False) for _ in range(3)]
    cpu = k.param_grads(x, cpu=True)
    assert cpu.keys() == runs[0].keys()
    for name in cpu:
        for again in runs[1:]:
            assert_bitwise(again[name], runs[0][name], f"{op} {name} repeat")
        assert_bitwise(runs[0][name].cpu(), cpu[name], f"{op} {name} GPU vs CPU twin")


def _fp32_gate_residual():
    """g*y = 1 + 2**-11 + 2**-24 rounds to 1 + 2**-11, which r cancels: 0 with two
    roundings (eager), 2**-24 with an FMA (torch.addcmul, one rounding)."""
    from gate_residual_matrix.kernels.gate_residual import gate_residual_forward

    g = torch.full((1, 4096), 1 + 2**-12, device="cuda")
    y = torch.full((2048, 4096), 1 + 2**-12, device="cuda")
    r = torch.full((2048, 4096), -(1 + 2**-11), device="cuda")
    idx = torch.zeros(2048, dtype=torch.int64, device="cuda")
    fused = torch.addcmul(r, g.expand_as(y), y)
    assert torch.all(fused == 2**-24), "the detector needs a fused multiply-add to differ"
    eager_out = r + g.index_select(0, idx) * y
    out = gate_residual_forward(r, g, y, idx)
    assert_bitwise(out, eager_out, "fp32 forward")
    assert torch.all(out == 0)


def _fp32_scale_shift():
    """x*t = 1 + 2**-11 + 2**-24 rounds to 1 + 2**-11, which the shift cancels: 0 with two
    roundings, 2**-24 with an FMA. The same two products cancel in grad_scale's sum."""
    from gate_residual_matrix.kernels.indexed_scale_shift import (
        indexed_scale_shift_backward,
        indexed_scale_shift_forward,
    )

    x = torch.full((2048, 4096), 1 + 2**-12, device="cuda")
    scale = torch.full((1, 4096), 2**-12, device="cuda")
    shift = torch.full((1, 4096), -(1 + 2**-11), device="cuda")
    idx = torch.zeros(2048, dtype=torch.int64, device="cuda")
    fused = torch.addcmul(shift, x, 1 + scale)
    assert torch.all(fused == 2**-24), "the detector needs a fused multiply-add to differ"
    out = indexed_scale_shift_forward(x, scale, shift, idx)
    assert_bitwise(out, x * (1 + scale.index_select(0, idx)) + shift.index_select(0, idx), "out")
    assert torch.all(out == 0)
    go = torch.tensor([[1.0], [1 + 2**-12]], device="cuda")
    xs = torch.tensor([[-(1 + 2**-11)], [1 + 2**-12]], device="cuda")
    _, grad_scale, _ = indexed_scale_shift_backward(go, xs, torch.zeros(1, 1, device="cuda"),
                                                    torch.zeros(2, dtype=torch.int64,
                                                                device="cuda"))
    assert grad_scale.item() == 0.0


@pytest.mark.parametrize("op", KERNELS)
def test_fp32_is_not_contracted_on_the_gpu(op):
    {"gate_residual": _fp32_gate_residual, "indexed_scale_shift": _fp32_scale_shift}[op]()


def _bad_gate_residual():
    from gate_residual_matrix.kernels.gate_residual import gate_residual_forward

    r = torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16)
    g = torch.zeros(3, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(OpInputError, match="outside"):
        gate_residual_forward(r, g, r, torch.tensor([0, 1, 3, 0], device="cuda"),
                              check_index="sync")
    with pytest.raises(OpInputError, match="different devices"):
        gate_residual_forward(r, g.cpu(), r, torch.zeros(4, dtype=torch.int64, device="cuda"))


def _bad_scale_shift():
    from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift_forward

    x = torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16)
    p = torch.zeros(3, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(OpInputError, match=r"^indexed_scale_shift: index holds 3, outside"):
        indexed_scale_shift_forward(x, p, p, torch.tensor([0, 1, 3, 0], device="cuda"),
                                    check_index="sync")
    with pytest.raises(OpInputError, match="different devices"):
        indexed_scale_shift_forward(x, p.cpu(), p, torch.zeros(4, dtype=torch.int64,
                                                               device="cuda"))
    with pytest.raises(OpInputError, match="check_index must be"):
        indexed_scale_shift_forward(x, p, p, torch.zeros(4, dtype=torch.int64, device="cuda"),
                                    check_index="yes")


@pytest.mark.parametrize("op", KERNELS)
def test_bad_input_rejected_on_gpu(op):
    {"gate_residual": _bad_gate_residual, "indexed_scale_shift": _bad_scale_shift}[op]()


NAN_ROW_CASES = [pytest.param(op, dtype, d, id=f"{op}-{dtype}-{d}")
                 for op, k in KERNELS.items() for dtype in DTYPES for d in k.nan_row_d]


@pytest.mark.parametrize(("op", "dtype", "d"), NAN_ROW_CASES)
def test_unchecked_out_of_range_index_gives_nan_rows(op, dtype, d, fresh_seed):
    """``check_index=False``: a bad index's row is NaN in the output and the row input's
    gradient, and no other row moves (no stray read)."""
    k = KERNELS[op]
    x = on_gpu(k.make(300, d, 5, dtype, "int64", fresh_seed, specials=False))
    bad = x["index"].clone()
    bad[7], bad[100] = 5, -1
    ours, eager = k.ours(x, index=bad, check_index=False), k.eager(x)
    assert torch.isnan(ours["out"][[7, 100]]).all()
    assert torch.isnan(ours["input_grad"][[7, 100]]).all()
    keep = torch.ones(300, dtype=torch.bool, device="cuda")
    keep[[7, 100]] = False
    for name in k.nan_row_same:
        assert_bitwise(ours[name][keep], eager[name][keep], f"{op} {name}, valid rows")


GATE_RESIDUAL_CHECK = """
import sys, torch
from gate_residual_matrix.kernels.gate_residual import gate_residual_forward
n, d, bad = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
r = torch.zeros(n, d, device="cuda", dtype=torch.bfloat16)
g = torch.zeros(3, d, device="cuda", dtype=torch.bfloat16)
idx = torch.zeros(n, dtype=torch.int64, device="cuda")
gate_residual_forward(r, g, r, idx + 7, check_index=False)  # unchecked: must not count later
torch.cuda.synchronize()
idx[n // 2] = bad
out = gate_residual_forward(r, g, r, idx)
torch.cuda.synchronize()
print("finished", float(out.float().sum()))
"""

SCALE_SHIFT_CHECK = """
import sys, torch
from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift_forward
bad = int(sys.argv[1])
x = torch.zeros(64, 40, device="cuda", dtype=torch.float16)
p = torch.zeros(3, 40, device="cuda", dtype=torch.float16)
idx = torch.zeros(64, dtype=torch.int64, device="cuda")
indexed_scale_shift_forward(x, p, p, idx + 7, check_index=False)  # unchecked: never counts
torch.cuda.synchronize()
idx[33] = bad
out = indexed_scale_shift_forward(x, p, p, idx)
torch.cuda.synchronize()
print("finished", float(out.float().sum()))
"""

DEVICE_CHECKS = [pytest.param("gate_residual", GATE_RESIDUAL_CHECK, (5, 8),
                              id="gate_residual-5-8"),
                 pytest.param("gate_residual", GATE_RESIDUAL_CHECK, (4097, 5376),
                              id="gate_residual-4097-5376"),
                 pytest.param("indexed_scale_shift", SCALE_SHIFT_CHECK, (),
                              id="indexed_scale_shift-64-40")]


@pytest.mark.parametrize(("op", "script", "args"), DEVICE_CHECKS)
def test_default_index_check_fails_on_the_device_like_eager(op, script, args):
    """The default check does not synchronise; a bad index fails at the next synchronisation,
    and an unchecked call with bad indices before it does not count. A fresh process each."""
    assert op in KERNELS

    def run(bad):
        return subprocess.run([sys.executable, "-c", script, *map(str, args), str(bad)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    good = run(2)
    assert good.returncode == 0 and "finished 0.0" in good.stdout, good.stderr[-2000:]
    for bad in (3, -1):
        failed = run(bad)
        assert failed.returncode != 0 and "finished" not in failed.stdout
        assert "assert" in failed.stderr.lower(), failed.stderr[-2000:]


# ------------------------------------------------------------ indexed_scale_shift only


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_shift_forward_equals_cpu_twin(dtype, fresh_seed):
    """The GPU forward and the CPU twin agree bit for bit, NaN encodings included."""
    from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift_forward
    from gate_residual_matrix.kernels.indexed_scale_shift_cpu import indexed_scale_shift_cpu

    x = make_case(513, 77, 5, dtype, "int32", fresh_seed, specials=True, kind="bits")
    g = on_gpu(x)
    gpu = indexed_scale_shift_forward(g["x"], g["scale"], g["shift"], g["index"])
    cpu = indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], x["index"])
    assert_bitwise(gpu.cpu(), cpu, "out GPU vs CPU twin")


def test_scale_shift_non_contiguous_inputs_give_eager_bits(fresh_seed):
    x = on_gpu(make_case(300, 64, 5, "bfloat16", "int64", fresh_seed))
    x["x"] = x["x"].t().contiguous().t()
    x["scale"] = torch._neg_view(x["scale"])
    ours, eager = _scale_shift_ours(x), _scale_shift_eager(x)
    assert_bitwise(ours["out"], eager["out"], "out")
    assert_bitwise(ours["input_grad"], eager["input_grad"], "grad_x")
