"""``eager``: ``x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)`` in
eager PyTorch with autograd's backward. The baseline."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation


def expression(x, scale, shift, index):
    """The op as MiniMax-H3's DiT writes it (three elementwise ops, each rounded)."""
    return x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """The eager expression, with autograd grads of x, scale and shift for ``grad_out``."""
    index = inputs["index"]
    if not backward:
        with torch.no_grad():
            return {"out": expression(inputs["x"], inputs["scale"], inputs["shift"], index)}
    x, scale, shift = (inputs[k].detach().requires_grad_() for k in ("x", "scale", "shift"))
    out = expression(x, scale, shift, index)
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "x": x.grad, "scale": scale.grad, "shift": shift.grad}


EAGER = Implementation(
    name="eager",
    source="x * (1 + scale.index_select(0, index)) + shift.index_select(0, index), autograd",
    has_backward=True,
    run=run,
)
