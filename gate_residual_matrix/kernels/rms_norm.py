"""RMSNorm ops on the GPU with numba.cuda: forward entry points whose bits are the rollout
engines' batch-invariant kernels, a batch-invariant backward, and autograd Functions.

* ``rms_norm(x, weight)``: ``x * rsqrt(mean(x^2) + eps) * weight`` for ``x`` (N, D) and
  ``weight`` (D,), bitwise equal to vLLM's ``rms_norm_batch_invariant`` (its Triton
  ``_rms_norm_kernel``) for D a multiple of 16;
* ``add_rms_norm(x, residual, weight)``: ``h = round(x + residual)`` then ``rms_norm(h)``
  (vLLM's batch-invariant order on ``h``); returns ``(out, h)``. vLLM itself routes the
  residual case to its CUDA ``fused_add_rms_norm``, whose block size (so its reduction
  order) depends on the number of tokens unless a batch-invariant mode pins it; it is not
  the reference here;
* ``rms_norm_scale_shift(x, weight, scale, shift, index)``: ``RMSNorm(x) * (1 +
  scale[index]) + shift[index]``, bitwise equal to vllm-omni's
  ``rms_norm_indexed_scale_shift`` for D a multiple of 16 (``scale``, ``shift``: (G, D);
  ``index``: (N,) int64/int32 in [0, G)).

Storage dtypes bfloat16, float16, float32 (one for all tensors), float32 inside. The orders
and instructions are documented in ``kernels/rms_norm_order.py``; the kernels are in
``kernels/rms_norm_forward.py`` and ``kernels/rms_norm_backward.py``, the CPU twins in
``kernels/rms_norm_cpu.py``. Every row is computed by one thread block from that row alone,
in an order fixed by D: batch-invariant and repeatable. The backward's orders are
``kernels/rms_norm_backward.py``'s ``BACKWARD_ORDER``.

Example::

    >>> out = rms_norm(x, weight)                          # doctest: +SKIP
    >>> out.backward(grad_out)                             # doctest: +SKIP
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.index_check import assert_index, device_flag, flags, index_mode
from gate_residual_matrix.kernels.rms_norm_checks import check_index_range, check_tensors, dense
from gate_residual_matrix.kernels.rms_norm_launch import launch_backward, launch_forward
from gate_residual_matrix.kernels.rms_norm_order import EPS

_SS = "rms_norm_scale_shift"


def _check_forward(op: str, x, weight, residual=None, scale=None, shift=None, index=None):
    rows = {"x": x} if residual is None else {"x": x, "residual": residual}
    params = {"weight": (weight, ("D",))}
    if scale is not None:
        params |= {"scale": (scale, ("G", "D")), "shift": (shift, ("G", "D"))}
    check_tensors(op, "cuda", rows, params, index)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` in vLLM's batch-invariant order.

    ``x``: (N, D) CUDA tensor; ``weight``: (D,), same dtype (bfloat16, float16, float32).
    Returns a new (N, D) tensor. Raises :class:`kernels.errors.OpInputError`.
    """
    _check_forward("rms_norm", x, weight)
    x, weight = dense(x), dense(weight)
    out = torch.empty_like(x)
    launch_forward("rms_norm", (out,), (x,), weight, eps)
    return out


