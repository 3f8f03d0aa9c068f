"""The matrix run: load config → expand cells → select → run cells → reports → tables.

Each step is a function of :mod:`runner.config`, :mod:`runner.cells`, a backend and
:mod:`runner.report` / :mod:`runner.tables`; this module only strings them together, decides
which cells can run here (a ``cuda`` cell on a host without a GPU, or under ``--backend auto``
a docker stack whose image this host cannot make, is ``skipped`` with the reason, never a
missing file), which need not run again (same fingerprint, status ok), and writes every
report itself: a backend runs a cell into a hidden staging directory, and the runner stamps
the report and puts it in place in one atomic step, merged with the existing report's other
cases when the run was partial (``--case``: :func:`plan_partial`, :func:`merge_reports`).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from runner import cluster as cluster_mod
from runner import implementations, staging, tables
from runner import report as report_io
from runner.backends import BACKENDS, DockerBackend, prepare_stacks, resolve, route
from runner.cell import case_key, fingerprint, skeleton
from runner.cells import Cell, cases_on, expand, select, select_cases
from runner.config import load_matrix
from runner.environment import project_state, uncommitted_digest
from runner.errors import ConfigError, ReportError
from runner.merge import finish_partial, plan_partial

DEFAULT_TIMEOUT_S = 3600.0
STACK_SKIPPED = "its docker stack is skipped: see `skipped docker stack(s)` at the start"
"""The summary's reason for a cell of a skipped docker stack: the stack, why and what to do
were named once when the run started (:func:`runner.backends.prepare_stacks`)."""
BYTES_PER_ELEMENT_AT_LEAST = 3 * 2 + 8
"""A lower bound on a case's host memory per element of (N, D) in a 2-byte dtype: the
inputs ``residual``, ``y`` and the upstream gradient (2 bytes each) and the float64
reference's output (8 bytes). The real need is several times more."""
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "int64": 8, "int32": 4}


def case_bytes_at_least(matrix, case) -> tuple[int, str, int]:
    """A lower bound on the host memory of ``case``, and the key to blame when it is too big.

    Counts every tensor the case must hold at once, by the op's spec: its floating-point
    inputs (the upstream gradient among them) in the case's dtype, the float64 reference's
    forward output (8 bytes an element, when the matrix has an accuracy reference) and the
    index (N in the index dtype). Tensors of one shape add up into one term; returns
    ``(bytes, key, value)``: the key is the largest size of the term that dominates (``"n"``
    for the case's N, else ``"problem.<size>"``; the first of equal sizes).

    Example::

        >>> m = load_matrix("matrix.yaml"); case_bytes_at_least(m, m.cases[0])[1:]
        ('problem.D', 5376)
    """
    import ops

    spec, sizes = ops.get(matrix.op), {**matrix.problem.sizes, "N": case.n}
    dtype, index_dtype = matrix.case_dtypes(case)
    terms: dict[tuple[str, ...], int] = {}

    def add(shape: tuple[str, ...], itemsize: int) -> None:
        terms[shape] = terms.get(shape, 0) + math.prod(sizes[s] for s in shape) * itemsize

    for shape in spec.inputs.values():
        add(tuple(shape), _ITEMSIZE[dtype])
    if matrix.accuracy_reference:
        add(tuple(spec.outputs[spec.forward].shape), 8)
    rows = next(iter(s for s in spec.inputs.values() if s[0] == "N"), ("N",))
    add(tuple(rows), 0)
    terms[tuple(rows)] += case.n * _ITEMSIZE[index_dtype]
    shape = max(terms, key=terms.__getitem__)
    symbol = max(shape, key=lambda s: (sizes[s], -shape.index(s)))
    key = "n" if symbol == "N" else f"problem.{symbol}"
    return sum(terms.values()), key, sizes[symbol]


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (no CUDA context is created)."""
    import torch

    return torch.cuda.is_available()


def host_memory_bytes() -> int | None:
    """This host's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


@dataclass(frozen=True)
class CellOutcome:
    """One row of the run summary."""

    cell: str
    status: str
    reason: str | None
    path: Path
    reused: bool = False


