"""Launch numba-compiled kernels on raw device pointers, without numba's per-call dispatch.

A numba.cuda dispatcher call types every argument, wraps each tensor in a device array view
(creating a stream object from its ``__cuda_array_interface__``) and builds a launch
configuration: about 0.4 ms of host time per call on the H200's host, measured by
``runner/bench.py`` (``docs/performance.md``), far longer than the kernel at small N.

:class:`Launcher` compiles one signature once with numba and keeps the compiled kernel's
driver handle. A launch packs the kernel's parameters, in numba's array ABI (for each array
``meminfo=0, parent=0, size, itemsize, data pointer, *shape, *strides in bytes``, all 8-byte
integers, as numba's ``_Kernel._prepare_args`` lays them out), into one int64 buffer and
calls ``cuLaunchKernel`` with ``CU_LAUNCH_PARAM_BUFFER_POINTER`` (CUDA driver API,
"Execution Control"). The kernel code and its bits are numba's; only the host path is
shorter. ``GATE_RESIDUAL_LAUNCH=core`` selects ``cuda.core.launch`` (what numba-cuda itself
calls) instead, for comparison.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from numba.cuda import types

_NUMBA_DTYPES = {
    torch.int64: types.int64,
    torch.int32: types.int32,
    torch.int16: types.int16,
    torch.uint8: types.uint8,
    torch.float16: types.float16,
    torch.float32: types.float32,
}

#: cuLaunchKernel ``extra`` keys (cuda.h: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE)
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2

_STREAMS: dict[int, object] = {}


def array_type(dtype: types.Type, ndim: int) -> types.Array:
    """numba type of a C-contiguous array argument: ``array(<dtype>, <ndim>d, C)``."""
    return types.Array(dtype, ndim, "C")


def array_params(ptr: int, shape: tuple[int, ...], itemsize: int) -> list[int]:
    """The kernel parameters of a C-contiguous array at device address ``ptr``, in numba's
    array ABI order: ``0, 0, size, itemsize, ptr, *shape, *strides`` (strides in bytes)."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return [0, 0, step // itemsize, itemsize, ptr, *shape, *reversed(strides)]


def tensor_params(t: torch.Tensor) -> list[int]:
    """:func:`array_params` of a contiguous tensor as it is (its own dtype and shape)."""
    return array_params(t.data_ptr(), tuple(t.shape), t.element_size())


def tensor_type(t: torch.Tensor) -> types.Array:
    """numba type of a contiguous tensor (view bfloat16 as int16 first)."""
    return array_type(_NUMBA_DTYPES[t.dtype], t.dim())


def _stream_handle() -> int:
    return torch.cuda.current_stream().cuda_stream


class Launcher:
    """Launches one numba.cuda dispatcher: ``launcher(argtypes, grid, block, shared, params)``.

    ``argtypes``: a tuple of numba types (``array_type(...)``) fixing the signature; the
    first launch of a signature compiles it (numba caches it for the process). ``params``:
    the flat list of 8-byte kernel parameters (:func:`array_params` per array). ``grid``:
    (x, y); ``block``: threads in x; ``shared``: dynamic shared memory in bytes. Launches
    on torch's current CUDA stream. Raises ``RuntimeError`` naming the CUDA error when the
    driver refuses the launch.
    """

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self._compiled: dict[tuple, object] = {}
        self._use_core = os.environ.get("GATE_RESIDUAL_LAUNCH") == "core"

    def compiled(self, argtypes: tuple):
        """The numba ``_Kernel`` for ``argtypes``, compiled and loaded on first use."""
        kernel = self._compiled.get(argtypes)
        if kernel is None:
            self.dispatcher.compile(argtypes)
            kernel = self.dispatcher.overloads[argtypes]
            kernel.bind()
            self._compiled[argtypes] = kernel
        return kernel

    def __call__(self, argtypes: tuple, grid: tuple, block: int, shared: int,
                 params: list[int]) -> None:
        cufunc = self.compiled(argtypes)._codelibrary.get_cufunc()
        if self._use_core:
            _launch_core(cufunc.kernel, grid, block, shared, params)
        else:
            _launch_driver(cufunc.handle, grid, block, shared, params)


def _launch_driver(handle, grid: tuple, block: int, shared: int, params: list[int]) -> None:
    from cuda.bindings import driver

    stream_handle = _stream_handle()
    stream = _STREAMS.get(stream_handle)
    if stream is None:
        stream = _STREAMS[stream_handle] = driver.CUstream(stream_handle)
    buffer = np.array(params, dtype=np.int64)
    size = np.array([buffer.nbytes], dtype=np.uint64)
    extra = np.array([_PARAM_BUFFER_POINTER, buffer.ctypes.data, _PARAM_BUFFER_SIZE,
                      size.ctypes.data, _PARAM_END], dtype=np.uint64)
    (err,) = driver.cuLaunchKernel(handle, grid[0], grid[1], 1, block, 1, 1, shared, stream,
                                   None, extra.ctypes.data)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernel failed: {err.name}")


def _launch_core(kernel, grid: tuple, block: int, shared: int, params: list[int]) -> None:
    from cuda.core import LaunchConfig, launch
    from numba import cuda

    handle = _stream_handle()
    stream = _STREAMS.get(-handle - 1)
    if stream is None:
        stream = _STREAMS[-handle - 1] = (cuda.external_stream(handle) if handle
                                          else cuda.default_stream())
    launch(stream, LaunchConfig(grid=grid, block=block, shmem_size=shared), kernel, *params)