def add_rms_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, h)``: ``h = round(x + residual)``, ``out = rms_norm(h, weight)``.

    ``x``, ``residual``: (N, D) CUDA tensors; ``weight``: (D,); one dtype. Raises
    :class:`kernels.errors.OpInputError`.
    """
    _check_forward("add_rms_norm", x, weight, residual=residual)
    x, residual, weight = dense(x), dense(residual), dense(weight)
    out, h = torch.empty_like(x), torch.empty_like(x)
    launch_forward("add_rms_norm", (out, h), (x, residual), weight, eps)
    return out, h


def rms_norm_scale_shift_forward(x, weight, scale, shift, index, eps: float = EPS, *,
                                 check_index: bool | str = True) -> torch.Tensor:
    """``RMSNorm(x) * weight * (1 + scale[index]) + shift[index]`` in vllm-omni's order.

    ``x``: (N, D); ``weight``: (D,); ``scale``, ``shift``: (G, D); one dtype; ``index``:
    (N,) int64/int32 in [0, G). ``check_index``: ``True`` checks on the device without
    synchronising (a bad index fails at the next synchronisation), ``"sync"`` raises at once,
    ``False`` gives NaN rows. Raises :class:`kernels.errors.OpInputError`.
    """
    check_index = index_mode(_SS, check_index)
    _check_forward(_SS, x, weight, scale=scale, shift=shift, index=index)
    if check_index == "sync":
        check_index_range(_SS, index, scale.shape[0])
    x, weight, scale, shift, index = (dense(t) for t in (x, weight, scale, shift, index))
    out = torch.empty_like(x)
    launch_forward(_SS, (out,), (x,), weight, eps, index, device_flag(x.device, check_index),
                   (scale, shift))
    assert_index(_SS, x.device, check_index)
    return out


def forward_variant(op: str, variant: str, x, weight, *, residual=None, scale=None,
                    shift=None, index=None, eps: float = EPS):
    """The forward of ``op`` with a kernel variant of ``kernels/rms_norm_forward.py``
    (``"triton"`` is the op itself; ``"ieee"`` and ``"nofma"`` exist for the probe and the
    tests). Inputs as for the op's entry point, already checked; returns the op's outputs
    (``(out, h)`` for add_rms_norm). Bad indices give NaN rows."""
    x, weight = dense(x), dense(weight)
    out = torch.empty_like(x)
    if op == "add_rms_norm":
        h = torch.empty_like(x)
        launch_forward(op, (out, h), (x, dense(residual)), weight, eps, variant=variant)
        return out, h
    if op == _SS:
        launch_forward(op, (out,), (x,), weight, eps, dense(index),
                       device_flag(x.device, False), (dense(scale), dense(shift)),
                       variant=variant)
        return out
    launch_forward(op, (out,), (x,), weight, eps, variant=variant)
    return out


def _grad(grad: torch.Tensor | None, like: torch.Tensor, what: str, op: str) -> torch.Tensor:
    """An upstream gradient checked against ``like`` (zeros for None), contiguous."""
    if grad is None:
        return torch.zeros_like(like)
    check_tensors(f"{op} backward", "cuda", {"x": like, what: grad}, {})
    return dense(grad)


def rms_norm_backward(grad_out, x, weight, eps: float = EPS):
    """(grad_x (N, D), grad_weight (D,)) of rms_norm for upstream ``grad_out`` (N, D), in
    ``kernels/rms_norm_backward.py``'s BACKWARD_ORDER. Raises
    :class:`kernels.errors.OpInputError`."""
    _check_forward("rms_norm backward", x, weight)
    x, weight = dense(x), dense(weight)
    grad_out = _grad(grad_out, x, "grad_out", "rms_norm")
    grad_x = torch.empty_like(x)
    grads = launch_backward("rms_norm", grad_x, (grad_out, x), weight, eps, 1)
    return grad_x, grads[0]


def add_rms_norm_backward(grad_out, grad_h, h, weight, eps: float = EPS):
    """(grad_x, grad_weight) of add_rms_norm for upstreams ``grad_out`` (into ``out``) and
    ``grad_h`` (into ``h``), either None for zeros, given the forward's ``h`` (N, D);
    grad_residual equals grad_x. Raises :class:`kernels.errors.OpInputError`."""
    _check_forward("add_rms_norm backward", h, weight)
    h, weight = dense(h), dense(weight)
    grad_out = _grad(grad_out, h, "grad_out", "add_rms_norm")
    grad_h = _grad(grad_h, h, "grad_h", "add_rms_norm")
    grad_x = torch.empty_like(h)
    grads = launch_backward("add_rms_norm", grad_x, (grad_out, grad_h, h), weight, eps, 1)
    return grad_x, grads[0]


def rms_norm_scale_shift_backward(grad_out, x, weight, scale, index, eps: float = EPS, *,
                                  check_index: bool | str = True):
    """(grad_x, grad_weight, grad_scale, grad_shift) of rms_norm_scale_shift for upstream
    ``grad_out`` (N, D); ``check_index`` as in :func:`rms_norm_scale_shift_forward`. Raises
    :class:`kernels.errors.OpInputError`."""
    check_index = index_mode(_SS, check_index)
    _check_forward(f"{_SS} backward", x, weight, scale=scale, shift=scale, index=index)
    if check_index == "sync":
        check_index_range(_SS, index, scale.shape[0])
    x, weight, scale, index = (dense(t) for t in (x, weight, scale, index))
    grad_out = _grad(grad_out, x, "grad_out", _SS)
    grads = _scale_shift_backward(grad_out, x, weight, scale, index, eps,
                                  device_flag(x.device, check_index))
    assert_index(_SS, x.device, check_index)
    return grads


def _scale_shift_backward(grad_out, x, weight, scale, index, eps, flag):
    n_groups = scale.shape[0]
    grad_x = torch.empty_like(x)
    grads = launch_backward(_SS, grad_x, (grad_out, x), weight, eps, 1 + 2 * n_groups, index,
                            flag, (scale,))
    return grad_x, grads[0], grads[1:1 + n_groups], grads[1 + n_groups:]


class RMSNorm(torch.autograd.Function):
    """``RMSNorm.apply(x, weight, eps)`` -> out (N, D); gradients to ``x`` and ``weight``."""

    @staticmethod
    def forward(ctx, x, weight, eps=EPS):
        out = rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(dense(x), dense(weight))
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x, grad_weight = rms_norm_backward(grad_out, x, weight, ctx.eps)
        return grad_x, grad_weight, None


class AddRMSNorm(torch.autograd.Function):
    """``AddRMSNorm.apply(x, residual, weight, eps)`` -> (out, h); gradients to ``x``,
    ``residual`` (the same values) and ``weight``."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps=EPS):
        out, h = add_rms_norm_forward(x, residual, weight, eps)
        ctx.save_for_backward(h, dense(weight))
        ctx.eps = eps
        return out, h

    @staticmethod
    def backward(ctx, grad_out, grad_h):
        h, weight = ctx.saved_tensors
        grad_x, grad_weight = add_rms_norm_backward(grad_out, grad_h, h, weight, ctx.eps)
        return grad_x, grad_x, grad_weight, None