def check_case_sizes(matrix, cases, matrix_path: Path, memory: int | None) -> None:
    """Refuse a case that cannot fit in this host's memory, before anything runs.

    ``memory``: the host's bytes (:func:`host_memory_bytes`); None skips the check. The
    bound is :func:`case_bytes_at_least` (every tensor: N, D, G and the dtypes), so a
    refused case could never have run here (N = 10**11 or G = 10**12 needs petabytes); one
    that passes may still end ``oom`` in its cell. The message names the key to lower.

    Raises:
        ConfigError: e.g. ``matrix.yaml: cases[5].n: expected a size whose inputs fit in
            this host's memory, got 100000000000 (...)``.
    """
    if not memory:
        return
    index = {c.id: i for i, c in enumerate(matrix.cases)}
    for case in cases:
        need, key, value = case_bytes_at_least(matrix, case)
        if need > memory:
            key = f"cases[{index[case.id]}].n" if key == "n" else key
            p = matrix.problem
            raise ConfigError(
                f"{matrix_path.name}: {key}: expected a size whose tensors fit in this host's "
                f"memory, got {value} (case {case.id}: N = {case.n}, "
                + "".join(f"{k} = {v}, " for k, v in p.sizes.items()) +
                f"{'/'.join(matrix.case_dtypes(case))}: at least {_bytes(need)} for the "
                f"inputs, the upstream gradient and the reference's output; "
                f"this host has {_bytes(memory)})")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"  # pragma: no cover


def _fingerprint_extra(backend, matrix, cell) -> dict:
    """What the backend adds to a cell's fingerprint (a docker image id); {} if nothing."""
    extra = getattr(backend, "fingerprint_extra", None)
    return dict(extra(matrix, cell)) if extra else {}


def _write(report: dict, reports_dir: Path) -> Path:
    """:func:`runner.report.write_report`, with an OS error as a :class:`ReportError`."""
    try:
        return report_io.write_report(report, reports_dir)
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot write {report['cell']['id']}.json: "
                          f"{err.strerror or err}") from err


def _write_skipped(skipped: dict, path: Path, reports_dir: Path) -> str:
    """Write a ``skipped`` report unless ``path`` already holds a readable report with
    results (say, the H200 cell committed from another machine): a host that cannot run a
    cell must not erase what a host that could run it measured. Returns the reason shown."""
    if path.exists():
        existing = report_io.read_report(path)
        if existing.data and existing.data.get("status") not in (None, "skipped"):
            return (f"{skipped['reason']}; kept the existing {existing.data['status']} report "
                    f"({(existing.data.get('environment') or {}).get('gpu') or 'no GPU'}, "
                    f"{existing.data.get('finished_at', '?')})")
    _write(skipped, reports_dir)
    return skipped["reason"]


def _reusable(path: Path, expected_fingerprint: str) -> bool:
    if not path.exists():
        return False
    loaded = report_io.read_report(path)
    return bool(loaded.data and loaded.data.get("status") == "ok"
                and loaded.data.get("fingerprint") == expected_fingerprint)


