"""Input validation shared by the GPU and CPU entry points of gate_residual."""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.errors import OpInputError

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int64, torch.int32)


def check_inputs(residual, gate, y, index, *, device: str, check_index: bool = True):
    """Validate gate_residual's inputs and return them contiguous, lazy negations applied.

    Rejects what eager PyTorch rejects (a float ``index``, an index out of [0, G)) and what
    the kernels do not support (broadcasting, mixed float dtypes), each with a one-line
    :class:`kernels.errors.OpInputError`: ``residual``/``y`` must be (N, D), ``gate`` (G, D),
    ``index`` (N,) int64/int32, all on one ``device`` type ("cuda" or "cpu"), one dtype
    among bfloat16, float16, float32. The index range check reads two scalars back from the
    device (one synchronisation) when N > 0; ``check_index=False`` skips it.
    """
    tensors = {"residual": residual, "gate": gate, "y": y, "index": index}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise OpInputError(
                f"gate_residual: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise OpInputError(f"gate_residual: {name} must be a dense tensor, got {t.layout}")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        found = ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        raise OpInputError(f"gate_residual: tensors are on different devices ({found})")
    (dev,) = devices
    if dev.type != device:
        raise OpInputError(f"gate_residual: expected {device} tensors, got {dev}")
    if index.dtype not in INDEX_DTYPES:
        raise OpInputError(f"gate_residual: index must be int64 or int32, got {index.dtype}")
    if residual.dtype not in FLOAT_DTYPES:
        raise OpInputError(
            f"gate_residual: residual must be bfloat16, float16 or float32, got {residual.dtype}"
        )
    for name in ("gate", "y"):
        if tensors[name].dtype != residual.dtype:
            raise OpInputError(
                f"gate_residual: {name} is {tensors[name].dtype} but residual is {residual.dtype}"
            )
    if residual.dim() != 2 or y.shape != residual.shape:
        raise OpInputError(
            f"gate_residual: residual and y must both be (N, D), got {tuple(residual.shape)} "
            f"and {tuple(y.shape)}"
        )
    if gate.dim() != 2 or gate.shape[1] != residual.shape[1]:
        raise OpInputError(
            f"gate_residual: gate must be (G, D={residual.shape[1]}), got {tuple(gate.shape)}"
        )
    if index.dim() != 1 or index.shape[0] != residual.shape[0]:
        raise OpInputError(
            f"gate_residual: index must be (N={residual.shape[0]},), got {tuple(index.shape)}"
        )
    if check_index and index.numel():
        lo, hi = (int(v) for v in torch.aminmax(index))
        if lo < 0 or hi >= gate.shape[0]:
            bad = lo if lo < 0 else hi
            raise OpInputError(
                f"gate_residual: index holds {bad}, outside [0, G={gate.shape[0]})"
            )
    return (_dense(residual), _dense(gate), _dense(y), index.contiguous())


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous, with a lazy negation (``torch._neg_view``, as autograd makes) applied:
    the kernels read the storage through ``data_ptr()``, which holds the values before it."""
    return t.resolve_neg().contiguous()


def check_backward_inputs(grad_out, gate, y, index, *, device: str, check_index: bool = True):
    """Validate the backward's inputs and return them contiguous.

    ``grad_out`` must be a tensor of ``y``'s shape, dtype and device; ``gate``, ``y`` and
    ``index`` are checked as by :func:`check_inputs` (``y`` in the place of ``residual``),
    the index range too unless ``check_index`` is False (the autograd Function's backward:
    its forward checked them). Raises :class:`kernels.errors.OpInputError`, one line, e.g.
    ``gate_residual backward: grad_out must be (N, D) = (4, 8) like y, got (5, 8)``.
    """
    for name, t in (("grad_out", grad_out), ("y", y)):
        if not isinstance(t, torch.Tensor):
            raise OpInputError(
                f"gate_residual backward: {name} must be a torch.Tensor, got {type(t).__name__}")
    if y.dtype not in FLOAT_DTYPES:
        raise OpInputError(
            f"gate_residual backward: y must be bfloat16, float16 or float32, got {y.dtype}")
    if y.dim() != 2:
        raise OpInputError(f"gate_residual backward: y must be (N, D), got {tuple(y.shape)}")
    if isinstance(gate, torch.Tensor) and gate.dtype != y.dtype:
        raise OpInputError(f"gate_residual backward: gate is {gate.dtype} but y is {y.dtype}")
    _, gate, y, index = check_inputs(y, gate, y, index, device=device, check_index=check_index)
    return check_grad_out(grad_out, y), gate, y, index


def check_grad_out(grad_out, y):
    """``grad_out`` checked against an already checked ``y`` and returned contiguous: a
    tensor of ``y``'s device, dtype and (N, D) shape; else a one-line
    :class:`kernels.errors.OpInputError`. What the autograd Function's backward checks (its
    forward checked the rest)."""
    if not isinstance(grad_out, torch.Tensor):
        raise OpInputError(
            f"gate_residual backward: grad_out must be a torch.Tensor, got "
            f"{type(grad_out).__name__}")
    if grad_out.layout != torch.strided:
        raise OpInputError(
            f"gate_residual backward: grad_out must be a dense tensor, got {grad_out.layout}")
    if grad_out.device != y.device:
        raise OpInputError(
            f"gate_residual backward: grad_out is on {grad_out.device} but y is on {y.device}")
    if grad_out.dtype != y.dtype:
        raise OpInputError(
            f"gate_residual backward: grad_out is {grad_out.dtype} but y is {y.dtype}")
    if grad_out.shape != y.shape:
        raise OpInputError(
            f"gate_residual backward: grad_out must be (N, D) = {tuple(y.shape)} like y, "
            f"got {tuple(grad_out.shape)}")
    return _dense(grad_out)
