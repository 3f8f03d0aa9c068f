"""Launches of the RMSNorm kernels on torch CUDA tensors (raw pointers, ``kernels/launch.py``).

Each tensor is described to a kernel as a C-contiguous 2-D array: uint32 words when the
kernel reads 16-byte vectors (:func:`use_vectors`), else the storage elements (bfloat16 as
int16). ``weight`` (D,) is passed as (1, D). The callers check and densify the tensors
(``kernels/rms_norm.py``); nothing here validates them.
"""

from __future__ import annotations

import torch
from numba.cuda import types

from gate_residual_matrix.kernels.launch import Launcher, array_params, array_type
from gate_residual_matrix.kernels.rms_norm_backward import (
    backward_kernel,
    backward_layout,
    n_chunks,
    reduce_kernel,
)
from gate_residual_matrix.kernels.rms_norm_forward import ITEMSIZE, forward_kernel, layout_for
from gate_residual_matrix.kernels.rms_norm_order import Layout
from gate_residual_matrix.kernels.rms_norm_rows import vector_mode

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_ELEMENT_TYPES = {torch.bfloat16: types.int16, torch.float16: types.float16,
                  torch.float32: types.float32}
_INDEX_TYPES = {torch.int64: types.int64, torch.int32: types.int32}
_LAUNCHERS: dict[str, Launcher] = {}
#: Largest grid.x the launches use; kernels loop over rows (or chunks) beyond it.
MAX_GRID = 1 << 20


def use_vectors(layout: Layout, tensors) -> bool:
    """Whether a kernel of ``layout`` for these tensors reads 16-byte vectors (the layout
    allows it and every data pointer is 16-byte aligned)."""
    itemsize = tensors[0].element_size()
    return vector_mode(layout, itemsize) and all(t.data_ptr() % 16 == 0 for t in tensors)


def array_of(t: torch.Tensor, vector: bool, d: int) -> list[int]:
    """Kernel parameters of a contiguous (rows, D) or (D,) tensor as a 2-D array."""
    rows = t.shape[0] if t.dim() == 2 else 1
    size = t.element_size()
    if vector:
        return list(array_params(t.data_ptr(), (rows, d * size // 4), 4))
    return list(array_params(t.data_ptr(), (rows, d), size))


def element_type(dtype: torch.dtype, vector: bool) -> types.Array:
    """numba type of a (rows, D) array argument: uint32 words or storage elements."""
    return array_type(types.uint32 if vector else _ELEMENT_TYPES[dtype], 2)


def launcher(name: str, kernel, argtypes: tuple) -> Launcher:
    """The :class:`Launcher` of one kernel and signature; ``name`` (unique per kernel and
    variant) keys this process's launchers and the on-disk cubin cache."""
    if name not in _LAUNCHERS:
        _LAUNCHERS[name] = Launcher(kernel, argtypes, name=name)
    return _LAUNCHERS[name]


def _index_args(index, flag) -> list[int]:
    return [*array_params(index.data_ptr(), (index.shape[0],), index.element_size()),
            *array_params(flag.data_ptr(), (1,), 1)]


def _tail(index) -> tuple:
    if index is None:
        return ()
    return (array_type(_INDEX_TYPES[index.dtype], 1), array_type(types.uint8, 1))


def launch_forward(op: str, outs, ins, weight, eps: float, index=None, flag=None,
                   params=(), variant: str = "triton") -> None:
    """``op``'s forward: ``outs`` and ``ins`` (N, D), ``weight`` (D,), ``params`` (G, D),
    every tensor contiguous on one CUDA device, in the kernel's argument order."""
    x = ins[0]
    n, d = x.shape
    if n == 0 or d == 0:
        return
    name = DTYPE_NAMES[x.dtype]
    layout = layout_for(op, d, name)
    tensors = (*outs, *ins, weight, *params)
    vector = use_vectors(layout, tensors)
    kernel = forward_kernel(op, d, name, eps, vector, variant)
    argtypes = (element_type(x.dtype, vector),) * len(tensors) + _tail(index)
    key = (f"rms_norm forward {variant} {op} {name} D={d} eps={eps!r} "
           f"{'vec' if vector else 'elem'} {None if index is None else index.dtype}")
    args = [p for t in tensors for p in array_of(t, vector, d)]
    if index is not None:
        args += _index_args(index, flag)
    launcher(key, kernel, argtypes)(x.get_device(), (min(n, MAX_GRID), 1), layout.threads, 0,
                                    args)


def launch_backward(op: str, grad_x, ins, weight, eps: float, n_params: int, index=None,
                    flag=None, params=()) -> torch.Tensor:
    """``op``'s backward: writes ``grad_x`` (N, D) and returns the parameter gradients as
    one (n_params, D) tensor of the storage dtype (row 0 grad_weight, then grad_scale rows,
    then grad_shift rows). ``ins``: the kernel's (N, D) inputs after ``partial`` (grad_out
    first); ``params``: (G, D) tensors; every tensor contiguous on one CUDA device."""
    n, d = grad_x.shape
    name = DTYPE_NAMES[grad_x.dtype]
    grads = torch.empty((n_params, d), dtype=grad_x.dtype, device=grad_x.device)
    if d == 0:
        return grads
    chunks = n_chunks(op, n)
    partial = torch.empty((chunks, n_params, d), dtype=torch.float32, device=grad_x.device)
    device = grad_x.get_device()
    tensors = (grad_x, *ins, weight, *params)
    layout = backward_layout(d, ITEMSIZE[name])
    vector = use_vectors(layout, tensors)
    if chunks:
        kernel = backward_kernel(op, d, name, eps, vector)
        element = element_type(grad_x.dtype, vector)
        argtypes = (element, array_type(types.float32, 3)) + (element,) * (len(tensors) - 1)
        argtypes += _tail(index)
        key = (f"rms_norm backward {op} {name} D={d} eps={eps!r} "
               f"{'vec' if vector else 'elem'} {None if index is None else index.dtype}")
        args = array_of(grad_x, vector, d)
        args += list(array_params(partial.data_ptr(), tuple(partial.shape), 4))
        args += [p for t in tensors[1:] for p in array_of(t, vector, d)]
        if index is not None:
            args += _index_args(index, flag)
        launcher(key, kernel, argtypes)(device, (min(chunks, MAX_GRID), 1), layout.threads, 0,
                                        args)
    reduce = launcher(f"rms_norm reduce {name}", reduce_kernel(name),
                      (element_type(grad_x.dtype, False), array_type(types.float32, 3)))
    total = n_params * d
    reduce(device, (-(-total // 256), 1), 256, 0,
           array_of(grads, False, d) + list(array_params(partial.data_ptr(),
                                                         tuple(partial.shape), 4)))
    return grads


__all__ = ["DTYPE_NAMES", "MAX_GRID", "array_of", "element_type", "launch_backward",
           "launch_forward", "launcher", "use_vectors"]
