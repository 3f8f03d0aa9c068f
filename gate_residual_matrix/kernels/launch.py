"""Launch numba-compiled kernels on raw device pointers, without numba's per-call dispatch.

A numba.cuda dispatcher call types every argument, wraps each tensor in a device array view
(creating a stream object from its ``__cuda_array_interface__``) and builds a launch
configuration: about 0.4 ms of host time per call on the H200's host, measured by the
benchmark's host breakdown (``bench/host.py``, ``docs/performance.md``), far longer than the
kernel at small N.

:class:`Launcher` compiles one signature once with numba and keeps the compiled kernel's
driver handle. A launch packs the kernel's parameters, in numba's array ABI (for each array
``meminfo=0, parent=0, size, itemsize, data pointer, *shape, *strides in bytes``, all 8-byte
integers, as numba's ``_Kernel._prepare_args`` lays them out), into one int64 buffer and
calls ``cuLaunchKernel`` with ``CU_LAUNCH_PARAM_BUFFER_POINTER`` (CUDA driver API,
"Execution Control"). The kernel code and its bits are numba's; only the host path is
shorter. ``GATE_RESIDUAL_LAUNCH=core`` selects ``cuda.core.launch`` (what numba-cuda itself
calls) instead, for comparison.

:class:`PackedLaunch` goes further, for the entry points' repeated calls: the
parameter buffer, the ``extra`` array and a ``CUlaunchConfig`` are built once per launch shape,
and a call writes only the data pointers into their slots and calls ``cuLaunchKernelEx`` with
four arguments (``cuLaunchKernel`` with eleven where the driver lacks it): about 0.7 µs of
ctypes on the CPU machine against 6.6 µs for building the buffer and calling
``cuLaunchKernel`` each time (``python -m gate_residual_matrix.bench.host``).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import math
import threading
import time
from collections.abc import Callable, Sequence

import torch
from numba.cuda import types

from gate_residual_matrix import settings

#: cuLaunchKernel ``extra`` keys (cuda.h: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE)
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2

_STREAMS: dict[int, object] = {}

#: Seconds this process spent compiling and loading kernels in :meth:`Launcher.compiled`
#: (numba's typing, LLVM, NVVM/ptxas and the module load), summed; the runner reports it as
#: part of a cell's compilation time.
COMPILE_SECONDS = [0.0]

#: Context managers entered around compiling or loading a kernel (a :class:`Launcher`'s first
#: use): empty here; a cell on a shared GPU adds one that lets the GPU lock go meanwhile
#: (``contract/compile_aside.py``), since compiling is CPU work.
AROUND_COMPILE: list[Callable[[], contextlib.AbstractContextManager]] = []


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
    ``name``: the caller's unique name of this kernel and variant (dtype, index dtype, kind):
    with it, the cubin comes from the on-disk cache when a process built it before
    (kernels/cubin_cache.py), and otherwise goes there once compiled.
    Raises ``RuntimeError`` naming the CUDA error when the driver refuses the launch.
    """

    def __init__(self, dispatcher, argtypes: tuple, name: str | None = None) -> None:
        self.dispatcher = dispatcher
        self.argtypes = argtypes
        self.name = name
        self.method = settings.get("GATE_RESIDUAL_LAUNCH")
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

    def _function(self):
        """numba's loaded function of this kernel (``CudaPythonFunction``): loaded from the
        cubin cache on a hit, else compiled by numba and its cubin stored there (the time
        either takes is added to :data:`COMPILE_SECONDS`)."""
        from numba import cuda

        from gate_residual_matrix.kernels import cubin_cache

        ctx = cuda.current_context()
        entry_key = None
        if self.name is not None and cubin_cache.cache_dir() is not None:
            entry_key = cubin_cache.key(self.name, self.dispatcher, self.argtypes,
                                        ctx.device.compute_capability)
            t0 = time.perf_counter()
            hit = cubin_cache.load(entry_key)
            if hit is not None:
                from numba.cuda.cudadrv.driver import ObjectCode

                module = ctx.create_module_image(ObjectCode.from_cubin(hit[0]))
                function = module.get_function(hit[1])
                COMPILE_SECONDS[0] += time.perf_counter() - t0
                return function
        library = self.compiled()._codelibrary
        function = library.get_cufunc()
        if entry_key is not None and not (library._setup_functions
                                          or library._teardown_functions):
            cubin = library.get_cubin()
            cubin_cache.store(entry_key, bytes(getattr(cubin, "code", cubin)),
                              library._entry_name, self.name)
        return function

    def _loaded(self):
        """:meth:`_function`, once, inside every :data:`AROUND_COMPILE` context."""
        with contextlib.ExitStack() as around:
            for enter in AROUND_COMPILE:
                around.enter_context(enter())
            self._cufunc = self._function()
        return self._cufunc

    def handle(self) -> int:
        """The driver handle (``CUfunction``) of the kernel, as an int."""
        cufunc = self._cufunc
        if cufunc is None:
            cufunc = self._loaded()
        return int(cufunc.handle)

    def packed(self, device: int, grid: tuple, block: int, shared: int,
               params: Sequence[int | None]) -> PackedLaunch:
        """A :class:`PackedLaunch` of this kernel: ``params`` as for :meth:`__call__`, with
        ``None`` in the place of each data pointer a call supplies (in that order)."""
        return PackedLaunch(self.handle(), device, grid, block, shared, params)

    def __call__(self, device: int, grid: tuple, block: int, shared: int,
                 params: list[int]) -> None:
        cufunc = self._cufunc
        if cufunc is None:
            cufunc = self._loaded()
        stream = torch._C._cuda_getCurrentRawStream(device)
        if self.method == "ctypes":
            _launch_ctypes(cufunc.handle, stream, grid, block, shared, params)
        elif self.method == "driver":
            _launch_driver(cufunc.handle, stream, grid, block, shared, params)
        else:
            _launch_core(cufunc.kernel, stream, grid, block, shared, params)


