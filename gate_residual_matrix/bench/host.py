"""Host time per call of the gate_residual CUDA entry points, broken down: gate_residual's
own extra beside the generic benchmark (``python -m gate_residual_matrix.bench.host``).

At N = 1 the GPU work is a few µs and a call costs what its Python costs. :func:`host_costs`
times, with ``perf_counter`` over back-to-back calls (the least of ``repeats`` rounds of
``calls`` calls, µs per call):

* the public forward (``gate_residual_forward``, default index check, unchecked, and through
  autograd ``GateResidual.apply``) and its parts: the plan key and lookup, the density check,
  the output's allocation, the data pointers and stream, the packed launch;
* the public backward (``gate_residual_backward``: at N = 1 one launch of the fused kernel)
  and its parts: the two allocations, the kept scratch's lookup, the fused launch; and the
  two-launch path it replaced (the chunk kernel, then the reduction: the same call with the
  plan's fused launch set aside, and each of its launches alone);
* forward + backward through ``torch.autograd.grad``, ours and eager's;
* on a GPU also the launch paths it replaced: numba's own dispatcher and ``Launcher.__call__``
  (the parameter buffer built per call, ``cuLaunchKernel`` with eleven arguments).

:func:`emulate_on_cpu` runs the same code on CPU tensors: the entry points take ``cpu``
tensors, the stream is 0, the kernels are not compiled (a dummy handle), and the driver call
is libc's ``memcmp(config, function, 0, extra)``, a C function of ``cuLaunchKernelEx``'s
ctypes signature that returns 0 (``CUDA_SUCCESS``) without touching memory: so every line of
Python up to the driver, and ctypes' own marshalling, is timed on a machine without a GPU.
The driver's work and the CUDA caching allocator are not: CPU ``empty_like`` is not
CUDA's. ``python -m gate_residual_matrix.bench.host`` prints these figures (:func:`main`: on
the GPU as it is, here emulated).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Iterator
from unittest import mock

import torch

#: ``(config, function, kernelParams, extra)`` of cuLaunchKernelEx, as kernels/launch.py
#: declares it
_EX_ARGTYPES = [ctypes.c_void_p] * 4


def noop_launch_ex():
    """libc's ``memcmp`` declared as ``cuLaunchKernelEx``: with ``kernelParams`` = NULL it
    compares 0 bytes and returns 0 (the CUDA_SUCCESS a launch returns)."""
    fn = ctypes.CDLL(None).memcmp
    fn.argtypes = _EX_ARGTYPES
    fn.restype = ctypes.c_int
    return fn


@contextlib.contextmanager
def emulate_on_cpu(launch_ex=None) -> Iterator[None]:
    """Run the CUDA entry points' host path on CPU tensors (see the module docstring).

    ``launch_ex``: the C function (or ctypes callback) called in the place of
    ``cuLaunchKernelEx``; default :func:`noop_launch_ex`. The plan caches are emptied on
    entry and exit, so no plan of an emulated call survives it.
    """
    from gate_residual_matrix.kernels import gate_residual as K
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B
    from gate_residual_matrix.kernels import gate_residual_plans as P
    from gate_residual_matrix.kernels import launch as L

    def clear() -> None:
        P._FORWARD_PLANS.clear()
        P._BACKWARD_PLANS.clear()
        B.clear_scratch()

    clear()
    with mock.patch.object(K, "DEVICE_TYPE", "cpu"), \
            mock.patch.object(P, "_raw_stream", lambda device: 0), \
            mock.patch.object(B, "_raw_stream", lambda device: 0), \
            mock.patch.object(L.Launcher, "handle", lambda self: id(self)), \
            mock.patch.dict(L.DRIVER, {"ex": launch_ex or noop_launch_ex(), "launch": None},
                            clear=True):
        try:
            yield
        finally:
            clear()


def per_call_us(fn: Callable[[], object], *, calls: int, repeats: int, sync) -> float:
    """The least, over ``repeats`` rounds, of the host microseconds per call of ``fn``, each
    round ``calls`` back-to-back calls after one untimed call (``sync`` before each round).
    The least, not the median: other processes only ever add time (the CPU machine is
    shared; the GPU machine's rounds agree within a few percent)."""
    fn()
    rounds = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    sync()
    return min(rounds)


def host_costs(x: dict, *, calls: int = 2000, repeats: int = 5) -> dict[str, float]:
    """µs per call of the entry points and their parts (module docstring), for inputs ``x``
    (``residual``, ``gate``, ``y``, ``index``, ``grad_out``: CUDA tensors, or CPU tensors
    under :func:`emulate_on_cpu`). Keys name what was timed."""
    from gate_residual_matrix.kernels import gate_residual as K
    from gate_residual_matrix.kernels import gate_residual_plans as P

    r, g, y, i, go = (x[k] for k in ("residual", "gate", "y", "index", "grad_out"))
    cuda = r.is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def t(fn) -> float:
        return per_call_us(fn, calls=calls, repeats=repeats, sync=sync)

    out = K.gate_residual_forward(r, g, y, i)
    plan = K._FORWARD_PLANS.get(K._key(r, g, y, i, K.FLAG_ASSERT))
    device = plan.device
    ptrs = (out.data_ptr(), r.data_ptr(), g.data_ptr(), y.data_ptr(), i.data_ptr())
    launch = plan.vec or plan.elements()
    stream = P._raw_stream(device)
    grads = K.gate_residual_backward(go, g, y, i)
    bplan = K._BACKWARD_PLANS.get(K._key(go, g, y, i, K.FLAG_ASSERT))
    partial, ticket, _ = bplan.scratch(stream, go.device)
    gy, gg = grads[0].data_ptr(), grads[1].data_ptr()
    bptrs = (gy, partial, go.data_ptr(), g.data_ptr(), y.data_ptr(), i.data_ptr())
    chunk_launch = bplan.vector_chunks() if bplan.fused or bplan.vec else bplan.elements()
    fused = bplan.fused
    if fused is not None:  # one launch; with one chunk no partial sums, no tickets
        fptrs = (gy, gg, *((0, 0) if bplan.chunks == 1 else (partial, ticket)),
                 go.data_ptr(), g.data_ptr(), y.data_ptr(), i.data_ptr())

    def two_launches():
        """The public backward with the plan's fused launch set aside: the chunk kernel and
        the reduction, as before the fused kernel (the same Python otherwise)."""
        bplan.fused = None
        try:
            return K.gate_residual_backward(go, g, y, i)
        finally:
            bplan.fused = fused
    leaves = [t_.detach().requires_grad_() for t_ in (r, g, y)]

    def ours_step():
        o = K.gate_residual(leaves[0], leaves[1], leaves[2], i)
        return torch.autograd.grad(o, leaves, go)

    def eager_step():
        o = leaves[0] + leaves[1].index_select(0, i) * leaves[2]
        return torch.autograd.grad(o, leaves, go)

    costs = {
        "forward": t(lambda: K.gate_residual_forward(r, g, y, i)),
        "forward_unchecked": t(lambda: K.gate_residual_forward(r, g, y, i, check_index=False)),
        "forward_autograd": t(lambda: K.gate_residual(leaves[0], leaves[1], leaves[2], i)),
        "forward_autograd_function_apply": t(lambda: K.GateResidual.apply(
            leaves[0], leaves[1], leaves[2], i)),
        "forward.key_and_lookup": t(lambda: K._FORWARD_PLANS.get(
            K._key(r, g, y, i, K.FLAG_ASSERT))),
        "forward.density_check": t(lambda: K._dense(r, g, y, i)),
        "forward.allocate_out": t(lambda: torch.empty_like(r)),
        "forward.pointers_and_stream": t(lambda: (out.data_ptr(), r.data_ptr(), g.data_ptr(),
                                                  y.data_ptr(), i.data_ptr(),
                                                  P._raw_stream(device))),
        "forward.packed_launch": t(lambda: launch.fast(stream, *ptrs)),
        "backward": t(lambda: K.gate_residual_backward(go, g, y, i)),
        "backward_unchecked": t(lambda: K.gate_residual_backward(go, g, y, i,
                                                                 check_index=False)),
        "backward_two_launches": t(two_launches),
        "backward.allocate_grads": t(lambda: (torch.empty_like(go), torch.empty_like(g))),
        "backward.scratch_lookup": t(lambda: bplan.scratch(stream, go.device)),
        **({"backward.fused_launch": t(lambda: fused.fast(stream, *fptrs))}
           if fused is not None else {}),
        "backward.chunk_launch": t(lambda: chunk_launch.fast(stream, *bptrs)),
        "backward.reduce_launch": t(lambda: bplan.reduce.fast(stream, gg, partial)),
        "forward_backward_autograd_ours": t(ours_step),
        "forward_backward_autograd_eager": t(eager_step),
        "eager_forward": t(lambda: r + g.index_select(0, i) * y),
    }
    if cuda:
        costs.update(replaced_launch_paths(r, g, y, i, calls=calls, repeats=repeats))
    return costs


def replaced_launch_paths(r, g, y, i, *, calls: int, repeats: int) -> dict[str, float]:
    """µs per forward launch by the paths the packed launch replaced (GPU only): numba's
    dispatcher on array views, and ``Launcher.__call__`` (buffer built per call, eleven
    ctypes arguments), both without checks or allocation."""
    import numpy as np
    from numba import cuda

    from gate_residual_matrix.kernels import gate_residual as K

    out = torch.empty_like(r)
    sink = K._flags(out.device)[1]
    words = [t.view(torch.int32).view(-1, t.shape[1] * t.element_size() // 4)
             for t in (out, r, g, y)]
    dtype = K._dtype_name(out)

    def numba_dispatch():
        out_w, r_w, g_w, y_w = (cuda.as_cuda_array(t, sync=False).view(np.uint32) for t in words)
        K.launch_forward_vec(out_w, r_w, g_w, y_w, cuda.as_cuda_array(i, sync=False), dtype,
                             cuda.external_stream(torch.cuda.current_stream().cuda_stream),
                             flag=cuda.as_cuda_array(sink, sync=False))

    def t(fn) -> float:
        return per_call_us(fn, calls=max(calls // 10, 50), repeats=repeats,
                           sync=torch.cuda.synchronize)

    return {"replaced.numba_dispatcher": t(numba_dispatch),
            "replaced.launcher_call": t(lambda: K._launch_forward(out, r, g, y, i, sink))}


def host_overhead(device: str, *, quick: bool = False) -> dict:
    """:func:`host_costs` at N = 1 (bf16, the matrix's D = 5376 and G = 9, the contract's
    inputs): on the GPU as it is, on the CPU under :func:`emulate_on_cpu`. Returns
    ``{"how": ..., "per_call_us": {what: µs}}``; ``quick``: 50 calls x 2 rounds."""
    from gate_residual_matrix import ops
    from gate_residual_matrix.contract.inputs import build

    x = build(ops.get("gate_residual"), n=1, sizes={"D": 5376, "G": 9}, dtype="bfloat16",
              index_dtype="int64", seed=2).tensors
    calls, repeats = (50, 2) if quick else (1000, 5)
    if device == "cuda":
        x = {k: v.to("cuda") for k, v in x.items()}
        how = "perf_counter over back-to-back calls, the least of the rounds, on the GPU"
        return {"how": how, "per_call_us": host_costs(x, calls=calls, repeats=repeats)}
    with emulate_on_cpu():
        costs = host_costs(x, calls=calls, repeats=repeats)
    return {"how": "CPU tensors, the driver call replaced by a no-op C function "
                   "(bench/host.py)", "per_call_us": costs}


def main(argv: list[str] | None = None) -> int:
    """Print the host time per call (µs) of each entry point and part; ``--quick``: fewer
    calls. Returns 0."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m gate_residual_matrix.bench.host",
                                description=main.__doc__)
    p.add_argument("--quick", action="store_true", help="50 calls x 2 rounds per figure")
    args = p.parse_args(argv)
    host = host_overhead("cuda" if torch.cuda.is_available() else "cpu", quick=args.quick)
    print(f"host time per call (µs; {host['how']}):")
    for k, v in host["per_call_us"].items():
        print(f"  {k:40s} {v:8.2f}")
    return 0


__all__ = ["emulate_on_cpu", "host_costs", "host_overhead", "main", "noop_launch_ex",
           "per_call_us", "replaced_launch_paths"]


if __name__ == "__main__":
    raise SystemExit(main())
