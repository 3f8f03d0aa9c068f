"""gate_residual on the GPU with numba.cuda: the torch entry points and the autograd Function.

    out = residual + gate.index_select(0, index) * y

Shapes, dtypes, gradients and bits: :mod:`kernels.gate_residual_kernels` (the kernels). This
module checks a call's inputs (:mod:`kernels.checks`, one-line :class:`OpInputError`), finds
or makes its launch plan (:mod:`kernels.gate_residual_plans`) and runs it.

Host path of one call (docs/performance.md "Host overhead"): the inputs' shapes,
dtypes and devices form a key; a key seen before, with inputs dense now, finds its plan
(built when the full checks of kernels/checks.py first passed for that key), so a call does:
the key and density checks, the output's allocation, the data pointers and one
``cuLaunchKernelEx``. Anything else (a new key, a non-contiguous or lazily negated input,
``check_index="sync"`` or a bad value) takes the full path: kernels/checks.py, dense copies,
then the plan. The index range is checked in the kernels (kernels/device_assert.py).

Example::

    >>> out = gate_residual(residual, gate, y, index)            # doctest: +SKIP
    >>> out = GateResidual.apply(residual, gate, y, index)       # doctest: +SKIP
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.checks import check_backward_inputs, check_grad_out, check_inputs
from gate_residual_matrix.kernels.device_assert import FLAG_ASSERT, FLAG_CLEAN
from gate_residual_matrix.kernels.errors import OpInputError
from gate_residual_matrix.kernels.gate_residual_backward_plan import (
    WORKSPACE_CACHE_BYTES,
    _BackwardPlan,
)
from gate_residual_matrix.kernels.gate_residual_kernels import (
    CHUNK_ROWS,
    FORWARD_MAX_GRID_Y,
    FORWARD_ROWS_PER_STEP,
    FUSED_MAX_CHUNKS,
    SUMMATION_ORDER,
    backward_vec_geometry,
    forward_vec_geometry,
    kernels_for,
    launch_backward,
    launch_backward_vec,
    launch_forward,
    launch_forward_vec,
    n_chunks,
    vec_kernels_for,
)

# the private names: for the GPU tests and the bench
from gate_residual_matrix.kernels.gate_residual_plans import (
    _BACKWARD_PLANS,
    _FORWARD_PLANS,
    _dtype_name,  # noqa: F401
    _flags,  # noqa: F401
    _ForwardPlan,
    _launch_forward,  # noqa: F401
    _launcher,  # noqa: F401
)

#: The device type the entry points take ("cuda"; bench/host.py times the
#: same path on CPU tensors with the driver call replaced).
DEVICE_TYPE = "cuda"


def _key(a, gate, b, index, mode) -> tuple:
    """The plan key of (residual or grad_out, gate, y, index): shapes, dtypes, devices."""
    return (a.shape, gate.shape, b.shape, index.shape, a.dtype, gate.dtype, b.dtype,
            index.dtype, a.device, gate.device, b.device, index.device, mode)


def _dense(a, gate, b, index) -> bool:
    """Whether the kernels can read the tensors' storage as it is: contiguous (dense, so not
    sparse) and without a lazy negation."""
    return (a.is_contiguous() and gate.is_contiguous() and b.is_contiguous()
            and index.is_contiguous() and not (a.is_neg() or gate.is_neg() or b.is_neg()))


def _cached_plan(cache, big, gate, y, index, check_index):
    """The plan cached in ``cache`` (:data:`_FORWARD_PLANS` or :data:`_BACKWARD_PLANS`) of a
    call whose inputs need no work (see the comment above), else None; ``big`` is the
    (N, D) input besides ``y`` (``residual``, or the backward's ``grad_out``).
    Written out rather than calling :func:`_key` and :func:`_dense`: each Python call costs
    about 0.1 µs, and this runs on every call. ``mode``: the flag a fast call launches with
    (FLAG_ASSERT for ``True``, FLAG_CLEAN for ``False``); anything else (``"sync"``, bad
    values) takes the full path."""
    mode = FLAG_ASSERT if check_index is True else FLAG_CLEAN if check_index is False else None
    if mode is None:
        return None
    try:
        key = (big.shape, gate.shape, y.shape, index.shape, big.dtype, gate.dtype,
               y.dtype, index.dtype, big.device, gate.device, y.device, index.device, mode)
        plan = cache.plan if key == cache.key else cache.get(key)
        if plan is not None and (
                big.is_contiguous() and gate.is_contiguous() and y.is_contiguous()
                and index.is_contiguous()
                and not (big.is_neg() or gate.is_neg() or y.is_neg())):
            return plan
    except (AttributeError, TypeError, RuntimeError):  # not tensors: the full checks say so
        pass
    return None


def _checked_forward(residual, gate, y, index, check_index):
    """The full path: every check of kernels/checks.py, dense copies, then the plan (made and
    kept for the dense inputs' key). Returns (plan, residual, gate, y, index)."""
    check_index = _index_mode(check_index)
    residual, gate, y, index = check_inputs(residual, gate, y, index, device=DEVICE_TYPE,
                                            check_index=check_index == "sync")
    mode = FLAG_ASSERT if check_index is True else FLAG_CLEAN
    key = _key(residual, gate, y, index, mode)
    plan = _FORWARD_PLANS.get(key)
    if plan is None:
        plan = _ForwardPlan(residual, gate, index, mode)
        _FORWARD_PLANS.put(key, plan)
    return plan, residual, gate, y, index


def _index_mode(check_index) -> bool | str:
    """``check_index`` if it is ``True``, ``False`` or ``"sync"``; else a one-line
    :class:`OpInputError` (a typo must not turn the check off)."""
    if isinstance(check_index, bool) or (isinstance(check_index, str) and check_index == "sync"):
        return check_index
    raise OpInputError(f'gate_residual: check_index must be True, False or "sync", '
                       f"got {check_index!r}")


def gate_residual_forward(residual, gate, y, index, *, check_index: bool | str = True):
    """``residual + gate.index_select(0, index) * y`` with the numba.cuda forward kernel.

    Args: ``residual``, ``y``: (N, D) CUDA tensors; ``gate``: (G, D); ``index``: (N,) int64
    or int32 in [0, G); one floating dtype (bfloat16, float16 or float32) for all three.
    Non-contiguous inputs are made contiguous. Returns a new (N, D) tensor, bitwise equal to
    eager. Raises :class:`kernels.errors.OpInputError` (a ``ValueError``) for bad input.

    ``check_index``: ``True`` (default) checks every index in the kernel, without a
    synchronisation: an index outside [0, G) fails the launch with a device-side assert
    (kernels/device_assert.py), which surfaces at the next synchronisation as
    ``device-side assert triggered``, as eager's ``index_select`` does (the CUDA context is
    unusable afterwards in both). ``"sync"`` reads the range back first and raises
    ``OpInputError`` at once (one synchronisation). ``False`` checks nothing: rows with an
    out-of-range index come out NaN, and ``gate`` is never read outside its rows.

    Example: ``out = gate_residual_forward(r, g, y, idx)``.
    """
    plan = _cached_plan(_FORWARD_PLANS, residual, gate, y, index, check_index)
    if plan is None:
        plan, residual, gate, y, index = _checked_forward(residual, gate, y, index, check_index)
    return plan.run(residual, gate, y, index)


def _plan_backward(grad_out, gate, index, mode: int, key: tuple) -> _BackwardPlan:
    plan = _BACKWARD_PLANS.get(key)
    if plan is None:
        plan = _BackwardPlan(grad_out, gate, index, mode)
        _BACKWARD_PLANS.put(key, plan)
    return plan


def gate_residual_backward(grad_out, gate, y, index, *, check_index: bool | str = True):
    """(grad_y, grad_gate) for upstream ``grad_out`` (N, D), with the numba.cuda kernels.

    Args: ``grad_out``, ``y``: (N, D) CUDA tensors of one floating dtype (bfloat16, float16
    or float32), ``gate``: (G, D) of that dtype, ``index``: (N,) int64 or int32 in [0, G).
    Returns ``grad_y`` (N, D), bitwise equal to eager's, and ``grad_gate`` (G, D),
    deterministic: float32 sums in :data:`SUMMATION_ORDER`, rounded once. One kernel launch
    up to :data:`FUSED_MAX_CHUNKS` chunks of 16-byte rows, two above
    (kernels/gate_residual_backward_plan.py; the same bits). Scratch, from two chunks on:
    one float32 buffer of n_chunks(N) * G * D elements (kept between calls up to
    :data:`WORKSPACE_CACHE_BYTES`) and, for the one launch, a ticket per column block.
    Raises :class:`kernels.errors.OpInputError` (one line)
    for bad input. ``check_index`` as in :func:`gate_residual_forward`; with ``False``, rows
    with an out-of-range index give NaN ``grad_y`` rows and add nothing to ``grad_gate``.

    Example: ``grad_y, grad_gate = gate_residual_backward(grad_out, g, y, idx)``.
    """
    plan = _cached_plan(_BACKWARD_PLANS, grad_out, gate, y, index, check_index)
    if plan is None:
        check_index = _index_mode(check_index)
        grad_out, gate, y, index = check_backward_inputs(grad_out, gate, y, index,
                                                         device=DEVICE_TYPE,
                                                         check_index=check_index == "sync")
        mode = FLAG_ASSERT if check_index is True else FLAG_CLEAN
        plan = _plan_backward(grad_out, gate, index, mode, _key(grad_out, gate, y, index, mode))
    return plan.run(grad_out, gate, y, index)


class GateResidual(torch.autograd.Function):
    """Autograd Function: forward and backward with the numba.cuda kernels.

    ``GateResidual.apply(residual, gate, y, index, check_index=True)`` -> out (N, D).
    Gradients flow to ``residual`` (``grad_out`` itself), ``gate`` and ``y``; ``index`` has
    none. ``check_index`` as in :func:`gate_residual_forward`.
    """

    @staticmethod
    def forward(ctx, residual, gate, y, index, check_index=True):
        plan = _cached_plan(_FORWARD_PLANS, residual, gate, y, index, check_index)
        if plan is None:
            plan, residual, gate, y, index = _checked_forward(residual, gate, y, index,
                                                              check_index)
        ctx.save_for_backward(gate, y, index)
        ctx.plan = plan
        return plan.run(residual, gate, y, index)

    @staticmethod
    def backward(ctx, grad_out):
        gate, y, index = ctx.saved_tensors
        forward = ctx.plan
        if not (grad_out.__class__ is torch.Tensor and grad_out.dtype is forward.dtype
                and grad_out.shape == forward.shape and grad_out.device == forward.device_obj
                and grad_out.is_contiguous() and not grad_out.is_neg()):
            grad_out = check_grad_out(grad_out, y)
        plan = forward.backward
        if plan is None:
            # The forward checked the index (or was told not to): the sink flag, no check.
            plan = forward.backward = _plan_backward(
                grad_out, gate, index, FLAG_CLEAN, _key(grad_out, gate, y, index, FLAG_CLEAN))
        grad_y, grad_gate = plan.run(grad_out, gate, y, index)
        return grad_out, grad_gate, grad_y, None, None


#: ``torch.autograd.Function.apply`` without its Python wrapper: the C++ ``_FunctionBase.apply``
#: it ends in (torch 2.11-2.13, ``torch/autograd/function.py``), None where torch lacks it.
_FUNCTION_APPLY = getattr(super(torch.autograd.Function, GateResidual), "apply", None)
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def gate_residual(residual, gate, y, index, *, check_index: bool | str = True):
    """Differentiable ``residual + gate.index_select(0, index) * y`` (numba.cuda kernels).

    Same arguments, result and errors as :func:`gate_residual_forward`; use it inside
    autograd graphs. Example: ``out = gate_residual(r, g, y, idx); out.backward(grad)``.

    Where no gradient can flow (grad mode off, or no input requires one) it is
    :func:`gate_residual_forward` itself. Otherwise it is ``GateResidual.apply``; outside
    functorch transforms it does what ``Function.apply``'s Python wrapper does in that case
    (unwrap dead functorch wrappers, then the C++ ``apply``) without the wrapper's own cost
    (about 3 µs a call on the CPU machine: ``bench/host.py``).
    """
    if not (torch.is_grad_enabled() and (getattr(residual, "requires_grad", False)
                                         or getattr(gate, "requires_grad", False)
                                         or getattr(y, "requires_grad", False))):
        return gate_residual_forward(residual, gate, y, index, check_index=check_index)
    tensor = torch.Tensor
    if (_FUNCTION_APPLY is None or _UNWRAP_IF_DEAD is None or _TRANSFORMS_ACTIVE()
            or not (type(residual) is tensor and type(gate) is tensor and type(y) is tensor
                    and type(index) is tensor)):
        return GateResidual.apply(residual, gate, y, index, check_index)
    unwrap = _UNWRAP_IF_DEAD
    return _FUNCTION_APPLY(unwrap(residual), unwrap(gate), unwrap(y), unwrap(index),
                           check_index)


__all__ = [
    "CHUNK_ROWS",
    "FORWARD_MAX_GRID_Y",
    "FORWARD_ROWS_PER_STEP",
    "FUSED_MAX_CHUNKS",
    "SUMMATION_ORDER",
    "WORKSPACE_CACHE_BYTES",
    "GateResidual",
    "backward_vec_geometry",
    "forward_vec_geometry",
    "gate_residual",
    "gate_residual_backward",
    "gate_residual_forward",
    "kernels_for",
    "launch_backward",
    "launch_backward_vec",
    "launch_forward",
    "launch_forward_vec",
    "n_chunks",
    "vec_kernels_for",
]
