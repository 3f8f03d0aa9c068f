"""Benchmark: gate_residual forward and forward+backward against the copy bandwidth.

``python -m runner.bench`` (``nox -s bench``) measures, in one process:

* the device-to-device copy bandwidth (bytes read + written, a 2 GiB buffer), the ceiling;
* for each dtype and N: eager, ``torch.compile`` and our numba kernels, forward and
  forward+backward, with :func:`runner.timing.median_ms` (CUDA events, warm-up, median),
  input sets rotated so that the bytes touched per round exceed 3x the L2 cache;
* the host-side cost of one numba forward call, split into input checks, the numba array
  views and the launch (``perf_counter`` over many calls).

Bytes that must move (``docs/performance.md``): forward reads ``residual`` and ``y`` and
writes ``out``: 3*N*D*itemsize (``gate`` and ``index`` are small); backward reads
``grad_out`` and ``y`` and writes ``grad_y``: 3*N*D*itemsize more (``grad_residual`` is
``grad_out`` itself). Ratios are taken within one run. Results go to ``<out>/bench-<gpu>.json``
and a table on stdout. On a host without a GPU, ``--smoke`` runs the same code path on the
CPU with tiny shapes (CI uses it so the code cannot rot; no figure from it means anything).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

from ops.gate_residual.inputs import make_inputs
from runner import environment
from runner.implementations import get
from runner.timing import median_ms

L2_BYTES = 60 * 2**20  # H200 (KINDS.md: 60 MB of L2); rotation keeps 3x this in flight


def copy_bandwidth(device: str, nbytes: int, iters: int) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = median_ms(lambda _i: dst.copy_(src), device=device, warmup=5, iters=iters)
    return 2 * nbytes / (t["median_ms"] * 1e-3)


def input_sets(n: int, d: int, g: int, dtype: str, device: str, seed: int) -> list[dict]:
    """Enough independent input sets that one round over them touches > 3x the L2."""
    base = make_inputs(n=n, d=d, g=g, dtype=dtype, index_dtype="int64", seed=seed).tensors
    per_set = sum(t.numel() * t.element_size() for t in base.values())
    count = max(1, min(64, math.ceil(3 * L2_BYTES / max(per_set, 1))))
    first = {k: v.to(device) for k, v in base.items()}
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(count - 1)]


def compiled_forward():
    """``torch.compile`` of the eager expression (inductor defaults), built once."""
    def expr(residual, gate, y, index):
        return residual + gate.index_select(0, index) * y

    return torch.compile(expr)


def host_overhead_us(sets: list[dict], calls: int = 300) -> dict:
    """Microseconds of host time per numba forward call (N = 1): numba's own dispatcher on
    array views (what a plain ``kernel[grid, block](...)`` costs), our launcher with each of
    kernels/launch.py's LAUNCH_METHODS, the synchronising index check, and the whole entry
    point with each ``check_index`` setting."""
    from numba import cuda

    from kernels import gate_residual as K
    from kernels.checks import check_inputs

    x = sets[0]
    args = (x["residual"], x["gate"], x["y"], x["index"])

    def per_call(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed / calls * 1e6

    out = torch.empty_like(x["residual"])
    dtype = K._dtype_name(out)
    words = [t.view(torch.int32).view(-1, t.shape[1] * t.element_size() // 4)
             for t in (out, *args[:3])]
    sink = K._flags(out.device)[1]

    def numba_dispatch():
        views = [cuda.as_cuda_array(t, sync=False).view(np.uint32) for t in words]
        K.launch_forward_vec(*views, cuda.as_cuda_array(args[3], sync=False), dtype,
                             cuda.external_stream(torch.cuda.current_stream().cuda_stream),
                             flag=cuda.as_cuda_array(sink, sync=False))

    def direct(method: str) -> float:
        launcher = K._launcher("vec", 0, out.dtype, args[3].dtype)
        default, launcher.method = launcher.method, method
        try:
            return per_call(lambda: K._launch_forward(out, *args, sink))
        finally:
            launcher.method = default

    return {
        "numba_dispatch_us": per_call(numba_dispatch),
        "core_launch_us": direct("core"),
        "driver_launch_us": direct("driver"),
        "ctypes_launch_us": direct("ctypes"),
        "sync_index_check_us": per_call(lambda: check_inputs(*args, device="cuda")),
        "entry_point_us": per_call(lambda: K.gate_residual_forward(*args)),
        "entry_point_sync_check_us": per_call(
            lambda: K.gate_residual_forward(*args, check_index="sync")),
        "entry_point_unchecked_us": per_call(
            lambda: K.gate_residual_forward(*args, check_index=False)),
    }


def forward_launch_sweep(n: int, d: int, g: int, dtype: str, device: str, *, iters: int,
                         warmup: int, caps=(65535, 8192, 2048)) -> list[dict]:
    """The vectorised forward kernel alone (no checks, no allocation) for each grid.y cap: a
    block then walks ceil(N / (2 * cap)) steps of two rows. Launch shape only; the bits do
    not move (tests/test_kernels_gpu.py)."""
    from kernels import gate_residual as K

    sets = input_sets(n, d, g, dtype, device, 1)
    outs = [torch.empty_like(x["residual"]) for x in sets]
    sink = K._flags(outs[0].device)[1]
    itemsize = outs[0].element_size()
    rows = []
    for cap in caps:
        def call(i, cap=cap):
            x, out = sets[i % len(sets)], outs[i % len(sets)]
            K._launch_forward(out, x["residual"], x["gate"], x["y"], x["index"], sink,
                              max_grid_y=cap)

        t = median_ms(call, device=device, warmup=warmup, iters=iters)
        rows.append({"dtype": dtype, "N": n, "impl": f"numba fwd kernel, grid.y<={cap}",
                     "forward_ms": t["median_ms"],
                     "forward_GBps": 3 * n * d * itemsize / t["median_ms"] / 1e6})
    return rows


def backward_alone(n: int, d: int, g: int, dtype: str, device: str, *, iters: int,
                   warmup: int) -> dict:
    """``gate_residual_backward`` alone (both kernels, the partials' allocation, no autograd;
    ``check_index=False``, as autograd's backward runs it: the forward checked the index):
    its time and bandwidth over the 3*N*D elements it must move."""
    from kernels import gate_residual as K

    sets = input_sets(n, d, g, dtype, device, 1)
    itemsize = sets[0]["residual"].element_size()

    def call(i):
        x = sets[i % len(sets)]
        K.gate_residual_backward(x["grad_out"], x["gate"], x["y"], x["index"],
                                 check_index=False)

    t = median_ms(call, device=device, warmup=warmup, iters=iters)
    return {"dtype": dtype, "N": n, "impl": "numba backward alone", "backward_ms": t["median_ms"],
            "backward_GBps": 3 * n * d * itemsize / t["median_ms"] / 1e6}


def forward_backward(name: str, device: str):
    """One forward + backward step of ``name`` ("eager" or "numba") through autograd:
    ``torch.autograd.grad(out, (residual, gate, y), grad_out)``. Not ``out.backward()``,
    whose AccumulateGrad would copy ``grad_out`` into ``residual.grad`` (the caller still
    holds it): a copy of N*D elements that is autograd's, not the op's, for every
    implementation alike (docs/performance.md)."""
    if name == "eager":
        def op(r, g, y, i):
            return r + g.index_select(0, i) * y
    elif device == "cuda":
        from kernels.gate_residual import GateResidual
        op = GateResidual.apply
    else:
        from kernels.gate_residual_cpu import GateResidualCPU
        op = GateResidualCPU.apply

    def step(x):
        r, g, y = (x[k].detach().requires_grad_() for k in ("residual", "gate", "y"))
        out = op(r, g, y, x["index"])
        return torch.autograd.grad(out, (r, g, y), x["grad_out"])

    return step


def bench_case(n: int, d: int, g: int, dtype: str, device: str, *, iters: int, warmup: int,
               with_compile: bool, seed: int = 1) -> list[dict]:
    """One row per implementation: forward and forward+backward medians for one shape."""
    sets = input_sets(n, d, g, dtype, device, seed)
    itemsize = sets[0]["residual"].element_size()
    fwd_bytes = 3 * n * d * itemsize
    rows = []
    impls = {"eager": get("eager").run, "numba": get("numba").run}
    if with_compile:
        fn = compiled_forward()
        impls["compiled"] = lambda x, backward: {"out": fn(x["residual"], x["gate"], x["y"],
                                                           x["index"])}
    for name, run in impls.items():
        kw = {"device": device, "warmup": warmup, "iters": iters}
        fwd = median_ms(lambda i, r=run: r(sets[i % len(sets)], backward=False), **kw)
        row = {"dtype": dtype, "N": n, "D": d, "G": g, "impl": name, "sets": len(sets),
               "forward_ms": fwd["median_ms"], "forward_GBps": fwd_bytes / fwd["median_ms"] / 1e6}
        if name != "compiled":
            step = forward_backward(name, device)
            both = median_ms(lambda i, f=step: f(sets[i % len(sets)]), **kw)
            row["forward_backward_ms"] = both["median_ms"]
            row["forward_backward_GBps"] = 2 * fwd_bytes / both["median_ms"] / 1e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON. Returns 0."""
    parser = argparse.ArgumentParser(prog="python -m runner.bench", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("reports/bench"))
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (CI)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: the benchmark needs a GPU (--smoke runs its code path "
                     "on tiny CPU shapes, and its figures mean nothing)")
    device = "cpu" if args.smoke else "cuda"
    d, g = (64, 3) if device == "cpu" else (5376, 9)
    plan = [("bfloat16", n) for n in ((1, 257, 4097, 32768) if device == "cuda" else (1, 257))]
    if device == "cuda":
        plan += [("float16", 32768), ("float32", 32768)]
    iters, warmup = (3, 1) if device == "cpu" else (args.iters, args.warmup)
    copy = copy_bandwidth(device, (2 << 30) if device == "cuda" else (8 << 20), iters)
    rows = []
    for dtype, n in plan:
        with_compile = device == "cuda" and not args.no_compile and (n in (1, 257, 32768))
        rows += bench_case(n, d, g, dtype, device, iters=iters, warmup=warmup,
                           with_compile=with_compile)
    if device == "cuda":
        rows += forward_launch_sweep(32768, d, g, "bfloat16", device, iters=iters,
                                     warmup=warmup)
        for dtype in ("bfloat16", "float16", "float32"):
            rows.append(backward_alone(32768, d, g, dtype, device, iters=iters, warmup=warmup))
    by_key = {(r["dtype"], r["N"], r["impl"]): r for r in rows}
    for r in rows:
        eager = by_key[(r["dtype"], r["N"], "eager")]
        if "forward_ms" in r:
            r["forward_vs_eager"] = eager["forward_ms"] / r["forward_ms"]
        if "forward_GBps" in r:
            r["forward_copy_fraction"] = r["forward_GBps"] * 1e9 / copy
        if "backward_GBps" in r:
            r["backward_copy_fraction"] = r["backward_GBps"] * 1e9 / copy
        if "forward_backward_ms" in r:
            r["forward_backward_vs_eager"] = eager["forward_backward_ms"] / r["forward_backward_ms"]
            r["forward_backward_copy_fraction"] = r["forward_backward_GBps"] * 1e9 / copy
        compiled = by_key.get((r["dtype"], r["N"], "compiled"))
        if compiled and "forward_ms" in r:
            r["forward_vs_compiled"] = compiled["forward_ms"] / r["forward_ms"]
    overhead = None
    if device == "cuda":
        sets = input_sets(1, d, g, "bfloat16", device, 1)
        overhead = host_overhead_us(sets)
    env = environment.capture("cuda" if device == "cuda" else "cpu", {})
    doc = {"title": f"gate_residual benchmark ({env.get('gpu') or platform.processor()})",
           "device": device, "copy_GBps": copy / 1e9, "host_overhead_us": overhead,
           "environment": env, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    name = (env.get("gpu") or "cpu").replace(" ", "-").lower()
    path = args.out / f"bench-{name}{'-smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps(doc, indent=2))
    cols = ["dtype", "N", "impl", "forward_ms", "forward_copy_fraction", "forward_vs_eager",
            "forward_vs_compiled", "forward_backward_ms", "forward_backward_copy_fraction",
            "forward_backward_vs_eager", "backward_ms", "backward_copy_fraction"]
    print(f"copy bandwidth: {copy / 1e9:.0f} GB/s (read + write)")
    if overhead:
        print("host overhead per numba forward call (us): "
              + ", ".join(f"{k}={v:.1f}" for k, v in overhead.items()))
    print(tabulate([[r.get(c, "") for c in cols] for r in rows], headers=cols, floatfmt=".3f"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
