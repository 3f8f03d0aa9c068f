"""Input validation shared by the GPU and CPU entry points of indexed_scale_shift.

Every error is a one-line :class:`kernels.errors.OpInputError` (a ``ValueError``) that starts
with ``indexed_scale_shift:`` (or ``indexed_scale_shift backward:``), names the argument, what
was expected and what was found, e.g.
``indexed_scale_shift: shift must be (G, D) = (3, 8) like scale, got (3, 9)``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.errors import OpInputError

OP = "indexed_scale_shift"
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int64, torch.int32)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a lazy negation (``torch._neg_view``) applied: the kernels read
    the storage through ``data_ptr()``, which holds the values before the negation."""
    return t.resolve_neg().contiguous()


def _common(op: str, tensors: dict, device: str) -> None:
    """Type, layout and device checks of every argument; one device type for all."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise OpInputError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise OpInputError(f"{op}: {name} must be a dense tensor, got {t.layout}")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        found = ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        raise OpInputError(f"{op}: tensors are on different devices ({found})")
    (dev,) = devices
    if dev.type != device:
        raise OpInputError(f"{op}: expected {device} tensors, got {dev}")


def _shapes(op: str, x, params: dict, index) -> None:
    """dtypes and shapes: ``x`` (N, D) of a storage dtype, each of ``params`` (G, D) of
    ``x``'s dtype and of one G, ``index`` (N,) int64/int32."""
    if index.dtype not in INDEX_DTYPES:
        raise OpInputError(f"{op}: index must be int64 or int32, got {index.dtype}")
    if x.dtype not in FLOAT_DTYPES:
        raise OpInputError(f"{op}: x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 2:
        raise OpInputError(f"{op}: x must be (N, D), got {tuple(x.shape)}")
    first = None
    for name, p in params.items():
        if p.dtype != x.dtype:
            raise OpInputError(f"{op}: {name} is {p.dtype} but x is {x.dtype}")
        if first is None:
            if p.dim() != 2 or p.shape[1] != x.shape[1]:
                raise OpInputError(
                    f"{op}: {name} must be (G, D={x.shape[1]}), got {tuple(p.shape)}")
            first = (name, p)
        elif p.shape != first[1].shape:
            raise OpInputError(f"{op}: {name} must be (G, D) = {tuple(first[1].shape)} like "
                               f"{first[0]}, got {tuple(p.shape)}")
    if index.dim() != 1 or index.shape[0] != x.shape[0]:
        raise OpInputError(f"{op}: index must be (N={x.shape[0]},), got {tuple(index.shape)}")


def _index_range(op: str, index, n_rows: int) -> None:
    """Index values in [0, G): reads two scalars back (one synchronisation on a GPU)."""
    if index.numel():
        lo, hi = (int(v) for v in torch.aminmax(index))
        if lo < 0 or hi >= n_rows:
            bad = lo if lo < 0 else hi
            raise OpInputError(f"{op}: index holds {bad}, outside [0, G={n_rows})")


def check_inputs(x, scale, shift, index, *, device: str, check_index: bool = True):
    """Validate the forward's inputs and return them contiguous (lazy negations applied).

    ``x``: (N, D); ``scale``, ``shift``: (G, D); one dtype among bfloat16, float16, float32;
    ``index``: (N,) int64 or int32 in [0, G) (the range check reads two scalars back from the
    device, one synchronisation, unless ``check_index`` is False); all on one ``device``
    type, "cuda" or "cpu". Rejects what eager rejects (a float index, an index outside
    [0, G)) and what the kernels do not take (broadcasting, mixed float dtypes).
    Raises :class:`kernels.errors.OpInputError`.
    """
    _common(OP, {"x": x, "scale": scale, "shift": shift, "index": index}, device)
    _shapes(OP, x, {"scale": scale, "shift": shift}, index)
    if check_index:
        _index_range(OP, index, scale.shape[0])
    return _dense(x), _dense(scale), _dense(shift), index.contiguous()


def check_backward_inputs(grad_out, x, scale, index, *, device: str,
                          check_index: bool = True):
    """Validate the backward's inputs and return them contiguous.

    ``grad_out``: (N, D) of ``x``'s dtype and device; ``x``, ``scale``, ``index`` as in
    :func:`check_inputs`. Raises :class:`kernels.errors.OpInputError`.
    """
    op = f"{OP} backward"
    _common(op, {"grad_out": grad_out, "x": x, "scale": scale, "index": index}, device)
    _shapes(op, x, {"scale": scale}, index)
    if check_index:
        _index_range(op, index, scale.shape[0])
    return check_grad_out(grad_out, x), _dense(x), _dense(scale), index.contiguous()


def check_grad_out(grad_out, x):
    """``grad_out`` checked against an already checked ``x``: a dense tensor of ``x``'s
    device, dtype and (N, D) shape, returned contiguous; else
    :class:`kernels.errors.OpInputError`. (What the autograd Function's backward checks.)"""
    op = f"{OP} backward"
    if not isinstance(grad_out, torch.Tensor):
        raise OpInputError(f"{op}: grad_out must be a torch.Tensor, got "
                           f"{type(grad_out).__name__}")
    if grad_out.layout != torch.strided:
        raise OpInputError(f"{op}: grad_out must be a dense tensor, got {grad_out.layout}")
    if grad_out.device != x.device:
        raise OpInputError(f"{op}: grad_out is on {grad_out.device} but x is on {x.device}")
    if grad_out.dtype != x.dtype:
        raise OpInputError(f"{op}: grad_out is {grad_out.dtype} but x is {x.dtype}")
    if grad_out.shape != x.shape:
        raise OpInputError(f"{op}: grad_out must be (N, D) = {tuple(x.shape)} like x, got "
                           f"{tuple(grad_out.shape)}")
    return _dense(grad_out)
