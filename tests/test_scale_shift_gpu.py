"""indexed_scale_shift's numba.cuda kernels on a real GPU against eager CUDA PyTorch (H200).

Bitwise equality here is strict, NaN encodings included: the kernels and eager use the same
GPU arithmetic (``add.rn.f32``/``mul.rn.f32``, canonical NaN) and storage conversions. Skipped
where torch sees no CUDA device (tests/conftest.py), like tests/test_kernels_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise
from scale_shift_cases import eager, make_case

from gate_residual_matrix.kernels.errors import OpInputError

pytestmark = pytest.mark.gpu

# N = 0 and 1, odd D, D = 5376 (H3's hidden size), N > 65535 (grid.y strided rows)
SHAPES = [(0, 5, 3), (1, 1, 1), (7, 33, 3), (300, 129, 9), (300, 128, 9), (1025, 5376, 9),
          (70001, 8, 3)]


def on_gpu(x):
    return {k: v.cuda() for k, v in x.items()}


def ours(x):
    from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift

    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = indexed_scale_shift(xx, ss, hh, x["index"])
    out.backward(x["grad_out"])
    return out.detach(), xx.grad, ss.grad, hh.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["normal", "bits"])
def test_forward_and_grad_x_bitwise_equal_to_eager(dtype, index_dtype, shape, kind,
                                                   fresh_seed):
    x = on_gpu(make_case(*shape, dtype, index_dtype, fresh_seed, specials=True, kind=kind))
    out_e, grad_x_e, _, _ = eager(x)
    out, grad_x, _, _ = ours(x)
    assert_bitwise(out, out_e, "out")
    assert_bitwise(grad_x, grad_x_e, "grad_x")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7, 2), (4097, 5376, 9), (300, 64, 200)],
                         ids=lambda s: "x".join(map(str, s)))  # 2G = 400: global accumulators
def test_param_grads_repeatable_and_equal_to_cpu_twin(dtype, shape, fresh_seed):
    from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
        indexed_scale_shift_backward_cpu,
    )

    x = make_case(*shape, dtype, "int64", fresh_seed, specials=True)
    g = on_gpu(x)
    runs = [ours(g)[1:] for _ in range(3)]
    cpu = indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], x["index"])
    for name, i in (("grad_x", 0), ("grad_scale", 1), ("grad_shift", 2)):
        for again in runs[1:]:
            assert_bitwise(again[i], runs[0][i], f"{name} repeat")
        assert_bitwise(runs[0][i].cpu(), cpu[i], f"{name} GPU vs CPU twin")


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_equals_cpu_twin(dtype, fresh_seed):
    """The GPU forward and the CPU twin agree bit for bit, NaN encodings included."""
    from gate_residual_matrix.kernels.indexed_scale_shift import indexed_scale_shift_forward
    from gate_residual_matrix.kernels.indexed_scale_shift_cpu import indexed_scale_shift_cpu

    x = make_case(513, 77, 5, dtype, "int32", fresh_seed, specials=True, kind="bits")
    g = on_gpu(x)
    gpu = indexed_scale_shift_forward(g["x"], g["scale"], g["shift"], g["index"])
    cpu = indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], x["index"])
    assert_bitwise(gpu.cpu(), cpu, "out GPU vs CPU twin")


def test_fp32_forward_and_sum_are_not_contracted_on_the_gpu():
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


def test_non_contiguous_inputs_give_eager_bits(fresh_seed):
    x = on_gpu(make_case(300, 64, 5, "bfloat16", "int64", fresh_seed))
    x["x"] = x["x"].t().contiguous().t()
    x["scale"] = torch._neg_view(x["scale"])
    out_e, grad_x_e, _, _ = eager(x)
    out, grad_x, _, _ = ours(x)
    assert_bitwise(out, out_e, "out")
    assert_bitwise(grad_x, grad_x_e, "grad_x")


def test_bad_input_rejected_on_gpu():
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


@pytest.mark.parametrize("dtype", DTYPES)
def test_unchecked_out_of_range_index_gives_nan_rows(dtype, fresh_seed):
    from gate_residual_matrix.kernels.indexed_scale_shift import IndexedScaleShift

    x = on_gpu(make_case(300, 65, 5, dtype, "int64", fresh_seed, specials=False))
    bad = x["index"].clone()
    bad[7], bad[100] = 5, -1
    xx, ss, hh = (x[k].clone().requires_grad_() for k in ("x", "scale", "shift"))
    out = IndexedScaleShift.apply(xx, ss, hh, bad, False)
    out.backward(x["grad_out"])
    assert torch.isnan(out[[7, 100]]).all() and torch.isnan(xx.grad[[7, 100]]).all()
    keep = torch.ones(300, dtype=torch.bool, device="cuda")
    keep[[7, 100]] = False
    out_e, grad_x_e, _, _ = eager(x)
    assert_bitwise(out[keep], out_e[keep], "rows with valid indices")
    assert_bitwise(xx.grad[keep], grad_x_e[keep], "grad_x rows with valid indices")


DEVICE_CHECK = """
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


def test_default_index_check_fails_on_the_device_like_eager():
    root = Path(__file__).resolve().parent.parent

    def run(bad):
        return subprocess.run([sys.executable, "-c", DEVICE_CHECK, str(bad)], cwd=root,
                              capture_output=True, text=True, timeout=300)

    good = run(2)
    assert good.returncode == 0 and "finished 0.0" in good.stdout, good.stderr[-2000:]
    for bad in (3, -1):
        failed = run(bad)
        assert failed.returncode != 0 and "finished" not in failed.stdout
        assert "assert" in failed.stderr.lower(), failed.stderr[-2000:]
