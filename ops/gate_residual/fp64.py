"""``fp64``: the eager expression in float64 on the cell's device. An accuracy reference only.

bfloat16 and float16 products are exact in float64 and the sums carry 53 bits, so its
error is far below the storage dtypes' ULP. On the CPU it is autograd's backward
(``grad_gate`` by ``index_add_`` in float64, which runs serially in row order). On a GPU,
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


def _cpu(x: dict, backward: bool) -> dict[str, torch.Tensor]:
    residual = x["residual"].double().requires_grad_(backward)
    gate = x["gate"].double().requires_grad_(backward)
    y = x["y"].double().requires_grad_(backward)
    with torch.set_grad_enabled(backward):
        out = residual + gate.index_select(0, x["index"]) * y
    if not backward:
        return {"out": out}
    out.backward(x["grad_out"].double())
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


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
    with torch.no_grad() if x["residual"].is_cuda else torch.enable_grad():
        return _gpu(x, backward) if x["residual"].is_cuda else _cpu(x, backward)


FP64 = Implementation(
    name="fp64",
    source="float64 eager expression on the cell's device (GPU: grad_gate as per gate row "
           "sums, repeatable)",
    has_backward=True,
    run=run,
    role="accuracy_reference",
)
