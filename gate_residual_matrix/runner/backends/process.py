"""The cell process: ``python -m gate_residual_matrix cell ...``, the command every backend runs
per cell.

In this order, each step before the next can go wrong: record the environment the backend
set (:func:`runner.cell.modes.snapshot`, before torch is imported); load the matrix and select
exactly one cell; apply the mode's torch settings before any CUDA call; refuse ``cuda``
without a GPU; start the lifetime guard (:mod:`runner.backends.lifetime`: the cell dies with its
runner and at its deadline); run the cell (:func:`runner.cell.run.run_cell`), writing a
``partial`` report after each case that leaves cases missing and one progress line the
runner shows; write the final report. ``GATE_RESIDUAL_CPROFILE=DIR`` profiles the run into
``DIR/<cell id>-<pid>.prof``, one file per process of a sharded cell (docs/performance.md).

Example (what the host backend runs)::

    python -m gate_residual_matrix cell --matrix matrix.yaml --stack host --mode plain --target cpu
    \\
        --reports reports/.run-ab12 --run-id ab12 --case 257
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gate_residual_matrix import settings
from gate_residual_matrix.runner.errors import ConfigError

__all__ = ["run_cell_process"]


def run_cell_process(matrix_path: Path, reports_dir: Path, *, stacks: Sequence[str] | None,
                     modes: Sequence[str] | None, targets: Sequence[str] | None,
                     cases: Sequence[str] | None, run_id: str = "",
                     timings: bool = True) -> tuple[str, str, Path]:
    """Run the one cell that ``stacks``, ``modes`` and ``targets`` select, in this process;
    return its id, its status and the report's path.

    Raises:
        ConfigError: the selection is not exactly one cell, or its target is ``cuda`` and
            torch sees no GPU (nothing is written then).
    """
    from gate_residual_matrix.contract import gpu_budget
    from gate_residual_matrix.runner.backends import lifetime
    from gate_residual_matrix.runner.cell import heartbeat
    from gate_residual_matrix.runner.cell import modes as mode_setup
    from gate_residual_matrix.runner.cell.progress import progress_line

    start = mode_setup.snapshot()  # before torch is imported: what the backend put in the env
    import torch

    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.cell.run import run_cell
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.plan.cells import expand, select, select_cases
    from gate_residual_matrix.runner.reports import store as report_io

    matrix = load_matrix(matrix_path, known_implementations=implementations.known)
    cells = select(expand(matrix), stacks=stacks, modes=modes, targets=targets)
    if len(cells) != 1:
        raise ConfigError(f"cell: the selection matches {len(cells)} cells; name one stack, "
                          "mode and target")
    cell = cells[0]
    mode = matrix.modes[cell.mode]
    applied = mode_setup.apply_torch_settings(mode.torch)  # before any CUDA call
    if cell.target == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--target: cuda was requested but torch sees no CUDA device here")
    lifetime.start_watchdog()
    before_torch = not start.torch_imported

    def checkpoint(partial: dict[str, Any], progress: dict[str, Any]) -> None:
        """After each case: the report so far goes to disk whole while cases are missing
        (the final report is written once, below), then one progress line the runner
        renders (runner/cell/progress.py)."""
        if partial["status"] == "partial":
            partial["environment"]["mode_applied_before_torch_import"] = before_torch
            report_io.write_report(partial, reports_dir)
        print(progress_line(cell.id, progress), flush=True)
        heartbeat.said()

    def run() -> dict[str, Any]:
        # on a GPU host's shared GPU: this process's base share of its memory, for its life
        with gpu_budget.reserve(gpu_budget.BASE_MIB if cell.target == "cuda" else 0, "base"):
            return run_cell(matrix, cell, select_cases(matrix, cases), run_id=run_id,
                            timings=timings,
                            mode_environment=mode_setup.mode_environment(cell.mode, mode,
                                                                         start, applied),
                            on_case=checkpoint, expected=_case_seconds(reports_dir, cell.id))

    profile_dir = settings.get("GATE_RESIDUAL_CPROFILE")
    if profile_dir:  # where the cell's own time goes, beyond its phases (docs/performance.md)
        import cProfile

        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        with cProfile.Profile() as prof:
            report = run()
        prof.dump_stats(Path(profile_dir) / f"{cell.id}-{os.getpid()}.prof")
    else:
        report = run()
    report["environment"]["mode_applied_before_torch_import"] = before_torch
    path = report_io.write_report(report, reports_dir)
    return cell.id, str(report["status"]), path


def _case_seconds(reports_dir: Path, cell_id: str) -> dict[str, float] | None:
    """Seconds per case of the cell's previous report (``phases.cases``) in the reports folder
    ``reports_dir`` is, or whose staging folder it is (``.run-<id>``, ``shard-<i>``;
    runner/backends/staging.py), from whichever machine ran the cell (the estimate scales
    them to this run's speed), when that report has cases that ran (ok, partial, mismatch),
    else None. A guide for the time-left estimate only, never for a result."""
    from gate_residual_matrix.runner.reports import store as report_io

    folder = Path(reports_dir)
    while folder.name.startswith((".run-", "shard-")):  # a stage: the reports folder above
        folder = folder.parent
    loaded = report_io.read_report(folder / f"{cell_id}.json")
    data = loaded.data if loaded.ok else None
    if not data or data.get("status") not in ("ok", "partial", "mismatch"):
        return None
    cases = (data.get("phases") or {}).get("cases")
    if not isinstance(cases, dict):
        return None
    return {str(k): float(v) for k, v in cases.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}

