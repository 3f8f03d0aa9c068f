"""Run each cell: the pipeline's step between selecting cells and rendering the tables.

For one selected cell, in this order (:mod:`runner.pipeline` calls them):

* :func:`write_skipped`: a cell that cannot run here gets a ``skipped`` report, unless
  its file holds results made elsewhere (the H200's, say), which are kept;
* :func:`plan_cell`: whether it must run at all (same fingerprint and ``ok``: reused),
  which cases (a stopped run's missing ones: resumed; a ``--case`` run merged into the
  existing report, or refused when that came from other code or another machine);
* the site runs it (:class:`runner.backends.site.Site`: ``submit``, then ``drain``; on this
  machine through :func:`runner.backends.staging.run_staged`, into a hidden staging
  directory, a run that is interrupted keeping the cases it finished as a ``partial``
  report);
* :func:`settle`: the runner stamps the report with its fingerprint, merges it as planned
  and writes it in one atomic step, and returns the cell's :class:`CellOutcome`.

:func:`run_cells` does that for every selected cell, whatever the site: this machine runs
them one at a time, a Ray cluster all at once. ``--abba`` runs a cell and its partner in
A-B-B-A order instead (:func:`run_abba`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gate_residual_matrix.runner.backends import staging
from gate_residual_matrix.runner.backends.base import Fingerprinter
from gate_residual_matrix.runner.backends.site import Batch, Job, Site
from gate_residual_matrix.runner.cell import job_clock
from gate_residual_matrix.runner.cell.run import case_key, fingerprint, skeleton
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.outcome import (
    REFUSED,
    CellOutcome,
    outcome_status,
    skipped_lines,
)
from gate_residual_matrix.runner.plan.cells import Cell, cases_on
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.reports.merge import PartialPlan, finish_partial, plan_partial
from gate_residual_matrix.runner.status import Status
from gate_residual_matrix.runner.untrusted.files import locked

__all__ = ["STACK_SKIPPED", "CellPlan", "RunContext", "plan_cell", "planned_outcome",
           "run_abba", "run_cells", "salvage_stale", "settle", "write", "write_skipped"]

Report = dict[str, Any]

STACK_SKIPPED = "its docker stack is skipped: see `skipped docker stack(s)` at the start"
"""The summary's reason for a cell of a skipped docker stack: the stack, why and what to do
were named once when the run started (:func:`runner.pipeline.prepare`)."""


@dataclass(frozen=True)
class RunContext:
    """What every cell of one run shares: the matrix and its path (``matrix_path``: the
    validated snapshot the cells read; ``matrix_origin``: the user's file, whose place
    relative paths start from), the reports directory, the selected cases, the project's
    state (``commit``, ``dirty``, ``diff_sha256``), ``force`` and the cell timeout."""

    matrix: Matrix
    matrix_path: Path
    reports_dir: Path
    cases: tuple[Case, ...]
    project: dict[str, Any]
    force: bool = False
    timeout_s: float = 3600.0
    matrix_origin: Path | None = None

    def path(self, cell: Cell) -> Path:
        """``cell``'s report file."""
        return self.reports_dir / f"{cell.id}.json"

    def fingerprint(self, where: Fingerprinter, cell: Cell, cases: Sequence[Case] | None = None,
                    ) -> str:
        """``cell``'s fingerprint over ``cases`` (default: the selected ones), with what
        ``where`` adds to it."""
        return fingerprint(self.matrix, cell, self.cases if cases is None else cases,
                           self.project, dict(where.fingerprint_extra(self.matrix, cell)))

    def stamp(self, where: Fingerprinter, cell: Cell, result: Report) -> Report:
        """``result`` with the runner's fingerprint, which decides reuse and resume. Taken
        after the run, so that what the run made (a docker image and its id) counts as the
        next run will see it."""
        return {**result, "fingerprint": self.fingerprint(where, cell)}

    def batch(self) -> Batch:
        """What a site needs of this run to run its cells."""
        return Batch(self.matrix, self.matrix_path, self.reports_dir, self.timeout_s,
                     origin=self.matrix_origin, commit=self.project.get("commit"))


