"""The CUDA entry points' host path, on the CPU: what reaches the driver.

``bench.host.emulate_on_cpu`` runs the entry points on CPU tensors with
``cuLaunchKernelEx`` replaced by a recorder, so every launch's kernel, grid, block, shared
memory and packed parameters are checked here without a GPU: the parameters must be numba's
array ABI of the tensors the call passed (``kernels.launch.array_params``), the flag the one
``check_index`` asks for, and a cached plan must never skip a check that the full path makes.
The kernels themselves do not run (their bits: tests/test_kernels_gpu.py on the H200).
"""

from __future__ import annotations

import ctypes
import re
import threading

import pytest
import torch

from gate_residual_matrix.bench.host import emulate_on_cpu
from gate_residual_matrix.kernels import gate_residual as K
from gate_residual_matrix.kernels.device_assert import FLAG_ASSERT, FLAG_CLEAN
from gate_residual_matrix.kernels.errors import OpInputError
from gate_residual_matrix.kernels.launch import (
    _PARAM_BUFFER_POINTER,
    _PARAM_BUFFER_SIZE,
    _LaunchConfig,
    array_params,
)

_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p)


class Recorder:
    """A stand-in for cuLaunchKernelEx that keeps what each launch passed."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.fn = _EX(self._launch)

    def _launch(self, config, function, kernel_params, extra) -> int:
        cfg = _LaunchConfig.from_address(config)
        words = (ctypes.c_void_p * 5).from_address(extra)
        assert kernel_params is None and words[0] == _PARAM_BUFFER_POINTER
        assert words[2] == _PARAM_BUFFER_SIZE
        size = ctypes.c_size_t.from_address(words[3]).value
        params = list((ctypes.c_int64 * (size // 8)).from_address(words[1]))
        self.launches.append({"function": function, "grid": (cfg.gridDimX, cfg.gridDimY,
                                                              cfg.gridDimZ),
                              "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                              "shared": cfg.sharedMemBytes, "stream": cfg.hStream or 0,
                              "params": params})
        return 0


@pytest.fixture
def recorder():
    rec = Recorder()
    with emulate_on_cpu(rec.fn):
        yield rec


def tensors(n=5, d=64, g=3, dtype=torch.bfloat16, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(1)
    r, y, go = (torch.randn(n, d, generator=gen).to(dtype) for _ in range(3))
    gate = torch.randn(g, d, generator=gen).to(dtype)
    index = torch.randint(0, g, (n,), generator=gen).to(index_dtype)
    return r, gate, y, index, go


def handle(kind, which, dtype, index_dtype=torch.int64) -> int:
    return id(K._launcher(kind, which, dtype, index_dtype))


def words(t: torch.Tensor, ptr: int | None = None) -> tuple:
    """numba's ABI of ``t`` as the vector kernels see it: uint32 words."""
    return array_params(ptr or t.data_ptr(), (t.shape[0], t.shape[1] * t.element_size() // 4), 4)


def elements(t: torch.Tensor) -> tuple:
    return array_params(t.data_ptr(), tuple(t.shape), t.element_size())


def flag(check_index=True) -> int:
    checked, sink = K._flags(torch.device("cpu"))
    return (checked if check_index is True else sink).data_ptr()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_forward_packs_numba_abi_of_the_call_tensors(recorder, dtype):
    r, g, y, i, _ = tensors(dtype=dtype)
    for call in range(3):  # the first call makes the plan, the others reuse it
        out = K.gate_residual_forward(r, g, y, i)
        (launch,) = recorder.launches[call:]
        assert launch["function"] == handle("vec", 0, dtype)
        grid, block = K.forward_vec_geometry(5, 64 * r.element_size() // 16)
        assert launch["grid"] == (*grid, 1) and launch["block"] == (block, 1, 1)
        assert launch["params"] == [*words(out), *words(r), *words(g), *words(y),
                                    *array_params(i.data_ptr(), (5,), 8),
                                    *array_params(flag(), (1,), 1)]
    assert K._flags(torch.device("cpu"))[0].item() == FLAG_ASSERT
    assert K._flags(torch.device("cpu"))[1].item() == FLAG_CLEAN


def test_unchecked_calls_pass_the_sink_flag_and_sync_checks_on_the_host(recorder):
    r, g, y, i, go = tensors()
    K.gate_residual_forward(r, g, y, i, check_index=False)
    K.gate_residual_backward(go, g, y, i, check_index=False)
    K.gate_residual_forward(r, g, y, i, check_index="sync")
    flags = [launch["params"][-3] for launch in recorder.launches if len(
        launch["params"]) > 20]
    assert flags == [flag(False), flag(False), flag(False)]
    bad = i.clone()
    bad[2] = 3
    with pytest.raises(OpInputError, match=r"index holds 3, outside \[0, G=3\)"):
        K.gate_residual_forward(r, g, y, bad, check_index="sync")


def test_unaligned_and_narrow_rows_take_the_element_kernel(recorder):
    r, g, y, i, _ = tensors(d=64)
    flat = torch.zeros(r.numel() + 1, dtype=r.dtype)
    flat[1:] = r.reshape(-1)
    shifted = flat[1:].view(r.shape)  # contiguous, 2 bytes past a 16-byte boundary
    K.gate_residual_forward(r, g, y, i)
    out = K.gate_residual_forward(shifted, g, y, i)
    assert [launch["function"] for launch in recorder.launches] == [
        handle("vec", 0, r.dtype), handle("elements", 0, r.dtype)]
    assert recorder.launches[1]["params"][:9] == list(elements(out))
    assert recorder.launches[1]["params"][9:18] == list(elements(shifted))
    r7, g7, y7, i7, _ = tensors(d=7)
    K.gate_residual_forward(r7, g7, y7, i7)
    assert recorder.launches[-1]["function"] == handle("elements", 0, r.dtype)


@pytest.fixture
def fuse_eight(monkeypatch):
    """Plans made meanwhile fuse up to 8 chunks (the default is 1, as measured on the H200:
    kernels/gate_residual_kernels.py), so that the tickets' path is exercised."""
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B

    monkeypatch.setattr(B, "FUSED_MAX_CHUNKS", 8)


def test_backward_of_few_chunks_is_one_fused_launch(recorder, fuse_eight):
    """Up to FUSED_MAX_CHUNKS chunks: one launch of backward_fused, with grad_gate's words,
    the kept partial sums (as words, chunks * G rows) and the kept tickets (one per column
    block); the next call finds them remembered in the plan."""
    r, g, y, i, go = tensors(n=300)
    grad_y, grad_gate = K.gate_residual_backward(go, g, y, i)
    (fused,) = recorder.launches
    assert fused["function"] == handle("vec", 2, r.dtype)
    n_chunks = K.n_chunks(300)
    assert 1 < n_chunks <= 8
    grid, block, shared = K.backward_vec_geometry(n_chunks, 64 * 2 // 16, 3, 8)
    assert fused["grid"][:2] == grid and fused["block"][0] == block
    assert fused["shared"] == shared
    params = fused["params"]
    partial, tickets = params[18 + 4], params[27 + 4]
    assert params == [*words(grad_y), *words(grad_gate),
                      *array_params(partial, (n_chunks * 3, 64), 4),
                      *array_params(tickets, (grid[0],), 4), *words(go), *words(g),
                      *words(y), *array_params(i.data_ptr(), (300,), 8),
                      *array_params(flag(), (1,), 1)]
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B

    kept = B._TICKETS[(-1, 0)]
    assert kept.data_ptr() == tickets and not kept.any() and kept.dtype == torch.int32
    assert B._WORKSPACES[(-1, 0)].data_ptr() == partial
    K.gate_residual_backward(go, g, y, i)
    assert recorder.launches[-1]["params"][18 + 4:27 + 5] == params[18 + 4:27 + 5]


def test_backward_of_one_chunk_needs_no_scratch(recorder):
    r, g, y, i, go = tensors(n=K.CHUNK_ROWS)
    K.gate_residual_backward(go, g, y, i)
    (fused,) = recorder.launches
    assert fused["function"] == handle("vec", 2, r.dtype)
    assert fused["params"][18 + 4] == 0 and fused["params"][27 + 4] == 0


def test_backward_of_many_chunks_launches_the_chunks_then_the_reduction(recorder):
    n = K.CHUNK_ROWS * K.FUSED_MAX_CHUNKS + 1
    r, g, y, i, go = tensors(n=n)
    grad_y, grad_gate = K.gate_residual_backward(go, g, y, i)
    chunks, reduce = recorder.launches
    assert chunks["function"] == handle("vec", 1, r.dtype)
    assert reduce["function"] == handle("elements", 2, r.dtype)
    n_chunks = K.n_chunks(n)
    partial = reduce["params"][9 + 4]
    assert chunks["params"] == [*words(grad_y), *array_params(partial, (n_chunks, 3, 64), 4),
                                *words(go), *words(g), *words(y),
                                *array_params(i.data_ptr(), (n,), 8),
                                *array_params(flag(), (1,), 1)]
    assert reduce["params"] == [*elements(grad_gate),
                                *array_params(partial, (n_chunks, 3, 64), 4)]
    grid, block, shared = K.backward_vec_geometry(n_chunks, 64 * 2 // 16, 3, 8)
    assert chunks["grid"][:2] == grid and chunks["block"][0] == block
    assert chunks["shared"] == shared
    K.gate_residual_backward(go, g, y, i)  # the workspace is kept between calls
    assert recorder.launches[-1]["params"][13] == partial


def test_unaligned_grad_gate_or_input_takes_the_two_launch_path(recorder, fuse_eight):
    """The fused kernel stores grad_gate as 16-byte vectors: a call whose pointers are not
    all 16-byte aligned runs the chunk kernel (element kernel for unaligned inputs) and the
    reduction instead, on the same plan."""
    r, g, y, i, go = tensors(n=300)
    flat = torch.zeros(go.numel() + 1, dtype=go.dtype)
    flat[1:] = go.reshape(-1)
    shifted = flat[1:].view(go.shape)
    K.gate_residual_backward(shifted, g, y, i)
    assert [launch["function"] for launch in recorder.launches] == [
        handle("elements", 1, r.dtype), handle("elements", 2, r.dtype)]


def test_autograd_backward_uses_the_sink_flag_and_returns_grad_out(recorder):
    r, g, y, i, go = tensors()
    leaves = [t.clone().requires_grad_() for t in (r, g, y)]
    out = K.gate_residual(*leaves, i)
    assert out.grad_fn is not None
    grads = torch.autograd.grad(out, leaves, go)
    assert grads[0] is go or torch.equal(grads[0], go)
    forward, backward = recorder.launches
    assert forward["params"][-3] == flag(True) and backward["params"][-3] == flag(False)
    with torch.no_grad():
        assert K.gate_residual(*leaves, i).grad_fn is None  # no autograd where none flows
    assert len(recorder.launches) == 3


def test_a_cached_plan_never_skips_a_check(recorder):
    """After a plan exists for the good inputs, each bad variant still meets the full path's
    one-line error; a lazily negated or strided input is made dense first."""
    r, g, y, i, go = tensors()
    K.gate_residual_forward(r, g, y, i)
    K.gate_residual_backward(go, g, y, i)
    bad = [
        ((r, g.half(), y, i), "gate is torch.float16 but residual is torch.bfloat16"),
        ((r, g, y[:4], i), "residual and y must both be (N, D)"),
        ((r, g, y, i.float()), "index must be int64 or int32"),
        ((r, g, y, i[:4]), "index must be (N=5,)"),
        ((r, g, y.to_sparse(), i), "y must be a dense tensor"),
        ((r, g, y.to("meta"), i), "tensors are on different devices"),
        ((r, g, y.float().numpy(), i), "y must be a torch.Tensor, got ndarray"),
    ]
    for args, fragment in bad:
        for entry in (K.gate_residual_forward, K.gate_residual):
            with pytest.raises(OpInputError) as info:
                entry(*args)
            assert fragment in str(info.value), (fragment, str(info.value))
    for value in (1, 0, "True", None):  # 1 == True: the cached key must not accept it
        with pytest.raises(OpInputError, match="check_index must be"):
            K.gate_residual_forward(r, g, y, i, check_index=value)
        with pytest.raises(OpInputError, match="check_index must be"):
            K.gate_residual_backward(go, g, y, i, check_index=value)
    with pytest.raises(OpInputError, match="grad_out must be"):
        K.gate_residual_backward(go[:4], g, y, i)
    before = len(recorder.launches)
    negated = torch._neg_view(-y)
    K.gate_residual_forward(r, g, negated, i)
    sent = recorder.launches[before]["params"][27 + 4]
    assert sent not in (negated.data_ptr(), y.data_ptr())  # a dense copy, not y's storage
    K.gate_residual_forward(r, g, y.T.contiguous().T, i)
    assert recorder.launches[-1]["params"][27 + 4] != y.data_ptr()


def test_each_thread_has_its_own_plans(recorder):
    r, g, y, i, _ = tensors()
    K.gate_residual_forward(r, g, y, i)
    mine = K._FORWARD_PLANS.plan
    seen = []

    def other():
        K.gate_residual_forward(r, g, y, i)
        seen.append(K._FORWARD_PLANS.plan)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen[0] is not None and seen[0] is not mine and seen[0].vec is not mine.vec
    assert K._FORWARD_PLANS.plan is mine and len(recorder.launches) == 2


def test_a_refused_launch_names_the_cuda_error():
    r, g, y, i, _ = tensors()
    refuse = _EX(lambda *args: 719)
    with emulate_on_cpu(refuse), pytest.raises(RuntimeError,
                                               match="cuLaunchKernelEx failed: CUresult 719"):
        K.gate_residual_forward(r, g, y, i)


def test_empty_inputs_launch_nothing(recorder):
    r, g, y, i, go = tensors(n=0)
    assert K.gate_residual_forward(r, g, y, i).shape == (0, 64)
    grad_y, grad_gate = K.gate_residual_backward(go, g, y, i)
    assert grad_y.shape == (0, 64) and grad_gate.shape == (3, 64)
    assert [launch["function"] for launch in recorder.launches] == [
        handle("elements", 2, r.dtype)]  # grad_gate: the reduction of no chunks writes +0.0


def test_kernels_assert_on_a_bad_index_through_assertfail():
    """The index check is in the kernels: a bad index calls the PTX system call
    ``__assertfail`` (kernels/device_assert.py) when the flag says FLAG_ASSERT. Declared
    ``noreturn``, so the hot loop keeps its registers (docs/performance.md)."""
    from numba import cuda

    sig = "void(uint32[:, ::1], uint32[:, ::1], uint32[:, ::1], uint32[:, ::1], int64[::1], " \
          "uint8[::1])"
    ptx, _ = cuda.compile_ptx(K.vec_kernels_for("bfloat16")[0].py_func, sig, cc=(9, 0))
    assert ".extern .func __assertfail" in ptx
    assert re.search(r"call\.uni\s+__assertfail,", ptx)
    strings = [bytes(int(v) for v in body.split(",")).decode("latin-1")
               for body in re.findall(r"\.const \.align 1 \.b8 \S+\[\d+\] = \{([^}]*)\}", ptx)]
    assert "gate_residual: index holds a value outside [0, G)" in strings  # NUL implied


def test_a_driver_that_refuses_the_ex_launch_falls_back_to_cuLaunchKernel():
    """cuLaunchKernelEx answering CUDA_ERROR_INVALID_VALUE: the launch is made again with
    cuLaunchKernel (eleven arguments, the same parameter buffer), and so are later ones."""
    from gate_residual_matrix.kernels import launch as L

    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    seen = []

    def classic(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        words = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(words[3]).value
        seen.append((function, gx, gy, bx, list((ctypes.c_int64 * (size // 8)).from_address(
            words[1]))))
        return 0

    classic_fn = launch(classic)
    r, g, y, i, _ = tensors()
    with emulate_on_cpu(_EX(lambda *args: 1)):
        L.DRIVER["launch"] = classic_fn
        out = K.gate_residual_forward(r, g, y, i)
        K.gate_residual_forward(r, g, y, i)
        assert L.DRIVER["ex"] is None
    grid, block = K.forward_vec_geometry(5, 64 * 2 // 16)
    assert len(seen) == 2 and seen[0][:4] == (handle("vec", 0, r.dtype), *grid, block)
    assert seen[0][4][:9] == list(words(out))


def test_a_thread_without_a_context_binds_the_primary_context_once(monkeypatch):
    """CUDA_ERROR_INVALID_CONTEXT (201): the launching thread has no current context (autograd's
    device thread, whose first launch was ours: H200 at 6e3cb9c). The primary context is made
    current once per thread and the launch made again; a second 201 in that thread raises."""
    from gate_residual_matrix.kernels import launch as L

    answers, pushed = [201, 0, 201, 201], []
    monkeypatch.setattr(L, "_push_primary_context", pushed.append)
    refuse_once = _EX(lambda *args: answers.pop(0))
    r, g, y, i, _ = tensors()
    errors = []

    def fresh_thread():
        try:
            K.gate_residual_forward(r, g, y, i)  # 201, bind, launch again: 0
            K.gate_residual_forward(r, g, y, i)  # 201 again after binding: an error
        except RuntimeError as err:
            errors.append(str(err))

    with emulate_on_cpu(refuse_once):
        worker = threading.Thread(target=fresh_thread)
        worker.start()
        worker.join()
    assert pushed == [r.get_device()] and answers == [201]
    assert errors == ["cuLaunchKernelEx failed: CUresult 201"]
