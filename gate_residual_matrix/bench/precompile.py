"""Compile ahead for the benchmark: every op's ``torch.compile`` graphs and numba kernels
built by worker processes, all ops at once, before anything is timed.

The matrix cell's precompile (:mod:`runner.cell.precompile`) does the work: its workers make
each call once with zero inputs of the case's shapes, which fills inductor's and our cubin
on-disk caches; the benchmark's own first call of a case then loads what they compiled (the
same graphs: the key is the graph, the shapes, the settings and the versions). Compiling
costs only wall time (it happens in the untimed first call either way), so this is off where
it would not help (fewer than 2 workers; ``GATE_RESIDUAL_PRECOMPILE=0``).
"""

from __future__ import annotations

import concurrent.futures as futures

from gate_residual_matrix.bench.run import OpBench, plan


def calls(bench: OpBench) -> list[dict]:
    """The calls that compile ``bench``'s graphs and kernels on its cases: per peer that
    compiles per shape, per case, forward+backward (``train``, peers with a backward) and
    the forward (``no_grad``); per peer that caches its kernels on the bench's device, the
    first of these."""
    out = []
    index_dtype = bench.matrix.problem.index_dtype
    for peer in bench.table:
        impl = peer.impl
        target = bench.settings.device
        if impl is None or not (impl.compiles_per_shape or target in impl.cached_kernels):
            continue
        for dtype, n in plan(bench.settings):
            if not peer.takes(dtype):
                continue
            grads = (["train"] if impl.has_backward else []) + ["no_grad"]
            if not impl.compiles_per_shape:  # kernels per dtype pair: one call makes them
                grads = grads[:1]
            out += [{"impl": impl.name, "dtype": dtype, "index_dtype": index_dtype,
                     "rows": n, "grad": g} for g in grads]
    return out


def precompile(benches: list[OpBench], say=print) -> dict[str, dict]:
    """Run every op's :func:`calls` in one pool of workers shared out by calls (each op's
    part in its own :func:`runner.cell.precompile.run`, at the same time); returns each op's
    record (workers, calls, seconds, failed). Nothing where fewer than 2 workers would run."""
    from gate_residual_matrix.runner.cell import environment
    from gate_residual_matrix.runner.cell import precompile as cell_precompile

    work = [(b, calls(b)) for b in benches]
    work = [(b, items) for b, items in work if items and "plain" in b.matrix.modes]
    total = sum(len(items) for _, items in work)
    workers = cell_precompile.workers_for([None] * total, environment.available_cpus())
    if not workers:
        return {}
    say(f"precompile: {total} calls in {workers} workers", flush=True)

    def one(bench: OpBench, items: list[dict]) -> dict:
        share = max(1, round(workers * len(items) / total))
        return cell_precompile.run(items, torch_settings=bench.matrix.modes["plain"].torch
                                   .model_dump(), op=bench.op,
                                   sizes=bench.matrix.problem.sizes,
                                   target=bench.settings.device,
                                   workers=share)

    with futures.ThreadPoolExecutor(max_workers=len(work)) as pool:
        done = {b.op: pool.submit(one, b, items) for b, items in work}
        records = {op: f.result() for op, f in done.items()}
    for op, rec in records.items():
        failed = f", failed: {'; '.join(rec['failed'])}" if rec["failed"] else ""
        say(f"precompile {op}: {rec['calls']} calls, {rec['workers']} workers, "
            f"{rec['seconds']:.1f} s{failed}", flush=True)
    return records


__all__ = ["calls", "precompile"]