@dataclass(frozen=True)
class CellPlan:
    """What to do with one cell (:func:`plan_cell`).

    ``action``: ``run`` (``cases``, merged afterwards into ``resume``, the stopped run's
    partial report, or by ``partial``, the ``--case`` plan), ``reuse`` or ``refuse``
    (``note`` says why: nothing runs).
    """

    cell: Cell
    action: Literal["run", "reuse", "refuse"]
    cases: tuple[Case, ...] = ()
    resume: Report | None = None
    partial: PartialPlan | None = None
    note: str | None = None


def write(report: Report, reports_dir: Path) -> Path:
    """:func:`runner.reports.store.write_report`, with an OS error as a :class:`ReportError`."""
    try:
        return report_io.write_report(report, reports_dir)
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot write {report['cell']['id']}.json: "
                          f"{err.strerror or err}") from err


def write_skipped(ctx: RunContext, cell: Cell, reason: str, *, backend: str,
                  run_id: str) -> str:
    """Write ``cell``'s ``skipped`` report unless its file already holds a readable report
    with results (say, the H200 cell committed from another machine): a host that cannot
    run a cell must not erase what a host that could run it measured. Returns the reason
    shown."""
    path = ctx.path(cell)
    with locked(ctx.reports_dir):
        if path.exists():
            existing = report_io.read_report(path).data
            if existing and existing.get("status") not in (None, Status.SKIPPED):
                return (f"{reason}; kept the existing {existing['status']} report "
                        f"({(existing.get('environment') or {}).get('gpu') or 'no GPU'}, "
                        f"{existing.get('finished_at', '?')})")
        write(skeleton(ctx.matrix, cell, ctx.cases, backend=backend, run_id=run_id,
                       status=Status.SKIPPED, reason=reason), ctx.reports_dir)
    return reason


def _reusable(path: Path, expected_fingerprint: str) -> bool:
    if not path.exists():
        return False
    loaded = report_io.read_report(path).data
    return bool(loaded and loaded.get("status") == Status.OK
                and loaded.get("fingerprint") == expected_fingerprint)


def plan_cell(ctx: RunContext, where: Fingerprinter, cell: Cell, *,
              partial: bool) -> CellPlan:
    """Whether ``cell`` runs, and which cases: the stopped run's missing cases when its
    ``partial`` report has this fingerprint (resumed); with ``partial`` (``--case`` names
    fewer cases than the matrix) the existing report's :func:`runner.reports.merge.plan_partial`;
    else reused when its report is ``ok`` with this fingerprint. ``--force`` runs
    whatever the report says. Reads reports; writes nothing."""
    path, current = ctx.path(cell), ctx.fingerprint(where, cell)
    to_run = tuple(cases_on(ctx.cases, cell.target))
    resume = None
    if not ctx.force:  # a stopped run of this very selection: only its missing cases
        resume = staging.resumable(path, current, {str(case_key(c)) for c in to_run})
    if resume is not None:
        missing = {str(c) for c in resume["cases_missing"]}
        return CellPlan(cell, "run", tuple(c for c in to_run if str(case_key(c)) in missing),
                        resume=resume)
    if partial:
        extra = dict(where.fingerprint_extra(ctx.matrix, cell))
        plan = plan_partial(path, ctx.matrix, cell, ctx.cases, ctx.project, extra,
                            force=ctx.force)
        if plan.action in ("reuse", "refuse"):
            return CellPlan(cell, "reuse" if plan.action == "reuse" else "refuse",
                            note=plan.note)
        return CellPlan(cell, "run", to_run, partial=plan)
    if not ctx.force and _reusable(path, current):
        return CellPlan(cell, "reuse", note="same fingerprint: not run again")
    return CellPlan(cell, "run", to_run)


