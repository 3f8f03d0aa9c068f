"""``eager``: the diffusers expression, autograd backward. The baseline."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``residual + gate.index_select(0, index) * y`` in eager PyTorch, with autograd grads."""
    if not backward:
        with torch.no_grad():
            out = inputs["residual"] + inputs["gate"].index_select(0, inputs["index"]) * inputs["y"]
        return {"out": out}
    residual = inputs["residual"].detach().requires_grad_()
    gate = inputs["gate"].detach().requires_grad_()
    y = inputs["y"].detach().requires_grad_()
    out = residual + gate.index_select(0, inputs["index"]) * y
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "res": residual.grad, "y": y.grad, "gate": gate.grad}


EAGER = Implementation(
    name="eager",
    source="diffusers residual + gate.index_select(...) * y",
    has_backward=True,
    run=run,
)