def run_matrix(matrix_path: Path, *, reports_dir: Path, stacks: Sequence[str] | None = None,
               modes: Sequence[str] | None = None, targets: Sequence[str] | None = None,
               cases: Sequence[str] | None = None, backend: str = "host", force: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, render: bool = True,
               gpus: str = "all", abba: str | None = None, build: bool = False,
               cluster: str | None = None, gpu_model: str | None = None,
               retries: int = 2) -> list[CellOutcome]:
    """Run the selected cells and write one report per cell, then the tables.

    ``backend`` is host, docker or auto (docker when an engine answers); a cell of a
    ``kind: docker`` stack in a host run is ``skipped`` with the reason, a ``kind: host``
    stack always runs on the host (:func:`runner.backends.route`). No image is built unless
    ``build`` (``--build``: the missing ones first, before any cell): under ``auto`` a
    docker stack without its image, or lacking what its build needs (base image,
    wheelhouse, CA bundle), is ``skipped``, and the skipped stacks are named once with the
    command that builds them (:func:`runner.backends.prepare_stacks`); under ``docker`` a
    missing image is a :class:`BackendError` before anything runs, and a stack lacking
    anything else ends ``build_error``. ``gpus`` ("all" or ids like "0,1") is the docker
    backend's GPU request for ``cuda`` cells. ``cases`` naming fewer than all the cases is a
    partial run: its cases are merged into each cell's existing report
    (:func:`plan_partial`). ``abba`` (a mode name): each selected cell runs in A-B-B-A
    order against its partner in that mode (:mod:`runner.abba`), always (no reuse), and
    both cells' reports record ``repeatable_across_processes``; cells of mode ``abba``
    itself run only as partners. ``cluster`` (a Ray address, :mod:`runner.cluster`): the
    cells that must run go to the cluster's nodes at once, each needing ``gpu_model``'s
    resource when given, each retried ``retries`` times where its node dies; their
    reports come back here and are written as here.

    Raises :class:`ConfigError` (nothing run or written) for a bad matrix.yaml, a selection
    that matches nothing, an explicitly requested target this host lacks, an unknown
    backend, a malformed ``gpus``, a timeout that is not a positive number of seconds or a
    selected case too big for this host's memory (:func:`check_case_sizes`);
    :class:`ReportError` when a report cannot be written. Cells that fail are outcomes,
    not exceptions.
    """
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {timeout_s!r}")
    try:
        matrix_path, reports_dir = Path(matrix_path).resolve(), Path(reports_dir).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ConfigError(f"--matrix/--reports: cannot resolve the path: {err}") from err
    matrix = load_matrix(matrix_path, known_implementations=implementations.known)
    made = {"docker": DockerBackend(gpus=gpus, matrix_dir=Path(matrix_path).parent,
                                    build=build)}
    if cluster is None:
        chosen, note = resolve(backend, made["docker"])  # ConfigError, BackendError
    else:  # the nodes' engines run the docker stacks: none is asked for here
        chosen, note = cluster_mod.backend_choice(backend, abba), None
    cells = select(expand(matrix), stacks=stacks, modes=modes, targets=targets)
    if abba is not None:
        if abba not in matrix.modes:
            raise ConfigError(f"--abba: expected one of the modes ({', '.join(matrix.modes)}), "
                              f"got {abba!r}")
        cells = tuple(c for c in cells if c.mode != abba)
        if not cells:
            raise ConfigError(f"--abba {abba}: the selection has no cell of another mode")
        partnerless = sorted({c.target for c in cells}
                             - {t for t in matrix.targets if matrix.modes[abba].runs_on(t)})
        if partnerless:
            raise ConfigError(f"--abba {abba}: mode {abba} has no cells on target "
                              f"{', '.join(partnerless)}; select another target with --target")
    chosen_cases = select_cases(matrix, cases)
    targets_run = {c.target for c in cells if cases_on(chosen_cases, c.target)}
    if cases and not targets_run:
        raise ConfigError(f"--case: no selected case runs on target "
                          f"{', '.join(sorted({c.target for c in cells}))} (each case's "
                          f"targets: {matrix_path.name})")
    is_partial = len(chosen_cases) < len(matrix.cases)
    if cluster is None and gpu_model is not None:
        raise ConfigError("--gpu-model: places cells on a cluster's nodes; add --cluster")
    if cluster is not None:  # ConfigError without Ray, BackendError when it does not answer
        session = cluster_mod.connect(cluster, gpu_model=gpu_model, retries=retries,
                                      build=build, matrix_dir=Path(matrix_path).parent)
    else:
        session = None
    try:
        return _run_cells(matrix, matrix_path, reports_dir, cells, chosen_cases, session,
                          chosen=chosen, note=note, backend=backend, made=made,
                          targets=targets, is_partial=is_partial, force=force,
                          timeout_s=timeout_s, abba=abba, render=render)
    finally:
        if session is not None:
            session.close()


