"""The CPU path (kernels/gate_residual_cpu.py) against eager PyTorch and the documented order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DTYPES, INDEX_DTYPES, assert_bitwise, inputs

from gate_residual_matrix.contract.inputs import TORCH_DTYPES
from gate_residual_matrix.kernels.gate_residual import CHUNK_ROWS
from gate_residual_matrix.kernels.gate_residual_cpu import (
    BLOCK_ROWS,
    gate_residual_backward_cpu,
    gate_residual_cpu,
)

SHAPES = [(0, 5, 3), (1, 1, 1), (7, 33, 3), (130, 5, 9), (CHUNK_ROWS * 2 + 1, 17, 4),
          (BLOCK_ROWS * 2 + CHUNK_ROWS + 3, 7, 4)]  # three blocks of rows, the last short


def eager(r, g, y, idx, go):
    rr, gg, yy = (t.clone().requires_grad_() for t in (r, g, y))
    out = rr + gg.index_select(0, idx) * yy
    out.backward(go)
    return out.detach(), yy.grad, gg.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_grad_y_bitwise_equal_to_eager(dtype, index_dtype, shape, fresh_seed):
    n, d, g = shape
    x = inputs(n, d, g, dtype, index_dtype, fresh_seed, specials=True)
    out_e, grad_y_e, _ = eager(x["residual"], x["gate"], x["y"], x["index"], x["grad_out"])
    out = gate_residual_cpu(x["residual"], x["gate"], x["y"], x["index"])
    grad_y, _ = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    # eager's own CPU NaN encoding depends on the element's position; NaN-ness must match
    assert_bitwise(out, out_e, "out", nan_payload_ok=True)
    assert_bitwise(grad_y, grad_y_e, "grad_y", nan_payload_ok=True)


def test_fp32_forward_is_not_contracted():
    """g*y = 1 + 2**-11 + 2**-24 rounds (tie to even) to 1 + 2**-11; r cancels it: two
    roundings give 0, one FMA would give 2**-24. The CPU path must give eager's 0."""
    g = torch.full((1, 4), 1 + 2**-12, dtype=torch.float32)
    y = torch.full((3, 4), 1 + 2**-12, dtype=torch.float32)
    r = torch.full((3, 4), -(1 + 2**-11), dtype=torch.float32)
    idx = torch.zeros(3, dtype=torch.int64)
    fused = (1 + 2**-12) ** 2 - (1 + 2**-11)  # exact in float64: what an FMA returns
    assert fused == 2**-24
    eager_out = r + g.index_select(0, idx) * y
    assert torch.all(eager_out == 0)
    out = gate_residual_cpu(r, g, y, idx)
    assert_bitwise(out, eager_out, "fp32 out")
    grad_y, _ = gate_residual_backward_cpu(-r, g, y, idx)
    assert_bitwise(grad_y, -r * g.index_select(0, idx), "fp32 grad_y")


def oracle_grad_gate(go, y, idx, g):
    """SUMMATION_ORDER written with numpy float32 ufuncs (separately rounded mul and add)."""
    go32, y32 = go.float().numpy(), y.float().numpy()  # exact for every storage dtype
    idx_np = idx.long().numpy()
    total = np.zeros((g, go.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        for start in range(0, go.shape[0], CHUNK_ROWS):
            acc = np.zeros_like(total)
            for i in range(start, min(start + CHUNK_ROWS, go.shape[0])):
                acc[idx_np[i]] = np.add(acc[idx_np[i]], np.multiply(go32[i], y32[i]))
            total = np.add(total, acc)
    return torch.from_numpy(total).to(go.dtype)  # torch's float32 -> storage: round to nearest even


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3, 2), (CHUNK_ROWS * 3 + 5, 11, 5),
                                   (BLOCK_ROWS * 2 + CHUNK_ROWS + 3, 11, 5)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("specials", [False, True])
def test_grad_gate_follows_documented_order(dtype, shape, specials, fresh_seed):
    n, d, g = shape
    x = inputs(n, d, g, dtype, "int64", fresh_seed, specials=specials)
    _, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    expected = oracle_grad_gate(x["grad_out"], x["y"], x["index"], g)
    assert_bitwise(grad_gate, expected, "grad_gate vs numpy oracle", nan_payload_ok=True)
    _, again = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    assert_bitwise(grad_gate, again, "grad_gate repeat")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_grad_gate_within_one_storage_ulp_of_fp64(dtype, fresh_seed):
    """float32 accumulation has ~16 bits to spare over bf16/fp16 storage at this N, so the one
    final rounding dominates. (float32 storage has no such headroom: not claimed.)"""
    x = inputs(2000, 64, 3, dtype, "int64", fresh_seed, specials=False)
    _, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    ref = torch.zeros(3, 64, dtype=torch.float64).index_add_(
        0, x["index"], x["grad_out"].double() * x["y"].double())
    # fp32 accumulation rounded once: within one storage ULP of the largest |grad_gate|
    eps = torch.finfo(TORCH_DTYPES[dtype]).eps
    bound = eps * 2.0 ** np.floor(np.log2(float(ref.abs().max())))
    assert float((grad_gate.double() - ref).abs().max()) <= bound


def test_empty_batch_gives_empty_out_and_zero_grad_gate():
    x = inputs(0, 6, 3, "bfloat16", "int64", 1, specials=False)
    out = gate_residual_cpu(x["residual"], x["gate"], x["y"], x["index"])
    grad_y, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], x["index"])
    assert out.shape == (0, 6) and grad_y.shape == (0, 6)
    assert_bitwise(grad_gate, torch.zeros(3, 6, dtype=torch.bfloat16), "grad_gate")
