"""Where one cell's time goes: run a cell in this process under cProfile and print the top
entries by cumulative and by own time (run on the machine whose cell is slow).

Usage::

    python scripts/profile_cell.py --target cuda --mode plain [--case 32768 ...] [--top 45]

The cell runs as ``python -m gate_residual_matrix cell`` would run it (every implementation of
matrix.yaml, repeats, batch invariance, timings), but nothing is written; the report's
``phases`` (when present) are printed too. GPU work is asynchronous, so cProfile charges it
to the host call that waits for it (``torch.equal``, ``.cpu()``, synchronisations).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    parser.add_argument("--stack", default="host")
    parser.add_argument("--mode", default="plain")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--case", action="append")
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()

    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.cell import modes
    from gate_residual_matrix.runner.cell.run import run_cell
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.plan.cells import expand, select, select_cases

    matrix = load_matrix(args.matrix, known_implementations=implementations.known)
    (cell,) = select(expand(matrix), stacks=[args.stack], modes=[args.mode],
                     targets=[args.target])
    modes.apply_torch_settings(matrix.modes[cell.mode].torch)
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    report = run_cell(matrix, cell, select_cases(matrix, args.case))
    profiler.disable()
    print(f"cell {cell.id}: {report['status']} in {time.perf_counter() - t0:.1f} s "
          f"({len(report['cases'])} cases)")
    if report.get("phases"):
        print(json.dumps(report["phases"], indent=1))
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(args.top)
        print(f"=== by {key}\n{out.getvalue()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