def _run_cells(matrix, matrix_path: Path, reports_dir: Path, cells, chosen_cases, session, *,
               chosen: str, note: str | None, backend: str, made: dict, targets, is_partial,
               force: bool, timeout_s: float, abba: str | None, render: bool,
               ) -> list[CellOutcome]:
    """:func:`run_matrix` from the cells it selected on: run them here or, with
    ``session`` (a :class:`runner.cluster.Cluster`), on its nodes."""
    if session is not None:
        check_case_sizes(matrix, chosen_cases, matrix_path, session.memory_bytes())
        has_gpu = True  # a node's, if any: cells no node can run are skipped below
    else:
        check_case_sizes(matrix, chosen_cases, matrix_path, host_memory_bytes())
        has_gpu = cuda_available()
    if targets and "cuda" in targets and not has_gpu:
        raise ConfigError("--target: cuda was requested but torch sees no CUDA device here")
    if note:
        print(f"[runner] {note}", flush=True)
    skipped_stacks = {} if session is not None and chosen == "docker" else prepare_stacks(
        matrix, [c for c in cells if c.target != "cuda" or has_gpu], backend, chosen, note,
        made["docker"])  # BackendError; with --build, builds what is missing
    try:
        reports_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"{reports_dir}: cannot create the reports directory: "
                          f"{err.strerror or err}") from err
    for stale in report_io.remove_stale_temp_files(reports_dir):
        print(f"[runner] removed {stale.name}: left by an interrupted write", flush=True)
    project = project_state()
    project["diff_sha256"] = uncommitted_digest() if project.get("dirty") else None
    _salvage_stale(reports_dir, matrix)
    outcomes: list[CellOutcome | None] = []
    jobs: dict[int, tuple] = {}  # for the cluster: outcome index -> (job, plan, resume, stamp)
    for cell in cells:
        path = reports_dir / f"{cell.id}.json"
        run_id = uuid.uuid4().hex
        backend_name, _ = route(matrix.stacks[cell.stack].kind, chosen, note)
        why_not = skipped_stacks.get(cell.stack)
        if why_not is None and cell.target == "cuda" and not has_gpu:
            why_not = "target cuda: torch sees no CUDA device on this host"
        if why_not is None and session is not None:
            why_not = session.unoffered(cluster_mod.needs(matrix, cell, session.gpu_model))
        if why_not:
            skipped = skeleton(matrix, cell, chosen_cases, backend=backend_name or chosen,
                               run_id=run_id, status="skipped", reason=why_not)
            shown = _write_skipped(skipped, path, reports_dir)
            if cell.stack in skipped_stacks:  # its stack was named once, above
                shown = shown.replace(why_not, STACK_SKIPPED, 1)
            else:
                print(f"[runner] cell {cell.id}: skipped: {shown}", flush=True)
            outcomes.append(CellOutcome(cell.id, "skipped", shown, path))
            continue
        if session is None and backend_name not in made:
            made[backend_name] = BACKENDS[backend_name]()
        runner_backend = session or made[backend_name]  # a session: docker image tags
        if abba is not None:
            outcomes += _run_abba(runner_backend, matrix, cell, abba, chosen_cases, project,
                                  matrix_path=matrix_path, reports_dir=reports_dir,
                                  timeout_s=timeout_s)
            continue
        extra = _fingerprint_extra(runner_backend, matrix, cell)
        current = fingerprint(matrix, cell, chosen_cases, project, extra)
        plan = resume = None
        if not force:  # a stopped run of this very selection: only its missing cases
            resume = staging.resumable(path, current, {
                str(case_key(c)) for c in cases_on(chosen_cases, cell.target)})
        if resume is None and is_partial:
            plan = plan_partial(path, matrix, cell, chosen_cases, project, extra, force=force)
            if plan.action == "reuse":
                outcomes.append(CellOutcome(cell.id, "ok", plan.note, path, reused=True))
                continue
            if plan.action == "refuse":
                print(f"[runner] cell {cell.id}: refused: {plan.note}", flush=True)
                outcomes.append(CellOutcome(cell.id, "refused", plan.note, path))
                continue
        elif resume is None and not force and _reusable(path, current):
            outcomes.append(CellOutcome(cell.id, "ok", "same fingerprint: not run again", path,
                                        reused=True))
            continue
        to_run = cases_on(chosen_cases, cell.target)
        if resume is not None:
            missing = {str(c) for c in resume["cases_missing"]}
            to_run = [c for c in to_run if str(case_key(c)) in missing]
            print(f"[runner] cell {cell.id}: resuming: {len(resume['cases'])} case(s) done, "
                  f"running the {len(to_run)} missing on {backend_name}", flush=True)
        else:
            print(f"[runner] cell {cell.id}: running {len(to_run)} case(s) on {backend_name}"
                  + (" (cluster)" if session is not None else ""), flush=True)
        stamp = functools.partial(_stamp, backend=runner_backend, matrix=matrix, cell=cell,
                                  cases=chosen_cases, project=project)
        settle = functools.partial(_settle, plan=plan, resume=resume, stamp=stamp,
                                   backend=runner_backend, matrix=matrix, cell=cell,
                                   project=project, force=force, reports_dir=reports_dir)
        if session is not None:  # run below, all at once; the outcome filled in then
            jobs[len(outcomes)] = (cluster_mod.Job(
                len(outcomes), cell, to_run, run_id, backend_name,
                cluster_mod.needs(matrix, cell, session.gpu_model)), settle)
            outcomes.append(None)
            continue
        result = _run_staged(runner_backend, matrix, cell, to_run, resume,
                             matrix_path=matrix_path, reports_dir=reports_dir, run_id=run_id,
                             timeout_s=timeout_s, stamp=stamp)
        outcomes.append(settle(result, stamped=True))
    if jobs:
        def arrived(job, report: dict) -> None:
            outcomes[job.key] = jobs[job.key][1](report)

        session.run([job for job, _ in jobs.values()], matrix=matrix, matrix_path=matrix_path,
                    timeout_s=timeout_s, commit=project.get("commit"), on_report=arrived)
    if render:
        try:
            tables.write_tables(reports_dir)
        except OSError as err:
            raise ReportError(f"{reports_dir}: cannot write the tables: "
                              f"{err.strerror or err}") from err
    return outcomes


