"""``fp64``: the eager expression in float64 on the cell's device. An accuracy reference only.

bfloat16 and float16 products are exact in float64 and the sums carry 53 bits, so its
error is far below the storage dtypes' ULP. On the CPU it computes what autograd's backward
of the expression computes, written out and in blocks of :data:`CHUNK_ROWS` rows
(``grad_gate`` by ``index_add_`` in float64, which adds serially in row order, so the blocks
add in the same order): whole, the float64 autograd graph held about 8 tensors of N x D
float64 at once (11 GB at N = 32768), the CPU cell's peak. The three outputs of N rows are
:class:`~contract.row_blocks.RowBlocks`: each row is a function of the same row of the inputs,
computed when the runner reads it (the accuracy figures and the sha256, block by block), so
not even the outputs are whole (3 x 1.4 GB at N = 32768). tests/test_implementations.py
checks the bits against autograd's whole graph. On a GPU,
autograd's ``index_add_`` would use atomics (its last bits would change from run to run), so
the gradients are written out: ``grad_residual = grad_out``, ``grad_y = gate[index] *
grad_out`` (the same single multiply as autograd's), and ``grad_gate[k]`` the sum over the
rows with ``index == k`` of ``grad_out * y``, a ``torch.sum`` over those rows, whose order
is fixed for a given shape: repeatable. The forward is the same two IEEE operations on
either device, so ``out`` has the same bits on both.

Running it where the cell runs: at N = 32768 the CPU took about 37 s per case
for this reference alone (2-core CPU machine, 2026-12-01).
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.row_blocks import RowBlocks

CHUNK_ROWS = 1024
"""Rows per block of the CPU reference (44 MB per float64 temporary at D = 5376)."""


def _gate_rows(x, start: int, stop: int) -> torch.Tensor:
    """``gate[index[start:stop]]`` in float64: the rows each output row multiplies by."""
    return x["gate"].double().index_select(0, x["index"][start:stop])


def _out_rows(x, start: int, stop: int) -> torch.Tensor:
    """Rows of ``out = residual + gate[index] * y``: one product, one sum, in float64."""
    return torch.add(x["residual"][start:stop].double(),
                     _gate_rows(x, start, stop) * x["y"][start:stop].double())


def _grad_residual_rows(x, start: int, stop: int) -> torch.Tensor:
    """Rows of ``grad_residual``: ``grad_out`` itself (AddBackward passes it on)."""
    return x["grad_out"][start:stop].double()


def _grad_y_rows(x, start: int, stop: int) -> torch.Tensor:
    """Rows of ``grad_y = grad_out * gate[index]`` (MulBackward's product)."""
    return torch.mul(x["grad_out"][start:stop].double(), _gate_rows(x, start, stop))


def _cpu(x: dict, backward: bool) -> dict:
    """autograd's float64 graph of the expression, by blocks of rows: ``out``,
    ``grad_residual`` and ``grad_y`` as :class:`~contract.row_blocks.RowBlocks` (each row is a
    function of the same input row: computed when it is read, never whole), and
    ``grad_gate`` summed now by ``index_add_`` of ``grad_out * y``, block after block in row
    order (IndexSelectBackward's ``index_add_`` into zeros, which adds serially in row
    order)."""
    shape = tuple(x["residual"].shape)

    def rows(compute):
        return RowBlocks(shape, torch.float64, x, compute, block_rows=CHUNK_ROWS)

    if not backward:
        return {"out": rows(_out_rows)}
    index = x["index"]
    grad_gate = torch.zeros(x["gate"].shape, dtype=torch.float64)
    for start in range(0, shape[0], CHUNK_ROWS):
        block = slice(start, start + CHUNK_ROWS)
        grad_gate.index_add_(0, index[block],
                             x["grad_out"][block].double() * x["y"][block].double())
    return {"out": rows(_out_rows), "res": rows(_grad_residual_rows), "y": rows(_grad_y_rows),
            "gate": grad_gate}


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


def run(inputs, *, backward: bool) -> dict:
    """The eager expression in float64 on the inputs' device, with its gradients for
    ``grad_out`` (see the module docstring for how each device computes them): tensors, and
    on the CPU :class:`~contract.row_blocks.RowBlocks` for the outputs of N rows."""
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