class RMSNormScaleShift(torch.autograd.Function):
    """``RMSNormScaleShift.apply(x, weight, scale, shift, index, eps, check_index)`` -> out;
    gradients to ``x``, ``weight``, ``scale`` and ``shift``."""

    @staticmethod
    def forward(ctx, x, weight, scale, shift, index, eps=EPS, check_index=True):
        out = rms_norm_scale_shift_forward(x, weight, scale, shift, index, eps,
                                           check_index=check_index)
        ctx.save_for_backward(dense(x), dense(weight), dense(scale), dense(index))
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, scale, index = ctx.saved_tensors
        grad_out = _grad(grad_out, x, "grad_out", _SS)
        # the forward checked the index (or was told not to): the sink flag
        grad_x, grad_weight, grad_scale, grad_shift = _scale_shift_backward(
            grad_out, x, weight, scale, index, ctx.eps, flags(x.device)[1])
        return grad_x, grad_weight, grad_scale, grad_shift, None, None, None


def rms_norm(x, weight, eps: float = EPS):
    """Differentiable :func:`rms_norm_forward` (numba.cuda kernels)."""
    return RMSNorm.apply(x, weight, eps)


def add_rms_norm(x, residual, weight, eps: float = EPS):
    """Differentiable :func:`add_rms_norm_forward`: ``(out, h)``."""
    return AddRMSNorm.apply(x, residual, weight, eps)


def rms_norm_scale_shift(x, weight, scale, shift, index, eps: float = EPS, *,
                         check_index: bool | str = True):
    """Differentiable :func:`rms_norm_scale_shift_forward`."""
    return RMSNormScaleShift.apply(x, weight, scale, shift, index, eps, check_index)


__all__ = ["AddRMSNorm", "RMSNorm", "RMSNormScaleShift", "add_rms_norm",
           "add_rms_norm_backward", "add_rms_norm_forward", "forward_variant", "rms_norm",
           "rms_norm_backward", "rms_norm_forward", "rms_norm_scale_shift",
           "rms_norm_scale_shift_backward", "rms_norm_scale_shift_forward"]
