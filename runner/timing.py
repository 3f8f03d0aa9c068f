"""Median wall time of a callable on the GPU (CUDA events) or the CPU (perf_counter).

Used by the cell runner's timings and by ``ops.gate_residual.bench``; METHOD.md of the device tool:
warm up first, time each call, take the median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[int], object], *, device: str, warmup: int, iters: int,
              max_seconds: float = 10.0) -> dict:
    """Median milliseconds of ``fn(i)`` (i = the call's number, for rotating buffers).

    ``warmup`` untimed calls, then up to ``iters`` timed ones, stopping early once
    ``max_seconds`` of timed calls have passed (so slow CPU cells stay bounded). On "cuda"
    each call sits between two CUDA events on the current stream and all are read after one
    synchronisation. Returns ``{"median_ms", "min_ms", "iters"}``.
    """
    for i in range(warmup):
        fn(i)
    samples: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        pairs = []
        start_wall = time.perf_counter()
        for i in range(iters):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn(warmup + i)
            end.record()
            pairs.append((begin, end))
            if time.perf_counter() - start_wall > max_seconds:
                break
        torch.cuda.synchronize()
        samples = [b.elapsed_time(e) for b, e in pairs]
    else:
        start_wall = time.perf_counter()
        for i in range(iters):
            t0 = time.perf_counter()
            fn(warmup + i)
            samples.append((time.perf_counter() - t0) * 1e3)
            if time.perf_counter() - start_wall > max_seconds:
                break
    return {"median_ms": statistics.median(samples), "min_ms": min(samples),
            "iters": len(samples)}
