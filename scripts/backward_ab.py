"""Kernel-only A/B timings of gate_residual's backward on one GPU, in one process.

What docs/performance.md's "Second round" section needs to judge the backward's launches,
each pair timed in the same run, GPU time only: each variant's launches are captured
``--reps`` times into a CUDA graph (fixed pointers, no Python between them), the graph is
replayed ``--iters`` times between CUDA events, and the median per repetition is reported
(µs).

* ``fused``: at N = 1 .. 4097 (bf16), the fused backward (one launch) against the chunk
  kernel then the reduction, on the same plan and pointers; where the plan does not fuse
  (more than FUSED_MAX_CHUNKS chunks) the fused launch is built for the comparison;
* ``reduce``: at N = 32768 the chunk reduction (the project's kernel) with 256 and 128
  threads per block;
* ``chunks``: at N = 32768 the vector chunk kernel alone at other launch shapes (block
  width, grid.y cap): the default against the alternatives, for a later choice.

Every kernel is the project's (kernels/gate_residual_kernels.py, gate_residual_vec.py),
launched as its plans launch them.

Each variant's outputs are compared bit for bit (integer views) with the default's; a
difference is printed and makes the exit status 1. ``--dry`` runs every code path once on
CPU tensors with the driver call replaced (bench/host.py), no timing.

    python scripts/backward_ab.py [--out FILE.json] [--reps 20] [--iters 30] [--dry]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

D, G = 5376, 9
FAILURES: list[str] = []


def timer(dry: bool, reps: int, iters: int):
    """``time(fn) -> µs per call of fn`` (fn launches on the current stream)."""
    def time_graph(fn) -> float | None:
        if dry:
            fn()
            return None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up, outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
        return statistics.median(times)
    return time_graph


def same(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    if not torch.equal(a.view(ints), b.view(ints)):
        FAILURES.append(name)
        print(f"BITS DIFFER: {name}", flush=True)


def inputs(n: int, device: str, dtype=torch.bfloat16) -> dict:
    gen = torch.Generator().manual_seed(n)
    x = {k: torch.randn(n, D, generator=gen).to(dtype).to(device) for k in ("grad_out", "y")}
    x["gate"] = torch.randn(G, D, generator=gen).to(dtype).to(device)
    x["index"] = torch.randint(0, G, (n,), generator=gen).to(device)
    return x


def now() -> int:
    """The current stream (a graph capture switches it)."""
    from gate_residual_matrix.kernels import gate_residual_plans as P

    return P._raw_stream(0)


def plan_of(x):
    from gate_residual_matrix.kernels import gate_residual as K

    K.gate_residual_backward(x["grad_out"], x["gate"], x["y"], x["index"], check_index=False)
    return K._BACKWARD_PLANS.get(K._key(x["grad_out"], x["gate"], x["y"], x["index"],
                                        K.FLAG_CLEAN))


def fused_vs_two(time, device: str, stream: int) -> list[dict]:
    from gate_residual_matrix.kernels import gate_residual_backward_plan as B
    from gate_residual_matrix.kernels.gate_residual_plans import _launcher

    rows = []
    for n in (1, 129, 257, 1024, 2048, 4097):
        x = inputs(n, device)
        plan = plan_of(x)
        fused = plan.fused
        if fused is None:  # built for the comparison only (the plan does not fuse here)
            grid, block, shared = plan._vector_geometry()
            plan.tickets = grid[0]
            fused = _launcher("vec", 2, x["gate"].dtype, x["index"].dtype).packed(
                plan.device, grid, block, shared, plan._fused_params())
        partial, ticket, _ = plan.scratch(stream, x["gate"].device)
        gy, gg = torch.empty_like(x["grad_out"]), torch.empty_like(x["gate"])
        gy2, gg2 = torch.empty_like(gy), torch.empty_like(gg)
        ins = tuple(x[k].data_ptr() for k in ("grad_out", "gate", "y", "index"))
        chunks = plan.vector_chunks()

        def one(gy=gy, gg=gg, fused=fused, partial=partial, ticket=ticket, ins=ins):
            fused.fast(now(), gy.data_ptr(), gg.data_ptr(), partial, ticket, *ins)

        def two(gy=gy2, gg=gg2, chunks=chunks, plan=plan, partial=partial, ins=ins):
            chunks.fast(now(), gy.data_ptr(), partial, *ins)
            plan.reduce.fast(now(), gg.data_ptr(), partial)

        t1, t2 = time(one), time(two)
        if device == "cuda":
            torch.cuda.synchronize()
            same(f"fused vs two launches N={n}: grad_y", gy, gy2)
            same(f"fused vs two launches N={n}: grad_gate", gg, gg2)
            assert not B._TICKETS[(plan.device, stream)].any(), "tickets left set"
        rows.append({"N": n, "chunks": plan.chunks, "fused_us": t1, "two_launches_us": t2,
                     "plan_fuses": plan.fused is not None})
        print(f"fused N={n:6d} chunks={plan.chunks:3d}: one launch {t1} µs, chunk kernel + "
              f"reduction {t2} µs", flush=True)
    return rows


def reduce_variants(time, device: str, stream: int, x: dict) -> list[dict]:
    from gate_residual_matrix.kernels.gate_residual_plans import _launcher, _p2, _p3

    plan = plan_of(x)
    partial, _, _ = plan.scratch(stream, x["gate"].device)
    chunks = plan.vector_chunks()
    gy = torch.empty_like(x["grad_out"])
    chunks.fast(stream, gy.data_ptr(), partial, *(x[k].data_ptr() for k in
                                                   ("grad_out", "gate", "y", "index")))
    params = [*_p2(None, G, D, 2), *_p3(partial, plan.chunks, G, D)]
    launcher = _launcher("elements", 2, torch.bfloat16, torch.int64)
    name = "16 loads in flight"
    rows, ref = [], None
    for block in (256, 128):
        grid = -(-G * D // block)
        launch = launcher.packed(plan.device, (grid, 1), block, 0, params)
        out = torch.empty_like(x["gate"])
        t = time(lambda launch=launch, out=out: launch.fast(now(), out.data_ptr()))
        if device == "cuda":
            torch.cuda.synchronize()
            ref = out if ref is None else ref
            same(f"reduce {name} block {block}", out, ref)
        rows.append({"variant": name, "block": block, "us": t})
        print(f"reduce N=32768: {name}, {block} threads: {t} µs", flush=True)
    return rows


def chunk_shapes(time, device: str, stream: int, x: dict) -> list[dict]:
    from gate_residual_matrix.kernels import gate_residual as K

    plan = plan_of(x)
    partial, _, _ = plan.scratch(stream, x["gate"].device)
    rows, ref = [], None
    base = plan._chunk_params(vec=True)
    for block_cols, cap in ((None, 65535), (None, 128), (64, 65535), (64, 128), (128, 65535),
                            (32, 65535)):
        lanes = plan._lanes()
        try:
            grid, block, shared = K.backward_vec_geometry(plan.chunks, D * 2 // 16, G, lanes,
                                                          block_cols, cap)
        except ValueError as err:
            print(f"chunks: block {block_cols}: {err}")
            continue
        launch = K._launcher("vec", 1, torch.bfloat16, torch.int64).packed(
            plan.device, grid, block, shared, base)
        gy = torch.empty_like(x["grad_out"])
        ptrs = (gy.data_ptr(), partial, *(x[k].data_ptr() for k in
                                          ("grad_out", "gate", "y", "index")))
        t = time(lambda launch=launch, ptrs=ptrs: launch.fast(now(), *ptrs))
        if device == "cuda":
            torch.cuda.synchronize()
            ref = gy if ref is None else ref
            same(f"chunk kernel block {block} grid {grid}", gy, ref)
        nbytes = 3 * x["grad_out"].numel() * 2 + plan.workspace_bytes
        rows.append({"block": block, "grid": list(grid), "shared": shared, "us": t,
                     "GBps": nbytes / (t * 1e-6) / 1e9 if t else None})
        print(f"chunks N=32768: block {block}, grid {grid}, shared {shared} B: {t} µs",
              flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    import contextlib

    from gate_residual_matrix.bench.host import emulate_on_cpu

    device = "cpu" if args.dry else "cuda"
    context = emulate_on_cpu() if args.dry else contextlib.nullcontext()
    with context:
        from gate_residual_matrix.kernels import gate_residual_plans as P

        stream = P._raw_stream(0) if device == "cuda" else 0
        time = timer(args.dry, args.reps, args.iters)
        big = inputs(32768 if device == "cuda" else 1153, device)
        doc = {"fused_vs_two_launches": fused_vs_two(time, device, stream),
               "reduce": reduce_variants(time, device, stream, big),
               "chunk_shapes": chunk_shapes(time, device, stream, big),
               "bits_differ": FAILURES,
               "gpu": torch.cuda.get_device_name() if device == "cuda" else None}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    print("bits: " + ("every variant equal to the default" if not FAILURES else
                      f"{len(FAILURES)} differ"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
