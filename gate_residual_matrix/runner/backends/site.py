"""Where a run's cells run: the :class:`Site` interface, which every scheduler implements.

A site is one machine's backends (:class:`runner.backends.local.LocalSite`: host processes
and docker containers, in this process) or a scheduler's nodes
(:class:`runner.backends.ray.site.RaySite`: a Ray cluster). The pipeline asks every site the
same things, in this order:

* ``open()``: connect to the scheduler (nothing for the local site);
* ``memory_bytes()`` and ``gpu_available()``: what a case may use, whether ``cuda`` cells
  can run (:func:`runner.pipeline.check_site`, which sets ``has_gpu``);
* ``prepare(matrix, cells, strict=...)``: which docker stacks are skipped, and why
  (:func:`runner.pipeline.prepare`);
* per cell (:func:`runner.run.run_cells`): ``backend_for`` (which backend runs it),
  ``why_not`` (why it cannot run here), ``fingerprinter`` (what its fingerprint adds);
* ``submit(job)`` for each cell that must run, then ``drain(on_report)``, which runs them
  and hands each stamped report back to the runner as it arrives (the runner writes it);
* ``close()``.

The sites by name, and which one a run uses: :mod:`runner.backends.sites`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.backends.base import Backend, Fingerprinter, skipped_lines
from gate_residual_matrix.runner.backends.registry import route
from gate_residual_matrix.runner.backends.staging import combine
from gate_residual_matrix.runner.cell import job_clock
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.plan.cells import Cell

__all__ = ["Batch", "Job", "OnReport", "Site", "SiteOptions"]

Report = dict[str, Any]


@dataclass(frozen=True)
class SiteOptions:
    """What a ``matrix`` command asks of where its cells run: ``--backend``, ``--gpus``,
    ``--build``, ``--abba``, ``--cluster`` (an address), ``--gpu-model``, ``--retries``;
    ``matrix_dir``: the matrix file's folder (docker stacks' paths start there)."""

    backend: str = "host"
    gpus: str = "all"
    matrix_dir: Path = Path(".")
    build: bool = False
    abba: str | None = None
    cluster: str | None = None
    gpu_model: str | None = None
    retries: int = 2


@dataclass(frozen=True)
class Batch:
    """What every job of one run shares: the matrix, the validated snapshot the cells read
    (``matrix_path``), the user's file (``origin``: a node looks for its own copy at its
    place in the project), the reports folder, the cell timeout and the project's commit."""

    matrix: Matrix
    matrix_path: Path
    reports_dir: Path
    timeout_s: float
    origin: Path | None = None
    commit: str | None = None


@dataclass(frozen=True)
class Job:
    """One cell for a site to run, as the runner planned it.

    ``key``: the runner's index, echoed to ``on_report``; ``backend``: the backend that
    runs it (``host`` or ``docker``, :meth:`Site.backend_for`); ``stamp``: the runner's
    fingerprint for its report; ``resume``: the stopped run's partial report its cases
    complete, if any.
    """

    key: int
    cell: Cell
    cases: tuple[Case, ...]
    run_id: str
    backend: str
    batch: Batch
    stamp: Callable[[Report], Report]
    resume: Report | None = None

    def finish(self, report: Report) -> Report:
        """``report`` stamped, and merged into :attr:`resume` when there is one."""
        stamped = self.stamp(report)
        if self.resume is None:
            return stamped
        return combine(self.resume, stamped, self.batch.matrix)

    def announce(self, where: str = "") -> None:
        """Print that the cell runs now (``where``: a suffix naming the site)."""
        cell, name = self.cell, self.backend
        job = job_clock.starting(cell.id)
        if self.resume is not None:
            print(f"[runner] cell {cell.id}: resuming: {len(self.resume['cases'])} case(s) "
                  f"done, running the {len(self.cases)} missing on {name}{where}{job}",
                  flush=True)
        else:
            print(f"[runner] cell {cell.id}: running {len(self.cases)} case(s) on {name}"
                  f"{where}{job}", flush=True)


