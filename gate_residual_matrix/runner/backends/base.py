"""The one interface every backend has, and what backends share.

A backend runs one cell somewhere and returns its report. It has a ``name`` (the report's
``cell.backend``) and four methods, :class:`Backend`:

* ``available()``: None when it can run cells here, else why not (one line);
* ``prepare(matrix, stacks, strict=...)``: before any cell runs, make ready what the cells
  of ``stacks`` need, and return ``{stack: why its cells are skipped}`` for those that
  cannot run here;
* ``fingerprint_extra(matrix, cell)``: what it adds to a cell's fingerprint (a docker
  image's id; ``{}`` on the host);
* ``run(matrix, cell, cases, ...)``: run the cell, always returning its report (a failure
  is a report, :mod:`runner.backends.failure` says which status).

What a cell runs is the same everywhere: :func:`cell_argv`. A cell that wrote no report
gets one from :func:`failed_report`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gate_residual_matrix.runner.cell.run import skeleton
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports import store as report_io

__all__ = ["Backend", "Fingerprinter", "cell_argv", "failed_report", "skipped_lines"]


class Fingerprinter(Protocol):
    """What a cell's fingerprint takes from where it runs: a backend, or a Ray cluster
    (:class:`runner.backends.ray.cluster.Cluster`: a docker stack's image tag)."""

    def fingerprint_extra(self, matrix: Matrix, cell: Cell) -> dict[str, Any]:
        """What ``cell``'s fingerprint adds (a docker image's id; ``{}`` on the host)."""
        ...


class Backend(Protocol):
    """What the pipeline asks of a backend (see the module docstring)."""

    name: str

    def available(self) -> str | None:
        """None when this backend can run cells here, else one line saying why not."""
        ...

    def prepare(self, matrix: Matrix, stacks: Sequence[str], *,
                strict: bool) -> dict[str, str]:
        """Make ready what the cells of ``stacks`` need; return ``{stack: reason}`` for the
        stacks whose cells are ``skipped`` here. ``strict`` (an explicit ``--backend``):
        a stack that cannot run is a :class:`runner.errors.BackendError` instead."""
        ...

    def fingerprint_extra(self, matrix: Matrix, cell: Cell) -> dict[str, Any]:
        """What this backend adds to ``cell``'s fingerprint."""
        ...

    def run(self, matrix: Matrix, cell: Cell, cases: Sequence[Case], *, matrix_path: Path,
            reports_dir: Path, run_id: str, timeout_s: float) -> dict[str, Any]:
        """Run ``cases`` of ``cell``; return its report (also written under
        ``reports_dir``), whatever happened to the cell."""
        ...


def cell_argv(python: str, matrix_path: str, reports_dir: str, cell: Cell,
              case_ids: Sequence[str], run_id: str) -> list[str]:
    """The argv that runs one cell: ``python -m gate_residual_matrix cell ...`` (a list: no shell).

    ``python``, ``matrix_path`` and ``reports_dir`` as the cell's process sees them (the
    host's interpreter and paths, or the container's).

    Example::

        >>> cell_argv("python", "m.yaml", "/r", Cell("s", "plain", "cpu"), ["257"], "ab")[-4:]
        ['--run-id', 'ab', '--case', '257']
    """
    argv = [python, "-m", "gate_residual_matrix.runner", "cell", "--matrix", matrix_path,
            "--stack", cell.stack, "--mode", cell.mode, "--target", cell.target,
            "--reports", reports_dir, "--run-id", run_id]
    for case_id in case_ids:
        argv += ["--case", str(case_id)]
    return argv


def failed_report(matrix: Matrix, cell: Cell, cases: Sequence[Case], *, backend: str,
                  run_id: str, reports_dir: Path, status: str, reason: str, started: float,
                  **fields: Any) -> dict[str, Any]:
    """The report of a cell that wrote none: its skeleton with ``status`` and ``reason``,
    ``fields`` (``exit_code``, ``log_tail``, a docker ``image``, ...) and its duration
    since ``started`` (``time.perf_counter()``), written under ``reports_dir``."""
    failed = skeleton(matrix, cell, cases, backend=backend, run_id=run_id, status=status,
                      reason=reason)
    failed.update(fields, duration_s=round(time.perf_counter() - started, 3))
    report_io.write_report(failed, reports_dir)
    return failed


def skipped_lines(skips: Mapping[str, str]) -> list[str]:
    """One line per shared reason for ``{stack: reason}``, the stacks in their order:
    ``skipped docker stack(s) a, b: <reason>`` (printed once, before any cell runs).

    Example::

        >>> skipped_lines({"a": "no engine", "b": "no engine"})
        ['skipped docker stack(s) a, b: no engine']
    """
    by_reason: dict[str, list[str]] = {}
    for stack, reason in skips.items():
        by_reason.setdefault(reason, []).append(stack)
    return [f"skipped docker stack(s) {', '.join(group)}: {reason}"
            for reason, group in by_reason.items()]