#: ``GATE_RESIDUAL_LAUNCH`` values: libcuda's cuLaunchKernel through ctypes (default), the
#: same through cuda.bindings, or cuda.core.launch (what numba-cuda calls)
LAUNCH_METHODS = settings.LAUNCH_METHODS
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


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h, CUDA 12.0 and later), without launch attributes."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


def _cu_launch_kernel_ex():
    """libcuda's ``cuLaunchKernelEx(config, f, kernelParams, extra)``, or None where the
    driver predates it (CUDA 12.0)."""
    fn = getattr(ctypes.CDLL("libcuda.so.1"), "cuLaunchKernelEx", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p] * 4
        fn.restype = ctypes.c_int
    return fn


#: The driver entry points :class:`PackedLaunch` calls, loaded on first use;
#: ``bench.host.emulate_on_cpu`` replaces them with no-op C functions of the same
#: signatures to time the Python path on a machine without a GPU.
DRIVER: dict[str, object] = {}


def _driver() -> dict[str, object]:
    if not DRIVER:
        DRIVER["ex"] = _cu_launch_kernel_ex()
        DRIVER["launch"] = _cu_launch_kernel()
    return DRIVER


#: ``CUresult`` CUDA_ERROR_INVALID_CONTEXT (cuda.h)
INVALID_CONTEXT = 201
_BOUND = threading.local()


def _push_primary_context(device: int) -> None:
    """Make ``device``'s primary context (the one torch's runtime and numba use) current in
    the calling thread: numba's ``cuda.current_context(device)`` pushes it."""
    from numba import cuda

    cuda.current_context(device)


def bind_context(device: int) -> bool:
    """Make ``device``'s primary context current in the calling thread, once per thread and
    device; False when this thread did so before (a second refusal is then an error).

    A driver-API launch on the legacy default stream (``hStream`` 0, torch's default stream)
    needs a current context in the calling thread. A thread whose CUDA work so far went
    through torch's runtime paths that bind none (a cached allocation, a stream lookup), such
    as autograd's device thread running our backward as its first launch, has none: the
    driver answers ``CUDA_ERROR_INVALID_CONTEXT`` (H200, 6e3cb9c: the one-launch backward at
    N = 1 under ``torch.autograd.grad``). Binding on that answer costs nothing per call.
    """
    done = getattr(_BOUND, "devices", None)
    if done is None:
        done = _BOUND.devices = set()
    if device in done:
        return False
    done.add(device)
    _push_primary_context(device)
    return True


