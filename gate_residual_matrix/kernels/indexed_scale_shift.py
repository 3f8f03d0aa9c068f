"""indexed_scale_shift on the GPU with numba.cuda: kernels, launchers, autograd Function.

    out = x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)

MiniMax-H3 DiT's AdaLN modulation. Shapes: ``x``, ``out``: (N, D); ``scale``,
``shift``: (G, D); ``index``: (N,) int64 or int32 in [0, G). Storage dtypes: bfloat16,
float16, float32 (one for all three). Backward, for upstream ``grad_out`` (N, D), with
``t = 1 + scale[index]``: ``grad_x = grad_out * t``; ``grad_scale[k] = sum over rows i with
index[i] == k of grad_out[i] * x[i]``; ``grad_shift[k] = sum over the same rows of
grad_out[i]``.

Bits (``kernels/rounding.py``; the CPU twin is ``kernels/indexed_scale_shift_cpu.py``):

* forward and ``grad_x`` follow eager PyTorch, which runs three elementwise ops (and autograd
  one, ``MulBackward0``: ``grad * other``, with ``other`` the saved ``t``), each computed in
  float32 and rounded once to the storage dtype: ``t = rnd(1 + s)``, ``p = rnd(x * t)``,
  ``out = rnd(p + h)``, ``grad_x = rnd(grad_out * t)``. Source: PyTorch computes reduced
  floating types in ``at::opmath_type`` (float) and converts each op's result back; on the CPU
  (torch 2.13, AVX512) ``test_scale_shift_eager_rounds_each_op_once_in_float32`` in
  ``tests/test_kernels_cpu.py`` checks this over all 65536 bfloat16/float16 values of
  ``scale`` and random ``x``/``shift`` bits; the GPU tests check it against eager CUDA. No
  FMA contraction: every multiply and add is ``mul.rn.f32`` / ``add.rn.f32``
  (``tests/test_contraction.py``).
* ``grad_scale`` and ``grad_shift`` are float32 sums in the fixed order of
  :data:`SUMMATION_ORDER` (it depends only on N and :data:`CHUNK_ROWS`, never on the GPU, the
  launch shape or timing; no atomics), rounded once. They are deterministic and carry the same
  bits on the GPU and the CPU twin, NaN included; they are not eager's bits (eager rounds each
  ``grad_out * x`` to the storage dtype and adds in ``index_add_``'s order), as for
  gate_residual's ``grad_gate``.

Example::

    >>> out = indexed_scale_shift(x, scale, shift, index)           # doctest: +SKIP
    >>> out.backward(grad_out)                                      # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch
from numba import cuda, float32
from numba.cuda import types

from gate_residual_matrix.kernels.chunk_sums import accumulator_slots, bad_index_value, chunk_count
from gate_residual_matrix.kernels.geometry import (
    BLOCK_COLS,
    MAX_GRID_Y,
    backward_geometry,
    forward_geometry,
    reduce_geometry,
    shared_fits,
)
from gate_residual_matrix.kernels.index_check import assert_index, device_flag, flags, index_mode
from gate_residual_matrix.kernels.indexed_scale_shift_checks import (
    OP,
    check_backward_inputs,
    check_grad_out,
    check_inputs,
)
from gate_residual_matrix.kernels.launch import Launcher, array_params, array_type
from gate_residual_matrix.kernels.rounding import CODECS, add_rn, mul_rn

#: Rows per chunk of the grad_scale / grad_shift reduction. Part of the algorithm (it fixes
#: the summation order), not a launch parameter.
CHUNK_ROWS = 128

SUMMATION_ORDER = (
    "grad_scale[k, d] and grad_shift[k, d]: rows are split into consecutive chunks of "
    "CHUNK_ROWS=128; within a chunk, a = +0.0 and b = +0.0, then for rows i with index[i] == k "
    "in increasing i: a = fadd_rn(a, fmul_rn(grad_out[i, d], x[i, d])), "
    "b = fadd_rn(b, grad_out[i, d]); then A = +0.0, B = +0.0 and A = fadd_rn(A, a_c), "
    "B = fadd_rn(B, b_c) over chunks c in increasing c; float32 throughout; A -> grad_scale "
    "and B -> grad_shift, each rounded once to the storage dtype."
)

_ONE = np.float32(1.0)


def _make_backward(load, store, in_shared: bool):
    """The chunked backward: ``grad_x`` and, per chunk, the float32 partial sums. Its 2G
    accumulators per column (scale rows 0..G-1, shift rows G..2G-1) live in shared memory
    (``in_shared``) or in ``partial`` itself (G too large for shared memory):
    :func:`kernels.chunk_sums.accumulator_slots`. Same operations in the same order either
    way: the same bits."""
    accumulators, slot, flush = accumulator_slots(in_shared)

    @cuda.jit
    def backward_chunks(grad_x, partial, grad_out, x, scale, index, flag):
        # grid: x over column blocks, y over chunks of CHUNK_ROWS rows (strided)
        acc = accumulators(partial)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        col = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = scale.shape[0]
        if col >= grad_out.shape[1]:
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            for r in range(2 * n_gate):
                acc[slot(chunk, r, col, tx, width)] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            for i in range(start, stop):
                k = index[i]
                if k < 0 or k >= n_gate:
                    flag[0] = np.uint8(0)
                    grad_x[i, col] = store(bad_index_value())
                    continue
                go = load(grad_out[i, col])
                t = load(store(add_rn(_ONE, load(scale[k, col]))))
                grad_x[i, col] = store(mul_rn(go, t))
                a = slot(chunk, k, col, tx, width)
                acc[a] = add_rn(acc[a], mul_rn(go, load(x[i, col])))
                b = slot(chunk, n_gate + k, col, tx, width)
                acc[b] = add_rn(acc[b], go)
            flush(partial, acc, chunk, 2 * n_gate, col, tx, width)
            chunk += cuda.gridDim.y

    return backward_chunks


def _make_kernels(load, store):
    """The element kernels for one storage dtype's ``load``/``store`` device functions:
    (forward, backward_chunks, reduce_chunks, backward_chunks_global)."""

    @cuda.jit
    def forward(out, x, scale, shift, index, flag):
        # grid: x over column blocks, y over rows (strided when N > MAX_GRID_Y); ``flag``
        # (uint8, 1 element) is set to 0 on an index outside [0, G), whose row is NaN
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col >= out.shape[1]:
            return
        row = cuda.blockIdx.y
        while row < out.shape[0]:
            k = index[row]
            if k < 0 or k >= scale.shape[0]:
                flag[0] = np.uint8(0)
                out[row, col] = store(bad_index_value())
            else:
                t = load(store(add_rn(_ONE, load(scale[k, col]))))
                product = load(store(mul_rn(load(x[row, col]), t)))
                out[row, col] = store(add_rn(product, load(shift[k, col])))
            row += cuda.gridDim.y

    @cuda.jit
    def reduce_chunks(grad_scale, grad_shift, partial):
        # one thread per element of the (2G, D) sums: rows 0..G-1 -> grad_scale, G..2G-1 ->
        # grad_shift; chunks summed in increasing order
        flat = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n_gate = grad_scale.shape[0]
        width = grad_scale.shape[1]
        if flat >= 2 * n_gate * width:
            return
        r = flat // width
        col = flat - r * width
        total = float32(0.0)
        for c in range(partial.shape[0]):
            total = add_rn(total, partial[c, r, col])
        if r < n_gate:
            grad_scale[r, col] = store(total)
        else:
            grad_shift[r - n_gate, col] = store(total)

    return (forward, _make_backward(load, store, in_shared=True), reduce_chunks,
            _make_backward(load, store, in_shared=False))


_KERNELS: dict[str, tuple] = {}


def kernels_for(dtype: str):
    """The (forward, backward_chunks, reduce_chunks, backward_chunks_global) numba.cuda kernels
    of a storage dtype ("bfloat16", "float16" or "float32"; bfloat16 arrays hold int16 bits),
    built once per process. Raises ``KeyError`` for any other dtype."""
    if dtype not in _KERNELS:
        load, store, _ = CODECS[dtype]
        _KERNELS[dtype] = _make_kernels(load, store)
    return _KERNELS[dtype]


def n_chunks(n_rows: int) -> int:
    """Number of CHUNK_ROWS-row chunks the parameter-gradient sums split N rows into."""
    return chunk_count(n_rows, CHUNK_ROWS)


# ------------------------------------------------ launches on numba/numpy arrays (simulator)


def launch_forward(out, x, scale, shift, index, dtype: str, stream=0, *, flag=None,
                   block_cols: int = BLOCK_COLS, max_grid_y: int = MAX_GRID_Y) -> None:
    """Forward on element arrays (bfloat16 as int16 bits); ``flag``: uint8 (1,), cleared on an
    index outside [0, G). ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_geometry(*out.shape, block_cols, max_grid_y)
    flag = np.ones(1, dtype=np.uint8) if flag is None else flag
    kernels_for(dtype)[0][grid, block, stream](out, x, scale, shift, index, flag)


