"""Median wall time of a callable on the GPU (CUDA events) or the CPU (perf_counter).

Used by the cell runner's timings and by the benchmark (:mod:`bench`), with the usual method of
GPU timing: warm up first, time each call, take the median.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch


def median_ms(fn: Callable[[int], object], *, device: str, warmup: int, iters: int,
              max_seconds: float = 10.0, samples: bool = False) -> dict:
    """Median milliseconds of ``fn(i)`` (i = the call's number, for rotating buffers).

    ``warmup`` untimed calls, then up to ``iters`` timed ones, stopping early once
    ``max_seconds`` of timed calls have passed (so slow CPU cells stay bounded). On "cuda"
    each call sits between two CUDA events on the current stream and all are read after one
    synchronisation. Returns ``{"median_ms", "min_ms", "iters"}``; with ``samples=True`` also
    ``"samples_ms"``, every timed call's milliseconds in call order (for pooling samples over
    several calls of this function, as the benchmark's interleaved rounds do).
    Raises whatever ``fn`` raises.

    Example::

        median_ms(lambda i: x.add_(1), device="cpu", warmup=2, iters=10)["median_ms"]
    """
    for i in range(warmup):
        fn(i)
    taken: list[float] = []
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
        taken = [b.elapsed_time(e) for b, e in pairs]
    else:
        start_wall = time.perf_counter()
        for i in range(iters):
            t0 = time.perf_counter()
            fn(warmup + i)
            taken.append((time.perf_counter() - t0) * 1e3)
            if time.perf_counter() - start_wall > max_seconds:
                break
    out: dict = {"median_ms": statistics.median(taken), "min_ms": min(taken),
                 "iters": len(taken)}
    if samples:
        out["samples_ms"] = taken
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values``, interpolated linearly between
    the two nearest order statistics (numpy's default, ``statistics.quantiles``'s
    "inclusive"): ``percentile(v, 50)`` is the median. Raises ValueError on no values or a
    ``q`` outside [0, 100].

    Example: ``percentile([1.0, 2.0, 3.0, 4.0], 25) == 1.75``.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
