"""RMSNorm ops on the GPU with numba.cuda: forward entry points whose bits are the rollout
engines' batch-invariant kernels, a batch-invariant backward, and autograd Functions.

* ``rms_norm(x, weight)``: ``x * rsqrt(mean(x^2) + eps) * weight`` for ``x`` (N, D) and
  ``weight`` (D,), bitwise equal to vLLM's ``rms_norm_batch_invariant`` (its Triton
  ``_rms_norm_kernel``) for D a multiple of 16;
* ``add_rms_norm(x, residual, weight)``: ``h = round(x + residual)`` then ``rms_norm(h)``
  (vLLM's batch-invariant order on ``h``); returns ``(out, h)``. vLLM itself routes the
  residual case to its CUDA ``fused_add_rms_norm``, whose launch changes with the number of
  tokens, so it is not the reference here;
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
from numba.cuda import types

from kernels.index_check import assert_index, device_flag, index_mode
from kernels.launch import Launcher, array_params, array_type
from kernels.rms_norm_checks import check_index_range, check_tensors, dense
from kernels.rms_norm_forward import ITEMSIZE, forward_kernel, layout_for
from kernels.rms_norm_order import EPS
from kernels.rms_norm_rows import vector_mode

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_ELEMENT_TYPES = {torch.bfloat16: types.int16, torch.float16: types.float16,
                  torch.float32: types.float32}
_INDEX_TYPES = {torch.int64: types.int64, torch.int32: types.int32}
_LAUNCHERS: dict[tuple, Launcher] = {}
#: Largest grid.x the launches use; kernels loop over rows beyond it.
MAX_GRID = 1 << 20


def use_vectors(op: str, tensors, d: int, dtype: torch.dtype) -> bool:
    """Whether ``op``'s kernel for these tensors reads 16-byte vectors (the layout allows it
    and every data pointer is 16-byte aligned)."""
    name = DTYPE_NAMES[dtype]
    return vector_mode(layout_for(op, d, name), ITEMSIZE[name]) and all(
        t.data_ptr() % 16 == 0 for t in tensors)


def array_of(t: torch.Tensor, vector: bool, d: int) -> list[int]:
    """Kernel parameters of a contiguous (rows, D) or (D,) tensor: a 2-D uint32 word view
    (``vector``) or a 2-D element view."""
    rows = t.shape[0] if t.dim() == 2 else 1
    size = t.element_size()
    if vector:
        return list(array_params(t.data_ptr(), (rows, d * size // 4), 4))
    return list(array_params(t.data_ptr(), (rows, d), size))


def launcher(kind: str, kernel, op: str, dtype: torch.dtype, d: int, eps: float, vector: bool,
             n_arrays: int, index_dtype: torch.dtype | None = None,
             tail: tuple = ()) -> Launcher:
    """The :class:`Launcher` of one kernel: ``n_arrays`` 2-D arrays (uint32 words or
    elements), then an index array and a flag when ``index_dtype`` is given, then ``tail``
    (extra numba types)."""
    key = (kind, op, dtype, d, float(eps), vector, n_arrays, index_dtype, tail)
    if key not in _LAUNCHERS:
        element = array_type(types.uint32 if vector else _ELEMENT_TYPES[dtype], 2)
        argtypes = (element,) * n_arrays
        if index_dtype is not None:
            argtypes += (array_type(_INDEX_TYPES[index_dtype], 1), array_type(types.uint8, 1))
        argtypes += tail
        name = (f"rms_norm {kind} {op} {DTYPE_NAMES[dtype]} D={d} eps={float(eps)!r} "
                f"{'vec' if vector else 'elem'} {index_dtype} {tail}")
        _LAUNCHERS[key] = Launcher(kernel, argtypes, name=name)
    return _LAUNCHERS[key]


def _forward(op: str, outs, ins, weight, eps, index=None, flag=None, params=(),
             variant: str = "triton"):
    """Launch ``op``'s forward: ``outs`` and ``ins`` (N, D), ``weight`` (D,), ``params``
    (G, D); every tensor contiguous, on one CUDA device."""
    x = ins[0]
    n, d = x.shape
    if n == 0 or d == 0:
        return
    tensors = (*outs, *ins, weight, *params)
    vector = use_vectors(op, tensors, d, x.dtype)
    kernel = forward_kernel(op, d, DTYPE_NAMES[x.dtype], eps, vector, variant)
    run = launcher(f"forward {variant}", kernel, op, x.dtype, d, eps, vector, len(tensors),
                   None if index is None else index.dtype)
    args = [p for t in tensors for p in array_of(t, vector, d)]
    if index is not None:
        args += list(array_params(index.data_ptr(), (n,), index.element_size()))
        args += list(array_params(flag.data_ptr(), (1,), 1))
    run(x.get_device(), (min(n, MAX_GRID), 1), layout_for(op, d, DTYPE_NAMES[x.dtype]).threads,
        0, args)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` in vLLM's batch-invariant order.

    ``x``: (N, D) CUDA tensor; ``weight``: (D,), same dtype (bfloat16, float16, float32).
    Returns a new (N, D) tensor. Raises :class:`kernels.errors.OpInputError`.
    """
    check_tensors("rms_norm", "cuda", {"x": x}, {"weight": (weight, ("D",))})
    x, weight = dense(x), dense(weight)
    out = torch.empty_like(x)
    _forward("rms_norm", (out,), (x,), weight, eps)
    return out


