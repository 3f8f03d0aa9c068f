"""The matrix run: load config → expand cells → select → run cells → reports → tables.

Each step is a function of :mod:`runner.config`, :mod:`runner.cells`, a backend and
:mod:`runner.report` / :mod:`runner.tables`; this module only strings them together, decides
which cells can run here (a ``cuda`` cell on a host without a GPU is ``skipped`` with the
reason, never a missing file) and which need not run again (same fingerprint, status ok).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from runner import report as report_io
from runner import tables
from runner.backends import BACKENDS
from runner.cell import fingerprint, skeleton
from runner.cells import expand, select, select_cases
from runner.config import load_matrix
from runner.environment import project_state
from runner.errors import ConfigError

DEFAULT_TIMEOUT_S = 3600.0


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (no CUDA context is created)."""
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class CellOutcome:
    """One row of the run summary."""

    cell: str
    status: str
    reason: str | None
    path: Path
    reused: bool = False


def _reusable(path: Path, expected_fingerprint: str) -> bool:
    if not path.exists():
        return False
    loaded = report_io.read_report(path)
    return bool(loaded.data and loaded.data.get("status") == "ok"
                and loaded.data.get("fingerprint") == expected_fingerprint)


def run_matrix(matrix_path: Path, *, reports_dir: Path, stacks: Sequence[str] | None = None,
               modes: Sequence[str] | None = None, targets: Sequence[str] | None = None,
               cases: Sequence[str] | None = None, backend: str = "host", force: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, render: bool = True) -> list[CellOutcome]:
    """Run the selected cells and write one report per cell, then the tables.

    Raises :class:`ConfigError` (nothing run or written) for a bad matrix.yaml, a selection
    that matches nothing, an explicitly requested target this host lacks, or an unknown
    backend. Cells that fail are outcomes, not exceptions.
    """
    matrix = load_matrix(matrix_path)
    if backend not in BACKENDS:
        raise ConfigError(f"--backend: unknown backend {backend!r}; choose from "
                          f"{', '.join(BACKENDS)}")
    cells = select(expand(matrix), stacks=stacks, modes=modes, targets=targets)
    chosen_cases = select_cases(matrix, cases)
    has_gpu = cuda_available()
    if targets and "cuda" in targets and not has_gpu:
        raise ConfigError("--target: cuda was requested but torch sees no CUDA device here")
    runner_backend = BACKENDS[backend]()
    reports_dir.mkdir(parents=True, exist_ok=True)
    project = project_state()
    outcomes: list[CellOutcome] = []
    for cell in cells:
        path = reports_dir / f"{cell.id}.json"
        run_id = uuid.uuid4().hex
        if cell.target == "cuda" and not has_gpu:
            skipped = skeleton(matrix, cell, chosen_cases, backend=backend, run_id=run_id,
                               status="skipped",
                               reason="target cuda: torch sees no CUDA device on this host")
            report_io.write_report(skipped, reports_dir)
            outcomes.append(CellOutcome(cell.id, "skipped", skipped["reason"], path))
            continue
        if not force and _reusable(path, fingerprint(matrix, cell, chosen_cases, project)):
            outcomes.append(CellOutcome(cell.id, "ok", "same fingerprint: not run again", path,
                                        reused=True))
            continue
        print(f"[runner] cell {cell.id}: running {len(chosen_cases)} case(s) on {backend}",
              flush=True)
        result = runner_backend.run(matrix, cell, chosen_cases, matrix_path=matrix_path,
                                    reports_dir=reports_dir, run_id=run_id, timeout_s=timeout_s)
        outcomes.append(CellOutcome(cell.id, result["status"], result.get("reason"), path))
    if render:
        tables.write_tables(reports_dir)
    return outcomes


def summary(outcomes: Sequence[CellOutcome]) -> str:
    """A plain-text table of the run's cells: id, status, reason."""
    rows = [(o.cell, o.status + (" (reused)" if o.reused else ""), o.reason or "")
            for o in outcomes]
    return tabulate(rows, headers=("cell", "status", "reason"), tablefmt="simple")


def failed(outcomes: Sequence[CellOutcome]) -> list[CellOutcome]:
    """Outcomes whose status is neither ok nor skipped."""
    return [o for o in outcomes if o.status not in ("ok", "skipped")]
