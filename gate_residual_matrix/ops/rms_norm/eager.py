"""``eager`` and ``eager_functional``: RMSNorm as the trainer's model code writes it.

``eager`` is diffusers' ``RMSNorm`` module: the variance in float32, ``x * rsqrt(var + eps)``
in float32, that value cast to the weight's dtype when the weight is half precision, then
``* weight`` in the storage dtype (two roundings). ``eager_functional`` is
``torch.nn.functional.rms_norm(x, (D,), weight, eps)`` (one fused computation on recent
torch). They are different references: both are kept. Backward: autograd's.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.ops.rms_norm import EPS


def diffusers_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm over the last dimension as diffusers' ``RMSNorm.forward`` computes it.

    ``x``: (..., D), ``weight``: (D,), same storage dtype (bfloat16, float16, float32).
    Returns ``x``'s shape and dtype.
    """
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    normed = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        normed = normed.to(weight.dtype)
    return (normed * weight).to(x.dtype)


def functional_rms_norm(x: torch.Tensor, weight: torch.Tensor,
                        eps: float = EPS) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` over the last dimension (shapes as
    :func:`diffusers_rms_norm`)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def _run(norm, inputs, backward: bool) -> dict[str, torch.Tensor]:
    if not backward:
        with torch.no_grad():
            return {"out": norm(inputs["x"], inputs["weight"])}
    x, weight = (inputs[k].detach().requires_grad_() for k in ("x", "weight"))
    out = norm(x, weight)
    out.backward(inputs["grad_out"])
    return {"out": out.detach(), "x": x.grad, "weight": weight.grad}


def run(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """:func:`diffusers_rms_norm`, with autograd's grad_x and grad_weight for ``grad_out``."""
    return _run(diffusers_rms_norm, inputs, backward)


def run_functional(inputs, *, backward: bool) -> dict[str, torch.Tensor]:
    """:func:`functional_rms_norm`, with autograd's gradients."""
    return _run(functional_rms_norm, inputs, backward)


EAGER = Implementation(
    name="eager",
    source="diffusers RMSNorm as written: float32 variance, x * rsqrt(var + eps) cast to the "
           "weight's dtype, then * weight; autograd",
    has_backward=True,
    run=run,
)

EAGER_FUNCTIONAL = Implementation(
    name="eager_functional",
    source="torch.nn.functional.rms_norm(x, (D,), weight, eps); autograd",
    has_backward=True,
    run=run_functional,
)