def settle(ctx: RunContext, where: Fingerprinter, plan: CellPlan,
           result: Report) -> CellOutcome:
    """Write a cell's report as the runner does for every cell: ``result`` comes stamped
    with its fingerprint and merged into the plan's ``resume`` (:meth:`Job.finish
    <runner.backends.site.Job.finish>`); here it is merged by the plan's ``--case``
    ``partial`` plan, or a partial one kept by :func:`runner.backends.staging.keep_partial`.
    Returns its outcome.

    Under the reports folder's lock (:func:`runner.untrusted.files.folder_lock`) a ``--case``
    plan is
    made again from the report as it is now: another run may have merged its cases into it
    since this one started, and they are kept."""
    cell = plan.cell
    with locked(ctx.reports_dir):
        written: Report | None = result
        status, reason = result["status"], result.get("reason")
        if plan.partial is not None:
            extra = dict(where.fingerprint_extra(ctx.matrix, cell))
            now = plan_partial(ctx.path(cell), ctx.matrix, cell, ctx.cases, ctx.project,
                               extra, force=ctx.force)
            if now.action == "reuse":  # another run wrote these cases meanwhile: merge
                now = PartialPlan("merge", now.old)
            if now.action == "refuse":
                written, status, reason = None, REFUSED, now.note
            else:
                written, status, reason = finish_partial(now, result, ctx.matrix, cell,
                                                         ctx.project, extra, force=ctx.force)
        if written is not None and status == Status.PARTIAL:
            if staging.keep_partial(written, ctx.reports_dir) is None:
                reason = f"{reason}; kept the ok report of the same fingerprint"
        elif written is not None:
            write(written, ctx.reports_dir)
    return CellOutcome(cell.id, outcome_status(status), reason, ctx.path(cell))


def planned_outcome(ctx: RunContext, plan: CellPlan) -> CellOutcome:
    """The outcome of a cell that does not run: reused (``ok``) or :data:`REFUSED`."""
    if plan.action == "reuse":
        return CellOutcome(plan.cell.id, Status.OK, plan.note, ctx.path(plan.cell),
                           reused=True)
    print(f"[runner] cell {plan.cell.id}: refused: {plan.note}", flush=True)
    return CellOutcome(plan.cell.id, REFUSED, plan.note, ctx.path(plan.cell))


def salvage_stale(reports_dir: Path, matrix: Matrix) -> None:
    """Remove the staging directories of runs that died, keeping the partial reports found
    there (:func:`runner.backends.staging.clean_stale`, stamped with the fingerprint their runner
    recorded), merged into the partial report they were resuming, if any."""
    for stage, partials in staging.clean_stale(reports_dir, matrix):
        kept = []
        for partial in partials:
            if not partial.get("fingerprint"):
                continue
            path = reports_dir / f"{partial['cell']['id']}.json"
            with locked(reports_dir):
                earlier = staging.resumable(path, partial["fingerprint"])
                if earlier is not None:
                    partial = staging.combine(earlier, partial, matrix)
                if staging.keep_partial(partial, reports_dir) is not None:
                    kept.append(partial["cell"]["id"])
        note = f"; kept partial report(s) of {', '.join(kept)}" if kept else ""
        print(f"[runner] removed {stage.name}: left by a run that died{note}", flush=True)


def run_abba(ctx: RunContext, backend: Any, cell: Cell, mode_b: str) -> list[CellOutcome]:
    """Cell and partner in A-B-B-A order (:mod:`runner.plan.abba`); both merged reports
    written, stamped with their fingerprints; their outcomes."""
    from gate_residual_matrix.runner.plan import abba

    print(f"[runner] cell {cell.id}: A-B-B-A against mode {mode_b}", flush=True)
    merged = abba.run_abba(backend, ctx.matrix, cell, mode_b, ctx.cases,
                           matrix_path=ctx.matrix_path, reports_dir=ctx.reports_dir,
                           timeout_s=ctx.timeout_s)
    outcomes = []
    for report in merged:
        one = Cell(report["cell"]["stack"], report["cell"]["mode"], report["cell"]["target"],
                   cell.prefix)
        report["fingerprint"] = ctx.fingerprint(backend, one)
        with locked(ctx.reports_dir):
            path = write(report, ctx.reports_dir)
        outcomes.append(CellOutcome(one.id, outcome_status(report["status"]),
                                    report.get("reason"), path))
    return outcomes


