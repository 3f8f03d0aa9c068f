"""Run each cell: the pipeline's step between selecting cells and rendering the tables.

For one selected cell, in this order (:mod:`runner.pipeline` calls them):

* :func:`write_skipped`: a cell that cannot run here gets a ``skipped`` report, unless
  its file holds results made elsewhere (the H200's, say), which are kept;
* :func:`plan_cell`: whether it must run at all (same fingerprint and ``ok``: reused),
  which cases (a stopped run's missing ones: resumed; a ``--case`` run merged into the
  existing report, or refused when that came from other code or another machine);
* :func:`run_staged`: the backend runs it into a hidden staging directory; a run that is
  interrupted keeps the cases it finished as a ``partial`` report;
* :func:`settle`: the runner stamps the report with its fingerprint, merges it as planned
  and writes it in one atomic step, and returns the cell's :class:`CellOutcome`.

:func:`run_cells` does that for every selected cell, here one at a time or on a Ray
cluster all at once. ``--abba`` runs a cell and its partner in A-B-B-A order instead
(:func:`run_abba`).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gate_residual_matrix.runner.backends import staging
from gate_residual_matrix.runner.backends.base import Fingerprinter
from gate_residual_matrix.runner.backends.ray import cluster as cluster_mod
from gate_residual_matrix.runner.backends.registry import route
from gate_residual_matrix.runner.backends.site import Site
from gate_residual_matrix.runner.cell.run import case_key, fingerprint, skeleton
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import ReportError
from gate_residual_matrix.runner.outcome import REFUSED, CellOutcome, outcome_status
from gate_residual_matrix.runner.plan.cells import Cell, cases_on
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.reports.merge import PartialPlan, finish_partial, plan_partial
from gate_residual_matrix.runner.status import Status
from gate_residual_matrix.runner.untrusted import files

__all__ = ["STACK_SKIPPED", "CellPlan", "RunContext", "plan_cell", "planned_outcome",
           "run_abba", "run_cells", "run_staged", "salvage_stale", "settle", "write",
           "write_skipped"]

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


def run_staged(backend: Any, matrix: Matrix, cell: Cell, cases: Sequence[Case],
               resume: Report | None, *, matrix_path: Path, reports_dir: Path, run_id: str,
               timeout_s: float, stamp: Callable[[Report], Report]) -> Report:
    """Run ``cases`` of ``cell`` through ``backend`` into a staging directory and return
    the stamped report (merged into ``resume``, the stopped run's partial report, if any).

    When the run is interrupted (Ctrl-C, SIGTERM, SIGHUP), the partial report the cell left
    in the stage is kept (:func:`runner.backends.staging.keep_partial`) before the interruption goes
    on; the stage is always removed.
    """
    stage = staging.open_stage(reports_dir, run_id, fingerprint=stamp({})["fingerprint"])
    try:  # the backend writes only in the stage; the report goes in place afterwards, whole
        result = backend.run(matrix, cell, cases, matrix_path=matrix_path, reports_dir=stage,
                             run_id=run_id, timeout_s=timeout_s)
    except BaseException:
        partial = staging.salvage(stage, cell.id)
        if partial is not None:
            partial = stamp(partial)
            if resume is not None:
                partial = staging.combine(resume, partial, matrix)
            with locked(reports_dir):
                kept = staging.keep_partial(partial, reports_dir)
            if kept is None:
                pass
            elif partial.get("status") == Status.PARTIAL:
                print(f"\n[runner] cell {cell.id}: kept {len(partial['cases'])} finished "
                      "case(s) as a partial report; the next run resumes it", flush=True)
            else:  # the cell had ended: only its runner was stopped
                print(f"\n[runner] cell {cell.id}: kept its finished report "
                      f"({partial['status']}, {len(partial['cases'])} cases)", flush=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    result = stamp(result)
    return result if resume is None else staging.combine(resume, result, matrix)


def settle(ctx: RunContext, where: Fingerprinter, plan: CellPlan, result: Report, *,
           stamped: bool = False) -> CellOutcome:
    """Write a cell's report as the runner does for every cell (stamped with its
    fingerprint unless ``stamped``, merged into the plan's ``resume`` or by its ``--case``
    ``partial`` plan, a partial one kept by :func:`runner.backends.staging.keep_partial`); return
    its outcome.

    Under the reports folder's lock (:func:`runner.untrusted.files.folder_lock`) a ``--case``
    plan is
    made again from the report as it is now: another run may have merged its cases into it
    since this one started, and they are kept."""
    cell = plan.cell
    if not stamped:
        result = ctx.stamp(where, cell, result)
        if plan.resume is not None:
            result = staging.combine(plan.resume, result, ctx.matrix)
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


@contextlib.contextmanager
def locked(reports_dir: Path) -> Iterator[None]:
    """:func:`runner.untrusted.files.folder_lock`, with an OS error (or a lock held too long) as a
    :class:`ReportError`."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(files.folder_lock(reports_dir))
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot lock the reports folder: "
                          f"{err.strerror or err}") from err
    with held:
        yield


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


