"""Launch numba-compiled kernels on torch tensors without numba's per-call dispatch.

A numba.cuda dispatcher call types every argument, wraps each tensor in a device array view
(which creates a stream object from the tensor's ``__cuda_array_interface__``) and builds a
launch configuration: about 0.3 ms of host time for our forward, measured on the H200
(``runner/bench.py``, ``docs/performance.md``), far longer than the kernel at small N.

:class:`Launcher` compiles each signature once with numba, keeps the compiled kernel, and
launches it through ``cuda.core.launch`` (what numba-cuda 0.30 itself calls) with the array
arguments flattened exactly as numba's ``_Kernel._prepare_args`` flattens them: for each
array ``meminfo=0, parent=0, size, itemsize, data pointer, *shape, *strides in bytes``. The
kernel code and its bits are the same; only the Python around the launch is shorter.
"""

from __future__ import annotations

import torch
from numba import cuda
from numba.cuda import types

_NUMBA_DTYPES = {
    torch.int64: types.int64,
    torch.int32: types.int32,
    torch.int16: types.int16,
    torch.float16: types.float16,
    torch.float32: types.float32,
}

_STREAMS: dict[int, object] = {}


def current_stream():
    """numba's handle for torch's current CUDA stream (cached per stream handle)."""
    handle = torch.cuda.current_stream().cuda_stream
    stream = _STREAMS.get(handle)
    if stream is None:
        stream = cuda.external_stream(handle) if handle else cuda.default_stream()
        _STREAMS[handle] = stream
    return stream


def array_type(t: torch.Tensor) -> types.Array:
    """numba type of a C-contiguous tensor: ``array(<dtype>, <ndim>d, C)``."""
    return types.Array(_NUMBA_DTYPES[t.dtype], t.dim(), "C")


def flatten(t: torch.Tensor, out: list) -> None:
    """Append a contiguous tensor's kernel parameters in numba's array ABI order."""
    itemsize = t.element_size()
    out += (0, 0, t.numel(), itemsize, t.data_ptr(), *t.shape,
            *(s * itemsize for s in t.stride()))


class Launcher:
    """Launches one numba.cuda dispatcher on torch tensors: ``launcher(grid, block, shared,
    *tensors)`` on torch's current stream.

    Tensors must be contiguous CUDA tensors of the dtypes in ``_NUMBA_DTYPES`` (view
    bfloat16 as int16 first). The first launch of a signature compiles it (numba caches it
    for the process); later launches cost a dictionary look-up and the argument list.
    """

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self._kernels: dict[tuple, object] = {}
        self._configs: dict[tuple, object] = {}

    def _kernel(self, key: tuple, tensors) -> object:
        kernel = self._kernels.get(key)
        if kernel is None:
            argtypes = tuple(array_type(t) for t in tensors)
            self.dispatcher.compile(argtypes)
            compiled = self.dispatcher.overloads[argtypes]
            compiled.bind()
            kernel = self._kernels[key] = compiled._codelibrary.get_cufunc().kernel
        return kernel

    def __call__(self, grid: tuple, block: int, shared: int, *tensors: torch.Tensor) -> None:
        from cuda.core import LaunchConfig, launch

        key = tuple((t.dtype, t.dim()) for t in tensors)
        kernel = self._kernel(key, tensors)
        config = self._configs.get((grid, block, shared))
        if config is None:
            config = self._configs[(grid, block, shared)] = LaunchConfig(
                grid=grid, block=block, shmem_size=shared)
        args: list = []
        for t in tensors:
            flatten(t, args)
        launch(current_stream(), config, kernel, *args)
