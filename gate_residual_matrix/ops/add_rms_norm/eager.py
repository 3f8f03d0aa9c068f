"""``eager`` and ``eager_functional``: ``h = x + residual`` in the storage dtype, then
diffusers' RMSNorm (``eager``) or ``torch.nn.functional.rms_norm`` (``eager_functional``) of
``h`` (:mod:`ops.rms_norm.eager`). Backward: autograd's, for ``grad_out`` and ``grad_h``."""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm.eager import diffusers_rms_norm, functional_rms_norm


def expression(x, residual, weight, norm=diffusers_rms_norm):
    """``(out, h)``: ``h = x + residual``, ``out = norm(h, weight)``; shapes (N, D)."""
    h = x + residual
    return norm(h, weight), h


def _run(norm, inputs, backward: bool) -> dict[str, torch.Tensor]:
    if not backward:
        with torch.no_grad():
            out, h = expression(inputs["x"], inputs["residual"], inputs["weight"], norm)
        return {"out": out, "h": h}
    x, residual, weight = (inputs[k].detach().requires_grad_()
                           for k in ("x", "residual", "weight"))
    out, h = expression(x, residual, weight, norm)
    torch.autograd.backward([out, h], [inputs["grad_out"], inputs["grad_h"]])
    return {"out": out.detach(), "h": h.detach(), "x": x.grad, "residual": residual.grad,
            "weight": weight.grad}


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``h = x + residual``, diffusers' RMSNorm of ``h``; autograd's gradients."""
    return _run(diffusers_rms_norm, inputs, backward)


def run_functional(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """``h = x + residual``, ``torch.nn.functional.rms_norm`` of ``h``; autograd's."""
    return _run(functional_rms_norm, inputs, backward)


EAGER = Implementation(
    name="eager",
    source="h = x + residual; diffusers RMSNorm(h) as written; autograd",
    has_backward=True,
    run=run,
)

EAGER_FUNCTIONAL = Implementation(
    name="eager_functional",
    source="h = x + residual; torch.nn.functional.rms_norm(h, (D,), weight, eps); autograd",
    has_backward=True,
    run=run_functional,
)