class PackedLaunch:
    """One kernel launch with everything but the data pointers and the stream fixed.

    ``function``: the ``CUfunction`` handle; ``device``: CUDA device index; ``grid`` (x, y),
    ``block`` (threads in x), ``shared`` (dynamic shared memory, bytes); ``params``: the
    kernel's 8-byte parameters in numba's array ABI (:func:`array_params`), ``None`` where a
    call supplies a data pointer. ``launch(stream, *pointers)`` (or the faster ``.fast``, the
    same with one positional argument per pointer) writes the pointers into those slots, in
    order, and launches on ``stream`` (a raw ``cudaStream_t``, e.g.
    ``torch._C._cuda_getCurrentRawStream(device)``).

    The buffer is written before each launch and the driver copies it during the call, so a
    PackedLaunch must not be shared between threads: the entry points keep one per thread
    (:class:`PlanCache`). Raises ``RuntimeError`` naming the ``CUresult`` when the driver
    refuses the launch.

    Example (``# doctest: +SKIP``: needs a GPU)::

        run = launcher.packed(0, (6, 1), 128, 0, [*array_params(None, (1, 3), 4), ...])
        run.fast(stream, out.data_ptr(), ...)
    """

    def __init__(self, function: int, device: int, grid: tuple, block: int, shared: int,
                 params: Sequence[int | None]) -> None:
        self.device, self.grid, self.block, self.shared = device, tuple(grid), block, shared
        self.slots = tuple(i for i, value in enumerate(params) if value is None)
        self._buffer = (ctypes.c_int64 * len(params))(*(v or 0 for v in params))
        self._size = ctypes.c_size_t(8 * len(params))
        self._extra = (ctypes.c_void_p * 5)(_PARAM_BUFFER_POINTER, ctypes.addressof(self._buffer),
                                            _PARAM_BUFFER_SIZE, ctypes.addressof(self._size),
                                            _PARAM_END)
        self._config = _LaunchConfig(grid[0], grid[1], 1, block, 1, 1, shared, None, None, 0)
        self.function = function
        self.fast = self._compile()

    def params(self) -> list[int]:
        """The parameter buffer as it stands (the last call's pointers in their slots)."""
        return list(self._buffer)

    def __call__(self, stream: int, *pointers: int) -> None:
        if len(pointers) != len(self.slots):
            raise TypeError(f"PackedLaunch takes {len(self.slots)} pointers, got "
                            f"{len(pointers)}")
        self.fast(stream, *pointers)

    def _refused(self, err: int, stream: int, *pointers: int) -> None:
        """A launch the driver refused: where ``cuLaunchKernelEx`` answered
        ``CUDA_ERROR_INVALID_VALUE`` or ``CUDA_ERROR_NOT_SUPPORTED`` (a driver that does not
        take the parameter buffer through it), every later launch of the process uses
        ``cuLaunchKernel`` and this one is tried again; where it answered
        ``CUDA_ERROR_INVALID_CONTEXT`` (this thread has no current context: see
        :func:`bind_context`), the device's primary context is made current in this thread,
        once, and the launch tried again; otherwise ``RuntimeError``."""
        driver = DRIVER or _driver()
        if err == INVALID_CONTEXT and bind_context(self.device):
            self.fast(stream, *pointers)
            return
        if driver["ex"] is not None and err in (1, 801) and driver["launch"] is not None:
            driver["ex"] = None
            self.fast = self._compile()
            self.fast(stream, *pointers)
            return
        what = "cuLaunchKernelEx" if driver["ex"] is not None else "cuLaunchKernel"
        raise RuntimeError(f"{what} failed: CUresult {err}")

    def _compile(self) -> Callable[..., None]:
        """The launch as one Python function of ``(stream, p0, p1, ...)``: a store per
        pointer slot, then the driver call, with everything else bound in advance (a loop
        over the slots and attribute lookups cost about 1 µs per call on the CPU machine)."""
        driver = DRIVER or _driver()
        names = [f"p{k}" for k in range(len(self.slots))]
        stores = "".join(f"    buffer[{slot}] = {name}\n"
                         for slot, name in zip(self.slots, names, strict=True))
        if driver["ex"] is not None:
            call = ("    if stream != last[0]:\n        config.hStream = stream\n"
                    "        last[0] = stream\n"
                    "    err = launch(config_address, function, None, extra)\n")
            what = "cuLaunchKernelEx"
        else:
            call = ("    err = launch(function, gx, gy, 1, block, 1, 1, shared, stream, None, "
                    "extra)\n")
            what = "cuLaunchKernel"
        source = (f"def packed_launch(stream, {', '.join(names)}):\n{stores}{call}"
                  f"    if err:\n        refused(err, stream, {', '.join(names)})\n")
        scope = {"buffer": self._buffer, "last": [0], "config": self._config,
                 "config_address": ctypes.addressof(self._config),
                 "function": self.function, "extra": ctypes.addressof(self._extra),
                 "launch": driver["ex"] if driver["ex"] is not None else driver["launch"],
                 "gx": self.grid[0], "gy": self.grid[1], "block": self.block,
                 "shared": self.shared, "refused": self._refused}
        exec(compile(source, f"<PackedLaunch {what}>", "exec"), scope)
        return scope["packed_launch"]


class PlanCache(threading.local):
    """Launch plans by key, one table per thread (a :class:`PackedLaunch` is written before
    each launch, so threads must not share one), bounded: past ``limit`` entries a thread's
    table starts again empty (shapes that vary without end must not grow it forever).

    The entry points compare a call's key with ``cache.key`` first (``==``, no hash: a call
    mostly has the shapes of the previous one) and take ``cache.plan``; else ``get(key)``.
    ``put(key, plan)`` stores one; both make it the ``key``/``plan`` compared first.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.plans: dict[tuple, object] = {}
        self.key: tuple | None = None
        self.plan = None

    def get(self, key: tuple):
        """The plan of ``key``, or None."""
        if key == self.key:
            return self.plan
        plan = self.plans.get(key)
        if plan is not None:
            self.key, self.plan = key, plan
        return plan

    def put(self, key: tuple, plan) -> None:
        """Keep ``plan`` for ``key`` (this thread)."""
        if len(self.plans) >= self.limit:
            self.plans.clear()
        self.plans[key] = plan
        self.key, self.plan = key, plan

    def clear(self) -> None:
        """Forget every plan of this thread."""
        self.plans.clear()
        self.key = self.plan = None