def _skipped(ctx: RunContext, cell: Cell, why: str, skipped: dict[str, str], *,
             backend: str, run_id: str) -> CellOutcome:
    """``cell``'s ``skipped`` report written (:func:`write_skipped`) and its outcome (its
    reason is printed with the others' by :func:`run_cells`, unless its stack's was, once, at
    the start)."""
    shown = write_skipped(ctx, cell, why, backend=backend, run_id=run_id)
    kept = shown[len(why):] or None  # write_skipped appends which earlier report it kept
    if cell.stack in skipped:  # its stack was named once, at the start
        shown = shown.replace(why, STACK_SKIPPED, 1)
    return CellOutcome(cell.id, Status.SKIPPED, shown, ctx.path(cell), kept=kept)


def run_cells(ctx: RunContext, cells: Sequence[Cell], site: Site, skipped: dict[str, str],
              *, partial: bool, abba: str | None = None) -> list[CellOutcome]:
    """Each of ``cells``, in order: ``skipped`` (its report written, unless it would erase
    results made elsewhere; ``skipped``: the stacks :func:`runner.pipeline.prepare` named;
    else the site's ``why_not``), reused, refused, or submitted to ``site``; then the site
    runs the submitted ones (``drain``: one at a time here, all at once on a cluster) and
    each report is merged and written as it arrives (:func:`settle`). ``partial``: the run
    selects fewer cases than the matrix has (:func:`plan_cell`); ``abba``: the partner mode
    of ``--abba`` (:func:`run_abba`, on the site's backend in this process). Returns one
    outcome per cell (two per cell under ``--abba``)."""
    outcomes: list[CellOutcome | None] = []
    waiting: dict[int, tuple[CellPlan, Fingerprinter]] = {}
    batch = ctx.batch()
    for cell in cells:
        run_id = uuid.uuid4().hex
        name = site.backend_for(ctx.matrix, cell)
        why_not = skipped.get(cell.stack) or site.why_not(ctx.matrix, cell)
        if why_not:
            job_clock.drop(cell.id)
            outcomes.append(_skipped(ctx, cell, why_not, skipped, backend=name, run_id=run_id))
            continue
        if abba is not None:
            outcomes += run_abba(ctx, site.backend(name), cell, abba)
            continue
        where = site.fingerprinter(name)
        plan = plan_cell(ctx, where, cell, partial=partial)
        if plan.action != "run":
            job_clock.drop(cell.id)
            outcomes.append(planned_outcome(ctx, plan))
            continue
        job_clock.expect(cell.id, job_clock.previous_seconds(ctx.reports_dir, cell.id))
        key = len(outcomes)
        waiting[key] = (plan, where)
        outcomes.append(None)  # filled in when its report arrives
        site.submit(Job(key, cell, plan.cases, run_id, name, batch,
                        functools.partial(ctx.stamp, where, cell), resume=plan.resume))

    said = [o for o in outcomes if o is not None and o.status == Status.SKIPPED
            and not (o.reason or "").startswith(STACK_SKIPPED)]
    for line in skipped_lines(said):  # one line per reason, before any cell runs
        print(f"[runner] skipped {line}", flush=True)

    def arrived(job: Job, report: Report) -> None:
        plan, where = waiting[job.key]
        outcomes[job.key] = settle(ctx, where, plan, report)

    site.drain(arrived)
    return [o for o in outcomes if o is not None]
