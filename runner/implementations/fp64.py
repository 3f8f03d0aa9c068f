"""``fp64``: the eager expression in float64 on the CPU. An accuracy reference only.

bfloat16 and float16 products are exact in float64 and the sums carry 53 bits, so its
error is far below the storage dtypes' ULP; ``grad_gate`` is ``index_add_`` in float64 on the
CPU, which runs serially in row order.
"""

from __future__ import annotations

import torch

from runner.implementations import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """Float64 copies of the inputs on the CPU through the eager expression and autograd."""
    x = {k: v.detach().to("cpu") for k, v in inputs.items()}
    residual = x["residual"].double().requires_grad_(backward)
    gate = x["gate"].double().requires_grad_(backward)
    y = x["y"].double().requires_grad_(backward)
    with torch.set_grad_enabled(backward):
        out = residual + gate.index_select(0, x["index"]) * y
    if not backward:
        return {"out": out}
    out.backward(x["grad_out"].double())
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


FP64 = Implementation(
    name="fp64",
    source="float64 eager expression on the CPU",
    has_backward=True,
    run=run,
    role="accuracy_reference",
    device="cpu",
)