OnReport = Callable[[Job, Report], None]
"""What :meth:`Site.drain` calls with each job and its report (stamped, merged into its
``resume``), in the order the reports arrive."""


class Site(ABC):
    """Where the selected cells of a run go (see the module docstring).

    ``chosen``: the backend ``kind: docker`` stacks get (``docker``, or ``host``: their
    cells skipped); ``note``: why ``--backend auto`` chose the host; ``has_gpu``: whether
    ``cuda`` cells can run (set by :func:`runner.pipeline.check_site`).
    """

    name: str
    chosen: str
    note: str | None = None
    has_gpu: bool = False

    def open(self) -> None:  # noqa: B027 - a site without a scheduler has nothing to open
        """Connect to the scheduler. Raises ConfigError or BackendError when it cannot."""

    def close(self) -> None:  # noqa: B027 - nor anything to close
        """Let go of the scheduler (which goes on running)."""

    @abstractmethod
    def memory_bytes(self) -> int | None:
        """The most memory one cell may use here in bytes (a cluster: its largest node's),
        or None where nobody says."""

    @abstractmethod
    def gpu_available(self) -> bool:
        """Whether ``cuda`` cells can run here at all."""

    @abstractmethod
    def prepare(self, matrix: Matrix, cells: Sequence[Cell], *,
                strict: bool) -> dict[str, str]:
        """Before any cell runs: ``{stack: why its cells are skipped}`` for the docker
        stacks of ``cells`` that cannot run here, named once. ``strict`` (an explicit
        ``--backend docker``): a stack without its image is a BackendError instead."""

    @abstractmethod
    def why_not(self, matrix: Matrix, cell: Cell) -> str | None:
        """Why ``cell`` cannot run here (no GPU, no node offers what it needs), or None."""

    @abstractmethod
    def fingerprinter(self, name: str) -> Fingerprinter:
        """What fingerprints a cell that runs on backend ``name``."""

    @abstractmethod
    def backend(self, name: str) -> Backend:
        """Backend ``name`` in this process, for a run of one machine's processes
        (``--abba``). Raises ConfigError where the site runs cells elsewhere."""

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Take ``job`` to run (now or in :meth:`drain`)."""

    @abstractmethod
    def drain(self, on_report: OnReport) -> None:
        """Run the jobs submitted and not yet reported; call ``on_report`` for each as its
        report arrives. Raises whatever interrupts the run (Ctrl-C, SIGTERM) after
        stopping its cells."""

    def backend_for(self, matrix: Matrix, cell: Cell) -> str:
        """The backend that runs ``cell`` here (:func:`runner.backends.registry.route`;
        the chosen one for a skipped docker stack, whose report names it)."""
        routed, _ = route(matrix.stacks[cell.stack].kind, self.chosen, self.note)
        return routed or self.chosen

    def skip_docker_stacks(self, matrix: Matrix, cells: Sequence[Cell]) -> dict[str, str]:
        """``{stack: reason}`` for every docker stack of ``cells`` that could otherwise run
        (a ``cuda`` cell only with a GPU), for a run whose docker stacks get the host
        backend; each reason printed once (``[runner] skipped docker stack(s) ...``)."""
        skips = {stack: str(route("docker", self.chosen, self.note)[1])
                 for stack in docker_stacks(matrix, cells, self.has_gpu)}
        for line in skipped_lines(skips):
            print(f"[runner] {line}", flush=True)
        return skips


def docker_stacks(matrix: Matrix, cells: Sequence[Cell], has_gpu: bool) -> list[str]:
    """The ``kind: docker`` stacks of ``cells`` that can run (a ``cuda`` cell only with a
    GPU), in their order."""
    return list(dict.fromkeys(c.stack for c in cells if matrix.stacks[c.stack].kind == "docker"
                              and (c.target != "cuda" or has_gpu)))
