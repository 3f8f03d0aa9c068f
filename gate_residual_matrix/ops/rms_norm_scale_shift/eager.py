"""``eager`` and ``eager_functional``: the norm (diffusers' RMSNorm, or
``torch.nn.functional.rms_norm``: :mod:`ops.rms_norm.eager`), then the modulation in the
storage dtype as MiniMax-H3's DiT writes it (three elementwise ops, each rounded).
Backward: autograd's."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm.eager import diffusers_rms_norm, functional_rms_norm


def expression(x, weight, scale, shift, index, norm=diffusers_rms_norm):
    """``norm(x, weight) * (1 + scale[index]) + shift[index]``; (N, D) in x's dtype."""
    return norm(x, weight) * (1 + scale.index_select(0, index)) + shift.index_select(0, index)


def _run(norm, inputs, backward: bool) -> dict[str, torch.Tensor]:
    index = inputs["index"]
    names = ("x", "weight", "scale", "shift")
    if not backward:
        with torch.no_grad():
            return {"out": expression(*(inputs[k] for k in names), index, norm)}
    x, weight, scale, shift = (inputs[k].detach().requires_grad_() for k in names)
    out = expression(x, weight, scale, shift, index, norm)
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "x": x.grad, "weight": weight.grad, "scale": scale.grad,
            "shift": shift.grad}


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """diffusers' RMSNorm, then the modulation; autograd's gradients."""
    return _run(diffusers_rms_norm, inputs, backward)


def run_functional(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``torch.nn.functional.rms_norm``, then the modulation; autograd's gradients."""
    return _run(functional_rms_norm, inputs, backward)


EAGER = Implementation(
    name="eager",
    source="diffusers RMSNorm as written, then x * (1 + scale.index_select(0, index)) + "
           "shift.index_select(0, index); autograd",
    has_backward=True,
    run=run,
)

EAGER_FUNCTIONAL = Implementation(
    name="eager_functional",
    source="torch.nn.functional.rms_norm, then the modulation as eager; autograd",
    has_backward=True,
    run=run_functional,
)