def add_rms_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, h)``: ``h = round(x + residual)``, ``out = rms_norm(h, weight)``.

    ``x``, ``residual``: (N, D) CUDA tensors; ``weight``: (D,); one dtype. Raises
    :class:`kernels.errors.OpInputError`.
    """
    check_tensors("add_rms_norm", "cuda", {"x": x, "residual": residual},
                  {"weight": (weight, ("D",))})
    x, residual, weight = dense(x), dense(residual), dense(weight)
    out, h = torch.empty_like(x), torch.empty_like(x)
    _forward("add_rms_norm", (out, h), (x, residual), weight, eps)
    return out, h


def rms_norm_scale_shift_forward(x, weight, scale, shift, index, eps: float = EPS, *,
                                 check_index: bool | str = True) -> torch.Tensor:
    """``RMSNorm(x) * weight * (1 + scale[index]) + shift[index]`` in vllm-omni's order.

    ``x``: (N, D); ``weight``: (D,); ``scale``, ``shift``: (G, D); one dtype; ``index``:
    (N,) int64/int32 in [0, G). ``check_index``: ``True`` checks on the device without
    synchronising (a bad index fails at the next synchronisation), ``"sync"`` raises at once,
    ``False`` gives NaN rows. Raises :class:`kernels.errors.OpInputError`.
    """
    op = "rms_norm_scale_shift"
    check_index = index_mode(op, check_index)
    check_tensors(op, "cuda", {"x": x}, {"weight": (weight, ("D",)),
                                         "scale": (scale, ("G", "D")),
                                         "shift": (shift, ("G", "D"))}, index)
    if check_index == "sync":
        check_index_range(op, index, scale.shape[0])
    x, weight, scale, shift, index = (dense(t) for t in (x, weight, scale, shift, index))
    out = torch.empty_like(x)
    _forward(op, (out,), (x,), weight, eps, index, device_flag(x.device, check_index),
             (scale, shift))
    assert_index(op, x.device, check_index)
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
        _forward(op, (out, h), (x, dense(residual)), weight, eps, variant=variant)
        return out, h
    if op == "rms_norm_scale_shift":
        _forward(op, (out,), (x,), weight, eps, dense(index), device_flag(x.device, False),
                 (dense(scale), dense(shift)), variant=variant)
        return out
    _forward(op, (out,), (x,), weight, eps, variant=variant)
    return out


__all__ = ["DTYPE_NAMES", "MAX_GRID", "add_rms_norm_forward", "array_of", "forward_variant",
           "launcher", "rms_norm_forward", "rms_norm_scale_shift_forward", "use_vectors"]
