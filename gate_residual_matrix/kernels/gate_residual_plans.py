"""How gate_residual's entry points launch its kernels: plans of packed launches.

A plan holds, for one key (shapes, dtypes, devices and index mode of a call's tensors), the
kernels' :class:`kernels.launch.PackedLaunch` objects with every parameter but the data
pointers packed, built once; ``run`` then allocates the outputs, reads the data pointers and
the current stream and launches. :class:`_ForwardPlan`: the vector forward (16-byte aligned
rows) or the element forward. The backward's plans (one fused launch, or the chunk kernel
and the reduction) are in :mod:`kernels.gate_residual_backward_plan`; both kinds are kept
here, per thread (:data:`_FORWARD_PLANS`, :data:`_BACKWARD_PLANS`). Kernels:
:mod:`kernels.gate_residual_kernels`, :mod:`kernels.gate_residual_vec`.
"""

from __future__ import annotations

import torch
from numba.cuda import types

from gate_residual_matrix.kernels.device_assert import FLAG_ASSERT, FLAG_CLEAN
from gate_residual_matrix.kernels.gate_residual_kernels import (
    FORWARD_MAX_GRID_Y,
    forward_vec_geometry,
    kernels_for,
    vec_kernels_for,
)
from gate_residual_matrix.kernels.geometry import forward_geometry
from gate_residual_matrix.kernels.launch import Launcher, PackedLaunch, PlanCache, array_type

# The entry points launch on raw pointers (kernels/launch.py): a tensor is described to the
# kernel as a C-contiguous array of the type the kernel takes (uint32 words for the
# vectorised kernels, int16 for bfloat16 elements), without creating torch views.
#
# Host path of one call (docs/performance.md "Host overhead"): the inputs' shapes,
# dtypes and devices form a key; a key seen before, with inputs dense now, finds its plan
# (the launches with their parameters packed, built when the full checks of
# kernels/checks.py first passed for that key), so a call does: the key and density checks,
# the output's allocation, the data pointers and one cuLaunchKernelEx. Anything else (a new
# key, a non-contiguous or lazily negated input, check_index="sync" or a bad value) takes
# the full path: kernels/checks.py (one-line OpInputError), dense copies, then the plan.
# The index range is checked in the kernels (kernels/device_assert.py).

_ELEMENT_TYPES = {torch.bfloat16: types.int16, torch.float16: types.float16,
                  torch.float32: types.float32}
_INDEX_TYPES = {torch.int64: types.int64, torch.int32: types.int32}
_U32_2D = array_type(types.uint32, 2)
_U32_1D = array_type(types.uint32, 1)
_FLAG_TYPE = array_type(types.uint8, 1)
_F32_3D = array_type(types.float32, 3)
_LAUNCHERS: dict[tuple, Launcher] = {}
#: per device index: (the flag of checked calls, FLAG_ASSERT; the sink of unchecked ones)
_FLAGS: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
#: forward plans by (shapes, dtypes, devices, index mode) of (residual, gate, y, index)
_FORWARD_PLANS = PlanCache()
#: backward plans by the same key of (grad_out, gate, y, index)
_BACKWARD_PLANS = PlanCache()

if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _raw_stream = torch._C._cuda_getCurrentRawStream
    _capturing = torch._C._cuda_isCurrentStreamCapturing
else:  # a CPU build of torch: no CUDA launch can happen (the checks refuse CPU tensors)
    def _raw_stream(device: int) -> int:
        raise RuntimeError("torch has no CUDA")

    def _capturing() -> bool:
        return False


def _launcher(kind: str, which: int, dtype: torch.dtype, index_dtype: torch.dtype) -> Launcher:
    """The launcher of one kernel and signature. ``kind``: "vec" or "elements"; ``which``:
    0 forward, 1 backward_chunks, 2 reduce_chunks (elements) or backward_fused (vec),
    3 backward_chunks_global (elements only)."""
    key = (kind, which, dtype, index_dtype)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        name = str(dtype).removeprefix("torch.")
        element = array_type(_ELEMENT_TYPES[dtype], 2)
        index = array_type(_INDEX_TYPES[index_dtype], 1)
        if kind == "vec":
            kernel = vec_kernels_for(name)[which]
            argtypes = ((_U32_2D,) * 4 + (index, _FLAG_TYPE) if which == 0 else
                        (_U32_2D, _F32_3D, _U32_2D, _U32_2D, _U32_2D, index, _FLAG_TYPE)
                        if which == 1 else  # 2: backward_fused
                        (_U32_2D, _U32_2D, _U32_2D, _U32_1D, _U32_2D, _U32_2D, _U32_2D, index,
                         _FLAG_TYPE))
        else:
            kernel = kernels_for(name)[which]
            argtypes = ((element,) * 4 + (index, _FLAG_TYPE) if which == 0 else
                        (element, _F32_3D) if which == 2 else
                        (element, _F32_3D, element, element, element, index, _FLAG_TYPE))
        launcher = _LAUNCHERS[key] = Launcher(
            kernel, argtypes, name=f"gate_residual {kind} {which} {name} {index_dtype}")
    return launcher


