"""A/B on one machine: the batch-invariance checks with one call per stretch of shared GPU
work against several, with several processes sharing the GPU under one GPU lock.

Usage (from the repository root; on a GPU host after ``scripts/gpu_host.sh --steps env``)::

    python scripts/stretch_ab.py [--matrix matrix-rms-norm.yaml] [--impl eager]
        [--impl liger_rms_norm_llama-0.8.5] [--n 4097] [--procs 8] [--checks 2]
        [--per-stretch 1 --per-stretch 8] [--rounds 2] [--target cuda]

For each round and each ``--per-stretch`` value (in turn, so both see the same machine),
``--procs`` processes start together, each with the same lock file
(``GATE_RESIDUAL_GPU_LOCK``), build one case's inputs (``--n`` rows, the matrix's sizes and
problem dtype, seed 0), run every ``--impl`` once untimed (its kernels compiled and loaded),
wait for the others, then run :func:`runner.cell.batch_invariance.check` ``--checks`` times
on each implementation with ``CALLS_PER_STRETCH`` set to the value. The figure is the wall
time from the common start to the last process's end. Prints one line per (round, value)
and the median ratio of each value to the first; exit 0. The checks' results must be the
same for every value (exit 1 with the difference otherwise).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _worker(args, per_stretch: int, lock: str, barrier, out) -> None:
    os.environ["GATE_RESIDUAL_GPU_LOCK"] = lock
    from gate_residual_matrix import ops
    from gate_residual_matrix.contract.inputs import build
    from gate_residual_matrix.runner.cell import batch_invariance, catalog
    from gate_residual_matrix.runner.config.matrix import load_matrix

    matrix = load_matrix(args.matrix, known_implementations=catalog.known)
    spec = ops.get(matrix.op)
    p = matrix.problem
    rows = {r.name: r for r in catalog.rows(matrix)}
    impls = [rows[name] for name in args.impl]
    x = build(spec, n=args.n, sizes=p.sizes, dtype=p.dtype, index_dtype=p.index_dtype,
              seed=0).tensors
    x = {k: v.to(args.target) for k, v in x.items()}
    batch_invariance.CALLS_PER_STRETCH = per_stretch
    limit = matrix.batch_invariance.max_size if matrix.batch_invariance else 1025
    for impl in impls:  # compiled and loaded before the clock
        impl.run({k: v.clone() for k, v in x.items()}, backward=impl.has_backward)
    barrier.wait()
    began = time.perf_counter()
    got = []
    for _ in range(args.checks):
        got += [batch_invariance.check(impl, x, spec, max_size=limit) for impl in impls]
    out.put((time.perf_counter() - began, got))


def _round(args, per_stretch: int) -> tuple[float, list]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.procs + 1)
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        lock = str(Path(tmp) / "gpu.lock")
        procs = [ctx.Process(target=_worker, args=(args, per_stretch, lock, barrier, out))
                 for _ in range(args.procs)]
        for proc in procs:
            proc.start()
        barrier.wait()
        began = time.perf_counter()
        results = [out.get() for _ in procs]
        wall = time.perf_counter() - began
        for proc in procs:
            proc.join()
    return wall, [r for _, got in results for r in got]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="matrix-rms-norm.yaml")
    parser.add_argument("--impl", action="append", default=None)
    parser.add_argument("--n", type=int, default=4097)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--checks", type=int, default=2)
    parser.add_argument("--per-stretch", type=int, action="append", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", default="cuda")
    args = parser.parse_args(argv)
    args.impl = args.impl or ["eager"]
    values = args.per_stretch or [1, 8]
    walls: dict[int, list[float]] = {v: [] for v in values}
    first = None
    for number in range(1, args.rounds + 1):
        for value in values:
            wall, got = _round(args, value)
            walls[value].append(wall)
            print(f"round {number}: {value} call(s) per stretch: {wall:.2f} s "
                  f"({args.procs} processes, {args.checks} check(s) of "
                  f"{', '.join(args.impl)} at N = {args.n})", flush=True)
            if first is None:
                first = got
            elif got != first:
                print(f"error: the checks differ with {value} call(s) per stretch: {got} "
                      f"against {first}", file=sys.stderr)
                return 1
    base = statistics.median(walls[values[0]])
    for value in values:
        print(f"{value} call(s) per stretch: median {statistics.median(walls[value]):.2f} s, "
              f"{statistics.median(walls[value]) / base:.3f} x {values[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
