"""Where the host time of one small gate_residual call goes (run on a GPU machine).

At N = 1 and 257 the op is launch-bound: the CUDA-event time is the Python around a few µs
of GPU work. This prints, for the numba forward and forward+backward (through autograd, as
the runner calls them) and for eager, the wall time per call and cProfile's top entries.
Usage: ``python scripts/profile_host.py [N]``.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
from gate_residual_matrix.runner.cell.catalog import get

CALLS = 300


def main(n: int) -> None:
    x = {k: v.cuda() for k, v in make_inputs(n=n, d=5376, g=9, dtype="bfloat16",
                                              index_dtype="int64", seed=1).tensors.items()}
    for name in ("eager", "numba"):
        run = get(name).run
        for backward in (False, True):
            for _ in range(20):
                run(x, backward=backward)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                run(x, backward=backward)
            torch.cuda.synchronize()
            per_call = (time.perf_counter() - t0) / CALLS * 1e6
            print(f"{name:6s} {'fwd+bwd' if backward else 'fwd':7s} N={n}: {per_call:8.1f} us/call")
            if name == "numba":
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(CALLS):
                    run(x, backward=backward)
                torch.cuda.synchronize()
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