def launch_backward(grad_x, grad_scale, grad_shift, partial, grad_out, x, scale, index,
                    dtype: str, stream=0, *, flag=None, block_cols: int | None = None,
                    max_grid_y: int = MAX_GRID_Y) -> None:
    """Backward on element arrays: writes ``grad_x`` (N, D), ``grad_scale`` and ``grad_shift``
    (G, D) in full (+0.0 where no row selects a parameter row); ``partial`` is float32 scratch
    (n_chunks(N), 2G, D)."""
    if grad_out.shape[1] == 0 or scale.shape[0] == 0:
        return
    _, shared_kernel, reduce_chunks, global_kernel = kernels_for(dtype)
    flag = np.ones(1, dtype=np.uint8) if flag is None else flag
    args = (grad_x, partial, grad_out, x, scale, index, flag)
    if partial.shape[0] and shared_fits(2 * scale.shape[0]):
        grid, block, shared = backward_geometry(partial.shape[0], grad_out.shape[1],
                                                2 * scale.shape[0], block_cols, max_grid_y)
        shared_kernel[grid, block, stream, shared](*args)
    elif partial.shape[0]:
        grid, block = forward_geometry(partial.shape[0], grad_out.shape[1],
                                       block_cols or BLOCK_COLS, max_grid_y)
        global_kernel[grid, block, stream](*args)
    grid, block = reduce_geometry(2 * grad_scale.size)
    reduce_chunks[grid, block, stream](grad_scale, grad_shift, partial)