def _why_skipped(ctx: RunContext, cell: Cell, site: Site,
                 skipped: dict[str, str]) -> str | None:
    """Why ``cell`` cannot run here (its stack skipped, no GPU, no node offers what it
    needs), or None."""
    why = skipped.get(cell.stack)
    if why is None and cell.target == "cuda" and not site.has_gpu:
        why = "target cuda: torch sees no CUDA device on this host"
    if why is None and site.cluster is not None:
        why = site.cluster.unoffered(cluster_mod.needs(ctx.matrix, cell,
                                                       site.cluster.gpu_model))
    return why


def run_cells(ctx: RunContext, cells: Sequence[Cell], site: Site, skipped: dict[str, str],
              *, partial: bool, abba: str | None = None) -> list[CellOutcome]:
    """Each of ``cells``, in order: ``skipped`` (its report written, unless it would erase
    results made elsewhere; ``skipped``: the stacks :func:`runner.pipeline.prepare` named),
    reused, refused, or run here (one at a time) or on the cluster (all at once), its report
    stamped, merged and written. ``partial``: the run selects fewer cases than the matrix
    has (:func:`plan_cell`); ``abba``: the partner mode of ``--abba`` (:func:`run_abba`).
    Returns one outcome per cell (two per cell under ``--abba``)."""
    matrix = ctx.matrix
    outcomes: list[CellOutcome | None] = []
    jobs: dict[int, tuple[cluster_mod.Job, Any]] = {}
    for cell in cells:
        run_id = uuid.uuid4().hex
        routed, _ = route(matrix.stacks[cell.stack].kind, site.chosen, site.note)
        name = routed or site.chosen
        why_not = _why_skipped(ctx, cell, site, skipped)
        if why_not:
            shown = write_skipped(ctx, cell, why_not, backend=name, run_id=run_id)
            if cell.stack in skipped:  # its stack was named once, at the start
                shown = shown.replace(why_not, STACK_SKIPPED, 1)
            else:
                print(f"[runner] cell {cell.id}: skipped: {shown}", flush=True)
            outcomes.append(CellOutcome(cell.id, Status.SKIPPED, shown, ctx.path(cell)))
            continue
        if abba is not None:  # never on a cluster (choose_site refuses it)
            outcomes += run_abba(ctx, site.backend(name), cell, abba)
            continue
        where = site.fingerprinter(name)
        plan = plan_cell(ctx, where, cell, partial=partial)
        if plan.action != "run":
            outcomes.append(planned_outcome(ctx, plan))
            continue
        if plan.resume is not None:
            print(f"[runner] cell {cell.id}: resuming: {len(plan.resume['cases'])} case(s) "
                  f"done, running the {len(plan.cases)} missing on {name}", flush=True)
        else:
            print(f"[runner] cell {cell.id}: running {len(plan.cases)} case(s) on {name}"
                  + (" (cluster)" if site.cluster is not None else ""), flush=True)
        if site.cluster is not None:  # run below, all at once; the outcome filled in then
            jobs[len(outcomes)] = (cluster_mod.Job(
                len(outcomes), cell, plan.cases, run_id, name,
                cluster_mod.needs(matrix, cell, site.cluster.gpu_model)), plan)
            outcomes.append(None)
            continue
        result = run_staged(site.backend(name), matrix, cell, plan.cases, plan.resume,
                            matrix_path=ctx.matrix_path, reports_dir=ctx.reports_dir,
                            run_id=run_id, timeout_s=ctx.timeout_s,
                            stamp=functools.partial(ctx.stamp, where, cell))
        outcomes.append(settle(ctx, where, plan, result, stamped=True))
    if jobs and site.cluster is not None:
        cluster = site.cluster

        def arrived(job: cluster_mod.Job, report: dict[str, Any]) -> None:
            outcomes[job.key] = settle(ctx, cluster, jobs[job.key][1], report)

        cluster.run([job for job, _ in jobs.values()], matrix=matrix,
                    matrix_path=ctx.matrix_path, origin=ctx.matrix_origin,
                    timeout_s=ctx.timeout_s,
                    commit=ctx.project.get("commit"), on_report=arrived)
    return [o for o in outcomes if o is not None]