def _flags(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(checked flag, sink flag) of a CUDA device: uint8 tensors of one element holding
    FLAG_ASSERT (a bad index fails the launch) and FLAG_CLEAN (a bad index writes FLAG_BAD
    into it, and nobody reads it). kernels/device_assert.py."""
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if device.type == "cuda" else -1
    flags = _FLAGS.get(index)
    if flags is None:
        flags = _FLAGS[index] = (torch.full((1,), FLAG_ASSERT, dtype=torch.uint8, device=device),
                                 torch.full((1,), FLAG_CLEAN, dtype=torch.uint8, device=device))
    return flags


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _vec_ok(*tensors) -> bool:
    """Whether the 16-byte vector kernels apply: rows of whole vectors, 16-byte aligned."""
    t = tensors[0]
    return (t.shape[-1] * t.element_size()) % 16 == 0 and all(
        x.data_ptr() % 16 == 0 for x in tensors)


# numba's array ABI for C-contiguous arrays (what numba-cuda's _Kernel._prepare_args passes), for
# the ranks used here: 0, 0, size, itemsize, pointer, *shape, *strides in bytes. ``ptr=None``
# leaves the slot a PackedLaunch call fills.

def _p1(ptr: int | None, n: int, itemsize: int) -> tuple:
    return 0, 0, n, itemsize, ptr, n, itemsize


def _p2(ptr: int | None, rows: int, cols: int, itemsize: int) -> tuple:
    return 0, 0, rows * cols, itemsize, ptr, rows, cols, cols * itemsize, itemsize


def _p3(ptr: int | None, a: int, b: int, c: int) -> tuple:  # float32
    return 0, 0, a * b * c, 4, ptr, a, b, c, 4 * b * c, 4 * c, 4


def _forward_params(n_rows: int, width: int, n_gate: int, itemsize: int, index_size: int,
                    flag: int | None, vec: bool, ptrs=(None,) * 5) -> list:
    """Parameters of the forward kernel (vector or element): out, residual, gate, y (their
    pointers ``ptrs[:4]``), index (``ptrs[4]``), flag."""
    o, r, g, y, i = ptrs
    if vec:
        cols, itemsize = width * itemsize // 4, 4
    else:
        cols = width
    return [*_p2(o, n_rows, cols, itemsize), *_p2(r, n_rows, cols, itemsize),
            *_p2(g, n_gate, cols, itemsize), *_p2(y, n_rows, cols, itemsize),
            *_p1(i, n_rows, index_size), *_p1(flag, 1, 1)]


def _launch_forward(out, residual, gate, y, index, flag, *,
                    max_grid_y: int = FORWARD_MAX_GRID_Y) -> None:
    """Launch the forward on contiguous CUDA tensors of one device (no checks, no plan): the
    vectorised kernel when :func:`_vec_ok`, else the element kernel. ``max_grid_y`` changes
    the launch shape only (the bits do not move: tests/test_kernels_gpu_launch.py)."""
    n_rows, width = out.shape
    vec = _vec_ok(out, residual, gate, y)
    if vec:
        grid, block = forward_vec_geometry(n_rows, width * out.element_size() // 16,
                                           max_grid_y=max_grid_y)
    else:
        grid, block = forward_geometry(n_rows, width)
    params = _forward_params(n_rows, width, gate.shape[0], out.element_size(),
                             index.element_size(), flag.data_ptr(), vec,
                             tuple(t.data_ptr() for t in (out, residual, gate, y, index)))
    launcher = _launcher("vec" if vec else "elements", 0, out.dtype, index.dtype)
    launcher(out.get_device(), grid, block, 0, params)


class _ForwardPlan:
    """The forward launches of one key: the vector kernel (None where rows are not whole
    16-byte vectors) and the element kernel (made on the first unaligned call); ``backward``:
    the autograd backward's plan (sink flag), made on first use. ``empty``: N or D is 0."""

    __slots__ = (
        "_args",
        "_elements",
        "backward",
        "device",
        "device_obj",
        "dtype",
        "empty",
        "shape",
        "vec",
    )

    def __init__(self, residual, gate, index, mode: int) -> None:
        n_rows, width = residual.shape
        self.device = residual.get_device()
        self.shape, self.dtype, self.device_obj = residual.shape, residual.dtype, residual.device
        self.empty = n_rows == 0 or width == 0
        itemsize = residual.element_size()
        checked, sink = _flags(residual.device)
        flag = (checked if mode == FLAG_ASSERT else sink).data_ptr()
        self._args = (n_rows, width, gate.shape[0], itemsize, index.element_size(), flag,
                      residual.dtype, index.dtype)
        self.vec = self._elements = self.backward = None
        if not self.empty and (width * itemsize) % 16 == 0:
            grid, block = forward_vec_geometry(n_rows, width * itemsize // 16)
            self.vec = _launcher("vec", 0, residual.dtype, index.dtype).packed(
                self.device, grid, block, 0, _forward_params(*self._args[:6], vec=True))

    def elements(self) -> PackedLaunch:
        """The element-kernel launch (inputs not 16-byte aligned, or D * itemsize % 16)."""
        if self._elements is None:
            n_rows, width, *_, dtype, index_dtype = self._args
            grid, block = forward_geometry(n_rows, width)
            self._elements = _launcher("elements", 0, dtype, index_dtype).packed(
                self.device, grid, block, 0, _forward_params(*self._args[:6], vec=False))
        return self._elements

    def run(self, residual, gate, y, index) -> torch.Tensor:
        """``out`` for dense inputs of this plan's key."""
        out = torch.empty_like(residual)
        if self.empty:
            return out
        o, r, g, yp = out.data_ptr(), residual.data_ptr(), gate.data_ptr(), y.data_ptr()
        launch = self.vec
        if launch is None or (o | r | g | yp) & 15:
            launch = self.elements()
        launch.fast(_raw_stream(self.device), o, r, g, yp, index.data_ptr())
        return out
