"""``fp64``: the eager expression in float64 on the cell's device. An accuracy reference only.

bfloat16 and float16 products are exact in float64 and the sums carry 53 bits, so its
error is far below the storage dtypes' ULP. On the CPU it computes what autograd's backward
of the expression computes, written out and in blocks of :data:`CHUNK_ROWS` rows
(``grad_gate`` by ``index_add_`` in float64, which adds serially in row order, so the blocks
add in the same order): whole, the float64 autograd graph held about 8 tensors of N x D
float64 at once (11 GB at N = 32768), the CPU cell's peak. Only the four outputs are whole
now; tests/test_implementations.py checks the bits against autograd's whole graph. On a GPU,
autograd's ``index_add_`` would use atomics (its last bits would change from run to run), so
the gradients are written out: ``grad_residual = grad_out``, ``grad_y = gate[index] *
grad_out`` (the same single multiply as autograd's), and ``grad_gate[k]`` the sum over the
rows with ``index == k`` of ``grad_out * y``, a ``torch.sum`` over those rows, whose order
is fixed for a given shape: repeatable. The forward is the same two IEEE operations on
either device, so ``out`` has the same bits on both.

Running it where the cell runs (issue 11): at N = 32768 the CPU took about 37 s per case
for this reference alone (2-core CPU machine, 2026-12-01).
"""

from __future__ import annotations

import torch

from runner.implementations import Implementation

CHUNK_ROWS = 1024
"""Rows per block of the CPU reference (44 MB per float64 temporary at D = 5376)."""


def _cpu(x: dict, backward: bool) -> dict[str, torch.Tensor]:
    """autograd's float64 graph of the expression, by blocks of rows: ``out = residual +
    rows * y`` (``rows = gate[index]``), ``grad_residual = grad_out`` (AddBackward passes it
    on), ``grad_y = grad_out * rows`` and ``grad_gate += index_add(grad_out * y)``
    (MulBackward's products, IndexSelectBackward's ``index_add_`` into zeros, block after
    block in row order)."""
    index = x["index"]
    gate = x["gate"].double()
    shape = x["residual"].shape
    out = torch.empty(shape, dtype=torch.float64)
    if backward:
        res, grad_y = torch.empty_like(out), torch.empty_like(out)
        grad_gate = torch.zeros(gate.shape, dtype=torch.float64)
    for start in range(0, shape[0], CHUNK_ROWS):
        rows_of = slice(start, start + CHUNK_ROWS)
        rows = gate.index_select(0, index[rows_of])
        y = x["y"][rows_of].double()
        torch.add(x["residual"][rows_of].double(), rows * y, out=out[rows_of])
        if backward:
            grad_out = x["grad_out"][rows_of].double()
            res[rows_of] = grad_out
            torch.mul(grad_out, rows, out=grad_y[rows_of])
            grad_gate.index_add_(0, index[rows_of], grad_out * y)
    if not backward:
        return {"out": out}
    return {"out": out, "res": res, "y": grad_y, "gate": grad_gate}


def _gpu(x: dict, backward: bool) -> dict[str, torch.Tensor]:
    index = x["index"]
    gate = x["gate"].double()
    rows = gate.index_select(0, index)
    out = x["residual"].double() + rows * x["y"].double()
    if not backward:
        return {"out": out}
    grad_out = x["grad_out"].double()
    grad_y = rows * grad_out
    del rows
    product = grad_out * x["y"].double()
    grad_gate = torch.stack([product[index == k].sum(dim=0) for k in range(gate.shape[0])])
    return {"out": out, "res": grad_out, "y": grad_y, "gate": grad_gate}


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """The eager expression in float64 on the inputs' device, with its gradients for
    ``grad_out`` (see the module docstring for how each device computes them)."""
    x = {k: v.detach() for k, v in inputs.items()}
    with torch.no_grad():
        return _gpu(x, backward) if x["residual"].is_cuda else _cpu(x, backward)


FP64 = Implementation(
    name="fp64",
    source="float64 eager expression on the cell's device (GPU: grad_gate as per gate row "
           "sums, repeatable)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