def _settle(result: dict, *, plan, resume: dict | None, stamp, backend, matrix, cell,
            project: dict, force: bool, reports_dir: Path, stamped: bool = False,
            ) -> CellOutcome:
    """Write a cell's report as the runner does for every cell (stamped with its
    fingerprint unless ``stamped``, merged into ``resume`` or the ``--case`` ``plan``, a
    partial one kept by :func:`runner.staging.keep_partial`); return its outcome."""
    if not stamped:
        result = stamp(result)
        if resume is not None:
            result = staging.combine(resume, result, matrix)
    status, reason = result["status"], result.get("reason")
    if plan is not None:
        extra = _fingerprint_extra(backend, matrix, cell)
        result, status, reason = finish_partial(plan, result, matrix, cell, project, extra,
                                                force=force)
    if result is not None and status == "partial":
        if staging.keep_partial(result, reports_dir) is None:
            reason = f"{reason}; kept the ok report of the same fingerprint"
    elif result is not None:
        _write(result, reports_dir)
    return CellOutcome(cell.id, status, reason, reports_dir / f"{cell.id}.json")


def _stamp(result: dict, *, backend, matrix, cell, cases, project: dict) -> dict:
    """``result`` with the runner's fingerprint, which decides reuse and resume. Taken after
    the run, so that what the run made (a docker image and its id) counts as the next run
    will see it."""
    extra = _fingerprint_extra(backend, matrix, cell)
    return {**result, "fingerprint": fingerprint(matrix, cell, cases, project, extra)}


def _run_staged(backend, matrix, cell, cases, resume: dict | None, *, matrix_path: Path,
                reports_dir: Path, run_id: str, timeout_s: float, stamp) -> dict:
    """Run ``cases`` of ``cell`` through ``backend`` into a staging directory and return
    the stamped report (merged into ``resume``, the stopped run's partial report, if any).

    When the run is interrupted (Ctrl-C, SIGTERM, SIGHUP), the partial report the cell left
    in the stage is kept (:func:`runner.staging.keep_partial`) before the interruption goes
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
            if staging.keep_partial(partial, reports_dir) is None:
                pass
            elif partial.get("status") == "partial":
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


def _salvage_stale(reports_dir: Path, matrix) -> None:
    """Remove the staging directories of runs that died, keeping the partial reports found
    there (:func:`runner.staging.clean_stale`, stamped with the fingerprint their runner
    recorded), merged into the partial report they were resuming, if any."""
    for stage, partials in staging.clean_stale(reports_dir):
        kept = []
        for partial in partials:
            if not partial.get("fingerprint"):
                continue
            path = reports_dir / f"{partial['cell']['id']}.json"
            earlier = staging.resumable(path, partial["fingerprint"])
            if earlier is not None:
                partial = staging.combine(earlier, partial, matrix)
            if staging.keep_partial(partial, reports_dir) is not None:
                kept.append(partial["cell"]["id"])
        note = f"; kept partial report(s) of {', '.join(kept)}" if kept else ""
        print(f"[runner] removed {stage.name}: left by a run that died{note}", flush=True)


def _run_abba(backend, matrix, cell, mode_b: str, cases, project, *, matrix_path: Path,
              reports_dir: Path, timeout_s: float) -> list[CellOutcome]:
    """Cell and partner in A-B-B-A order; both merged reports written; their outcomes."""
    from runner import abba

    print(f"[runner] cell {cell.id}: A-B-B-A against mode {mode_b}", flush=True)
    merged = abba.run_abba(backend, matrix, cell, mode_b, cases, matrix_path=matrix_path,
                           reports_dir=reports_dir, timeout_s=timeout_s)
    outcomes = []
    for report in merged:
        one = Cell(report["cell"]["stack"], report["cell"]["mode"], report["cell"]["target"])
        report["fingerprint"] = fingerprint(matrix, one, cases, project,
                                            _fingerprint_extra(backend, matrix, one))
        path = _write(report, reports_dir)
        outcomes.append(CellOutcome(one.id, report["status"], report.get("reason"), path))
    return outcomes


def summary(outcomes: Sequence[CellOutcome]) -> str:
    """A plain-text table of the run's cells: id, status, reason."""
    rows = [(o.cell, o.status + (" (reused)" if o.reused else ""), o.reason or "")
            for o in outcomes]
    return tabulate(rows, headers=("cell", "status", "reason"), tablefmt="simple")


def failed(outcomes: Sequence[CellOutcome]) -> list[CellOutcome]:
    """Outcomes whose status is neither ok nor skipped (``refused`` included: a partial run
    that would have mixed its cases into a report of other code or another machine)."""
    return [o for o in outcomes if o.status not in ("ok", "skipped")]