# --------------------------------------------------------------------------- torch entry points
# Launches on raw pointers (kernels/launch.py): each tensor is described to the kernel as a
# C-contiguous array of the kernel's element type (int16 for bfloat16), without torch views.

_ELEMENT_TYPES = {torch.bfloat16: types.int16, torch.float16: types.float16,
                  torch.float32: types.float32}
_INDEX_TYPES = {torch.int64: types.int64, torch.int32: types.int32}
_LAUNCHERS: dict[tuple, Launcher] = {}


def _launcher(which: int, dtype: torch.dtype, index_dtype: torch.dtype) -> Launcher:
    """Launcher of kernel ``which`` of :func:`kernels_for` for one signature."""
    key = (which, dtype, index_dtype)
    if key not in _LAUNCHERS:
        e = array_type(_ELEMENT_TYPES[dtype], 2)
        tail = (array_type(_INDEX_TYPES[index_dtype], 1), array_type(types.uint8, 1))
        f32 = array_type(types.float32, 3)
        argtypes = {0: (e, e, e, e, *tail), 2: (e, e, f32)}.get(which, (e, f32, e, e, e, *tail))
        name = str(dtype).removeprefix("torch.")
        _LAUNCHERS[key] = Launcher(kernels_for(name)[which], argtypes,
                                   name=f"indexed_scale_shift {which} {name} {index_dtype}")
    return _LAUNCHERS[key]


def _params(*tensors) -> list[int]:
    return [p for t in tensors for p in array_params(t.data_ptr(), tuple(t.shape),
                                                     t.element_size())]


def _forward(x, scale, shift, index, flag) -> torch.Tensor:
    """The forward on checked, contiguous CUDA tensors of one device."""
    out = torch.empty_like(x)
    if out.numel():
        grid, block = forward_geometry(*out.shape)
        _launcher(0, x.dtype, index.dtype)(out.get_device(), grid, block, 0,
                                           _params(out, x, scale, shift, index, flag))
    return out


def _backward(grad_out, x, scale, index, flag):
    """(grad_x, grad_scale, grad_shift) on checked, contiguous CUDA tensors of one device."""
    (n_rows, width), n_gate = grad_out.shape, scale.shape[0]
    grad_x = torch.empty_like(grad_out)
    grad_scale, grad_shift = torch.empty_like(scale), torch.empty_like(scale)
    if width == 0 or n_gate == 0:
        return grad_x, grad_scale, grad_shift
    chunks = n_chunks(n_rows)
    partial = torch.empty((chunks, 2 * n_gate, width), dtype=torch.float32, device=x.device)
    device = grad_out.get_device()
    if chunks:
        if shared_fits(2 * n_gate):
            grid, block, shared = backward_geometry(chunks, width, 2 * n_gate)
            launcher = _launcher(1, x.dtype, index.dtype)
        else:  # accumulators in global memory (same order, same bits)
            (grid, block), shared = forward_geometry(chunks, width), 0
            launcher = _launcher(3, x.dtype, index.dtype)
        launcher(device, grid, block, shared,
                 _params(grad_x, partial, grad_out, x, scale, index, flag))
    grid, block = reduce_geometry(2 * n_gate * width)
    _launcher(2, x.dtype, index.dtype)(device, (grid, 1), block, 0,
                                       _params(grad_scale, grad_shift, partial))
    return grad_x, grad_scale, grad_shift


