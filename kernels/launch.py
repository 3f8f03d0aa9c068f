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

import array
import ctypes
import math
import os
import time

import torch
from numba.cuda import types

#: cuLaunchKernel ``extra`` keys (cuda.h: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE)
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2

_STREAMS: dict[int, object] = {}

#: Seconds this process spent compiling and loading kernels in :meth:`Launcher.compiled`
#: (numba's typing, LLVM, NVVM/ptxas and the module load), summed; the runner reports it as
#: part of a cell's compilation time.
COMPILE_SECONDS = [0.0]


def array_type(dtype: types.Type, ndim: int) -> types.Array:
    """numba type of a C-contiguous array argument: ``array(<dtype>, <ndim>d, C)``."""
    return types.Array(dtype, ndim, "C")


def array_params(ptr: int, shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The kernel parameters of one C-contiguous array in numba's array ABI (what numba-cuda's
    ``_Kernel._prepare_args`` passes): ``0, 0, size, itemsize, ptr, *shape, *strides``, the
    strides in bytes. Example: ``array_params(p, (3, 5), 2) == (0, 0, 15, 2, p, 3, 5, 10, 2)``."""
    strides, stride = [], itemsize
    for extent in reversed(shape):
        strides.append(stride)
        stride *= extent
    size = math.prod(shape)
    return (0, 0, size, itemsize, ptr, *shape, *reversed(strides))


class Launcher:
    """Launches one numba.cuda dispatcher with one signature:
    ``launcher(device, grid, block, shared, params)``.

    ``argtypes``: the numba types (``array_type(...)``) of the signature; it is compiled on
    the first launch (numba caches it for the process) and its driver handle kept. ``device``:
    the CUDA device index of the tensors (``t.get_device()``); the launch goes to torch's
    current stream on it. ``params``: the flat list of 8-byte kernel parameters
    (numba's array ABI per array: ``_p1``/``_p2``/``_p3`` in ``kernels/gate_residual.py``).
    ``grid``: (x, y); ``block``: threads in x; ``shared``: dynamic shared memory in bytes.
    Raises ``RuntimeError`` naming the CUDA error when the driver refuses the launch.
    """

    def __init__(self, dispatcher, argtypes: tuple) -> None:
        self.dispatcher = dispatcher
        self.argtypes = argtypes
        self.method = os.environ.get("GATE_RESIDUAL_LAUNCH", "ctypes")
        if self.method not in LAUNCH_METHODS:
            raise ValueError(f"GATE_RESIDUAL_LAUNCH={self.method!r}: choose from "
                             f"{', '.join(LAUNCH_METHODS)}")
        self._cufunc = None

    def compiled(self):
        """The numba ``_Kernel`` of this signature, compiled and loaded on first use (the
        time it takes is added to :data:`COMPILE_SECONDS`)."""
        t0 = time.perf_counter()
        self.dispatcher.compile(self.argtypes)
        kernel = self.dispatcher.overloads[self.argtypes]
        kernel.bind()
        COMPILE_SECONDS[0] += time.perf_counter() - t0
        return kernel

    def __call__(self, device: int, grid: tuple, block: int, shared: int,
                 params: list[int]) -> None:
        cufunc = self._cufunc
        if cufunc is None:
            cufunc = self._cufunc = self.compiled()._codelibrary.get_cufunc()
        stream = torch._C._cuda_getCurrentRawStream(device)
        if self.method == "ctypes":
            _launch_ctypes(cufunc.handle, stream, grid, block, shared, params)
        elif self.method == "driver":
            _launch_driver(cufunc.handle, stream, grid, block, shared, params)
        else:
            _launch_core(cufunc.kernel, stream, grid, block, shared, params)


#: ``GATE_RESIDUAL_LAUNCH`` values: libcuda's cuLaunchKernel through ctypes (default), the
#: same through cuda.bindings, or cuda.core.launch (what numba-cuda calls)
LAUNCH_METHODS = ("ctypes", "driver", "core")
_CU_LAUNCH = None
_HANDLES: dict[int, int] = {}


def _cu_launch_kernel():
    global _CU_LAUNCH
    if _CU_LAUNCH is None:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _CU_LAUNCH = fn
    return _CU_LAUNCH


def _launch_ctypes(handle, stream: int, grid: tuple, block: int, shared: int,
                   params: list[int]) -> None:
    address = _HANDLES.get(id(handle))
    if address is None:
        address = _HANDLES[id(handle)] = int(handle)
    buffer = (ctypes.c_int64 * len(params))(*params)
    size = ctypes.c_size_t(8 * len(params))
    extra = (ctypes.c_void_p * 5)(_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
                                  _PARAM_BUFFER_SIZE, ctypes.addressof(size), _PARAM_END)
    err = _cu_launch_kernel()(address, grid[0], grid[1], 1, block, 1, 1, shared, stream, None,
                              extra)
    if err:
        raise RuntimeError(f"cuLaunchKernel failed: CUresult {err}")


def _launch_driver(handle, stream: int, grid: tuple, block: int, shared: int,
                   params: list[int]) -> None:
    from cuda.bindings import driver

    cu_stream = _STREAMS.get(stream)
    if cu_stream is None:
        cu_stream = _STREAMS[stream] = driver.CUstream(stream)
    buffer = array.array("q", params)
    size = array.array("Q", (8 * len(params),))
    extra = array.array("Q", (_PARAM_BUFFER_POINTER, buffer.buffer_info()[0],
                              _PARAM_BUFFER_SIZE, size.buffer_info()[0], _PARAM_END))
    (err,) = driver.cuLaunchKernel(handle, grid[0], grid[1], 1, block, 1, 1, shared, cu_stream,
                                   None, extra.buffer_info()[0])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernel failed: {err.name}")


def _launch_core(kernel, stream: int, grid: tuple, block: int, shared: int,
                 params: list[int]) -> None:
    from cuda.core import LaunchConfig, launch
    from numba import cuda

    numba_stream = _STREAMS.get(-stream - 1)
    if numba_stream is None:
        numba_stream = _STREAMS[-stream - 1] = (cuda.external_stream(stream) if stream
                                                else cuda.default_stream())
    launch(numba_stream, LaunchConfig(grid=grid, block=block, shmem_size=shared), kernel,
           *params)