def indexed_scale_shift_forward(x, scale, shift, index, *, check_index: bool | str = True):
    """``x * (1 + scale.index_select(0, index)) + shift.index_select(0, index)`` on CUDA
    tensors with the numba.cuda forward kernel; bitwise equal to eager.

    Args: ``x`` (N, D); ``scale``, ``shift`` (G, D), of ``x``'s dtype (bfloat16, float16 or
    float32); ``index`` (N,) int64 or int32 in [0, G). Non-contiguous inputs are made
    contiguous. Returns a new (N, D) tensor. Raises :class:`kernels.errors.OpInputError`.
    ``check_index``: ``True`` (default) checks on the device without synchronising (a bad
    index fails at the next synchronisation, like eager's device-side assert); ``"sync"``
    raises at once (one synchronisation); ``False`` gives NaN rows for bad indices.
    """
    check_index = index_mode(OP, check_index)
    x, scale, shift, index = check_inputs(x, scale, shift, index, device="cuda",
                                          check_index=check_index == "sync")
    out = _forward(x, scale, shift, index, device_flag(x.device, check_index))
    assert_index(OP, x.device, check_index)
    return out


def indexed_scale_shift_backward(grad_out, x, scale, index, *,
                                 check_index: bool | str = True):
    """(grad_x, grad_scale, grad_shift) for upstream ``grad_out`` (N, D), numba.cuda kernels.

    ``grad_x`` (N, D) is bitwise equal to eager's; ``grad_scale`` and ``grad_shift`` (G, D)
    are float32 sums in :data:`SUMMATION_ORDER`, rounded once (+0.0 for rows no index
    selects). Scratch: one float32 buffer of n_chunks(N) * 2G * D elements. Arguments,
    ``check_index`` and errors as in :func:`indexed_scale_shift_forward`.
    """
    check_index = index_mode(OP, check_index)
    grad_out, x, scale, index = check_backward_inputs(grad_out, x, scale, index, device="cuda",
                                                      check_index=check_index == "sync")
    grads = _backward(grad_out, x, scale, index, device_flag(x.device, check_index))
    assert_index(OP, x.device, check_index)
    return grads


class IndexedScaleShift(torch.autograd.Function):
    """Autograd Function with the numba.cuda kernels:
    ``IndexedScaleShift.apply(x, scale, shift, index, check_index=True)`` -> out (N, D).
    Gradients flow to ``x``, ``scale`` and ``shift``; ``index`` has none."""

    @staticmethod
    def forward(ctx, x, scale, shift, index, check_index=True):
        check_index = index_mode(OP, check_index)
        x, scale, shift, index = check_inputs(x, scale, shift, index, device="cuda",
                                              check_index=check_index == "sync")
        ctx.save_for_backward(x, scale, index)
        out = _forward(x, scale, shift, index, device_flag(x.device, check_index))
        assert_index(OP, x.device, check_index)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, scale, index = ctx.saved_tensors
        grad_out = check_grad_out(grad_out, x)
        # the forward checked the index (or was told not to): the sink flag, no check
        grad_x, grad_scale, grad_shift = _backward(grad_out, x, scale, index,
                                                   flags(x.device)[1])
        return grad_x, grad_scale, grad_shift, None, None


def indexed_scale_shift(x, scale, shift, index, *, check_index: bool | str = True):
    """Differentiable ``x * (1 + scale[index]) + shift[index]`` (numba.cuda kernels).

    Same arguments, result and errors as :func:`indexed_scale_shift_forward`. Example:
    ``out = indexed_scale_shift(x, scale, shift, idx); out.backward(grad)``.
    """
    return IndexedScaleShift.apply(x, scale, shift, index, check_index)


__all__ = ["CHUNK_ROWS", "SUMMATION_ORDER", "IndexedScaleShift", "indexed_scale_shift",
           "indexed_scale_shift_backward", "indexed_scale_shift_forward", "kernels_for",
           "launch_backward", "launch_forward", "n_chunks"]
