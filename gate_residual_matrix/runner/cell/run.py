"""Run one cell in this process and build its report (``docs/report-format.md``).

For every case that runs on the cell's target (a case's ``targets``): build the op's inputs
(its :class:`ops.spec.OpSpec`) from the seed in the case's dtypes (:mod:`contract.inputs`; the
report records them and the rows per index value), run every implementation ``repeats``
times on fresh clones (forward, then backward with the fixed upstream gradient), check
in-process repeatability bit for bit, compare every implementation with the baseline
bitwise (:func:`contract.compare.bitwise`) and with the accuracy reference
(:func:`contract.compare.accuracy`), then time forward and forward+backward.

An implementation that raises is recorded (status ``error`` or ``oom`` with the message) and
the others go on; the cell's status is the worst of its implementations', or ``mismatch``
when an implementation breaks one of its ``bitwise_claims``.
"""

from __future__ import annotations

import concurrent.futures as futures
import datetime as dt
import hashlib
import json
import os
import time
from collections.abc import Callable

from gate_residual_matrix import ops
from gate_residual_matrix.contract import compare, compile_aside, gpu_budget, gpu_lock
from gate_residual_matrix.contract.base import Implementation
from gate_residual_matrix.contract.inputs import build
from gate_residual_matrix.runner.cell import case as cases_of_cell
from gate_residual_matrix.runner.cell import environment, precompile
from gate_residual_matrix.runner.cell.case import CaseContext, out_of_memory, run_case
from gate_residual_matrix.runner.cell.heartbeat import Heartbeat
from gate_residual_matrix.runner.cell.phases import PhaseClock
from gate_residual_matrix.runner.plan.cells import cases_on
from gate_residual_matrix.runner.reports.store import KIND, SCHEMA_VERSION
from gate_residual_matrix.runner.status import SEVERITY, Status

__all__ = ["fingerprint", "out_of_memory", "run_cell", "skeleton"]


def now_utc() -> str:
    """Now in UTC, as reports write their times (``2026-12-01T18:05:30Z``)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def case_key(case) -> int | str:
    """The case id as the report's ``cases`` list holds it: int N for a plain case in the
    problem's dtypes (as the reference report has it), else the id (``"257-specials"``,
    ``"257-float16-int32"``)."""
    return case.n if case.id == str(case.n) else case.id


def _without_targets(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "targets"}


def fingerprint(matrix, cell, cases, project: dict, extra: dict | None = None) -> str:
    """sha256 hex over what decides a cell's bits, and nothing else.

    Covered: the matrix content all cells share (everything but ``stacks``, ``modes`` and
    ``targets``), this cell's stack (name, kind, pins) and mode (name, env, torch settings),
    its target, the selected cases that run on it, ``project`` (commit, dirty flag and, from
    the runner, a digest of the uncommitted changes) and the backend's ``extra`` (a docker
    image id). Adding or editing another stack, mode or target, or the ``targets`` of a mode
    or case, leaves this cell's fingerprint alone (unless it changes this cell's cases).
    """
    content = matrix.to_dict()
    shared = {k: v for k, v in content.items() if k not in ("stacks", "modes", "targets")}
    shared["cases"] = [_without_targets(c) for c in shared["cases"]]
    doc = {"stack": [cell.stack, content["stacks"][cell.stack]],
           "mode": [cell.mode, _without_targets(content["modes"][cell.mode])],
           "target": cell.target, "matrix": shared,
           "cases": [str(case_key(c)) for c in cases_on(cases, cell.target)],
           "project": project, "extra": extra or {}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def skeleton(matrix, cell, cases, *, backend: str, run_id: str, status: str,
             reason: str | None = None, env: dict | None = None) -> dict:
    """A report with no results: the frame every report shares (also for skipped cells).

    ``cases`` are the selected cases; those whose ``targets`` leave out this cell's target
    are not listed.
    """
    project = (env or {}).get("project") or environment.project_state()
    p = matrix.problem
    spec = ops.get(matrix.op)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "op": matrix.op,
        "tensors": spec.table(),
        **({"index_groups": spec.groups} if spec.groups else {}),
        "run_id": run_id,
        "cell": {"id": cell.id, "stack": cell.stack, "mode": cell.mode, "target": cell.target,
                 "backend": backend},
        "status": status,
        "reason": reason,
        "log_tail": None,
        "exit_code": None,
        "fingerprint": fingerprint(matrix, cell, cases, project),
        "started_at": now_utc(),
        "finished_at": now_utc(),
        "duration_s": 0.0,
        "problem": p.as_report(),
        "cases": [case_key(c) for c in cases_on(cases, cell.target)],
        "baseline": matrix.baseline,
        "accuracy_reference": matrix.accuracy_reference,
        "repeats": matrix.repeats,
        "environment": env or {"project": project},
        "inputs": {},
        "results": {},
    }


def _entry(impl: Implementation, target: str) -> dict:
    """An implementation's results entry before any case ran (``unavailable`` with the
    reason where it cannot run on ``target`` here)."""
    entry = {"source": impl.source, "has_backward": impl.has_backward, "role": impl.role,
             "code_path": impl.ran(), "status": Status.OK, "reason": None, "sha256": {},
             "repeatable": {}, "accuracy": {}, "timings": {}, "mutated_inputs": {}}
    why = impl.unavailable_reason(target)
    if why:
        entry.update(status=Status.UNAVAILABLE, reason=why)
    return entry


def _entries(report: dict, matrix, target: str, clock: PhaseClock) -> list:
    """The matrix's implementation rows, each with its :func:`_entry` in ``report["results"]``
    (in the matrix's order), each a part of ``clock``'s setup."""
    from gate_residual_matrix.runner.cell import catalog

    rows = catalog.rows(matrix)
    report["results"] = {}
    for impl in rows:
        with clock.part(impl.name):
            report["results"][impl.name] = _entry(impl, target)
    return rows


def _run_order(impls: list, matrix) -> list:
    """The accuracy reference first, then the baseline, then the others in matrix order: each
    implementation is compared with both as soon as it has run (runner/cell/case.py)."""
    first = [matrix.accuracy_reference, matrix.baseline]
    return sorted(impls, key=lambda i: first.index(i.name) if i.name in first else 2)


def case_weight(matrix, case) -> float:
    """A case's expected share of the cell's time, for the time-left estimate: a fixed part
    plus one per 64 MiB of the op's forward output in the case's dtype."""
    dtype, _ = matrix.case_dtypes(case)
    size = {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype, 4)
    spec = ops.get(matrix.op)
    numel = 1
    for extent in spec.shape(spec.forward, n=case.n, sizes=matrix.problem.sizes):
        numel *= extent
    return 1.0 + numel * size / 2**26


_MAX_REASON = 65536
"""Characters of a reason the schema takes (runner/schema/report.schema.json)."""


def _bounded(text: str) -> str:
    """``text`` cut to :data:`_MAX_REASON` characters, saying how much was cut."""
    if len(text) <= _MAX_REASON:
        return text
    note = f" … ({len(text) - _MAX_REASON + 80} more characters)"
    return text[:_MAX_REASON - 80] + note


def _finish_status(report: dict, matrix, broken: list[str], no_baseline: list[str]) -> None:
    """The cell's status and reason from its implementations' (see the module docstring);
    every reason bounded (:func:`_bounded`)."""
    _set_status(report, matrix, broken, no_baseline)
    for holder in (report, *report["results"].values()):
        if holder.get("reason"):
            holder["reason"] = _bounded(holder["reason"])


def _set_status(report: dict, matrix, broken: list[str], no_baseline: list[str]) -> None:
    results = report["results"]
    for entry in results.values():
        changed = {k: v for k, v in entry["mutated_inputs"].items() if v}
        if changed and entry["status"] == Status.OK:
            entry["reason"] = "mutates its inputs: " + "; ".join(
                f"case {k}: {', '.join(v)}" for k, v in changed.items())
    worst = max((r["status"] for r in results.values()), key=lambda s: SEVERITY.get(s, 0))
    if SEVERITY.get(worst, 0) >= 2:
        report["status"] = worst
        report["reason"] = "; ".join(f"{n}: {r['reason']}" for n, r in results.items()
                                     if r["status"] in (Status.ERROR, Status.OOM))
        tracebacks = "\n".join(f"{n}: {r['traceback']}" for n, r in results.items()
                               if r.get("traceback"))
        report["log_tail"] = tracebacks[-6000:] or None
    elif no_baseline:  # nothing in those cases was compared: not an ok cell
        base = results[matrix.baseline]
        why = base["reason"] or "; ".join(sorted(set((base.get("unsupported") or {}).values())))
        report["status"] = Status.ERROR
        report["reason"] = (f"baseline {matrix.baseline} gave no result in case(s) "
                            f"{', '.join(no_baseline)} ({why or 'no output'}), so nothing "
                            "there was compared with it")
    elif broken:
        report["status"] = Status.MISMATCH
        report["reason"] = "bitwise claim broken: " + ", ".join(broken)


def partial_view(report: dict, done: list, missing: list, *, reason: str | None = None) -> dict:
    """A ``partial`` report of the cases ``done`` so far (a shallow copy of ``report``): its
    ``cases`` are those, ``cases_missing`` the rest. What a cell leaves when it is stopped."""
    return {**report, "status": Status.PARTIAL, "cases": list(done), "cases_missing": list(missing),
            "reason": reason or (f"{len(done)} of {len(done) + len(missing)} cases done; the "
                                 "next run of this cell runs only the missing ones"),
            "finished_at": now_utc()}


def run_cell(matrix, cell, cases, *, backend: str = "host", run_id: str = "",
             timings: bool = True, mode_environment: dict | None = None,
             on_case: Callable[[dict, dict], None] | None = None,
             expected: dict[str, float] | None = None) -> dict:
    """Run ``cases`` of ``matrix`` for ``cell`` here and return the report dict (not written).

    ``cell.target`` "cuda" needs ``torch.cuda.is_available()``; the caller checks. The
    accuracy reference computes in float64 on its own device (fp64: the cell's). A mode with
    ``torch.inference_mode`` runs forward only, under ``torch.inference_mode()``; its
    variables are ``mode_environment`` (what the cell command set:
    :func:`runner.cell.modes.mode_environment`; by default the mode's declared ones). Every call
    gets fresh clones, compared with the inputs afterwards (``mutated_inputs``). With
    ``batch_invariance`` in the matrix, implementations with a backward are checked
    (:mod:`runner.cell.batch_invariance`). The report's ``phases`` say where the time went
    (:mod:`runner.cell.phases`).

    Each case runs in its own dtypes (:meth:`runner.config.matrix.Matrix.case_dtypes`), on inputs
    keyed by its id without them (``Case.base_id``). Cases whose ``targets`` leave out this
    cell's target are not run; when no selected case is left the cell is ``skipped``. An
    implementation with a ``dtypes`` attribute that leaves out a case's dtype is not run on
    it (``results[impl].unsupported[case]`` says why). Timings are taken where ``timings``
    and the matrix's ``timing.targets`` include the cell's target.

    ``on_case(partial, progress)``: called after each case but the last with
    :func:`partial_view` of the report so far (the cell command writes it, so a cell stopped
    later keeps its finished cases) and ``progress`` (``{"case", "id", "of", "case_s",
    "elapsed_s", "eta_s"}``); after the last case with the final report. ``expected``: the
    seconds each case took in this cell's previous run (its report's ``phases.cases``), for
    the time-left estimate (:func:`_progress`).
    """
    from gate_residual_matrix.contract import versioned

    t0 = time.perf_counter()
    device = "cuda" if cell.target == "cuda" else "cpu"
    clock = PhaseClock(sync=device == "cuda")
    mode = matrix.modes[cell.mode]
    with clock("setup"):
        with clock.part("environment"):
            env = environment.capture(cell.target,
                                      mode_environment or {cell.mode: dict(mode.env)})
        report = skeleton(matrix, cell, cases, backend=backend, run_id=run_id, status=Status.OK,
                          env=env)
        rows = _entries(report, matrix, cell.target, clock)
        impls = _run_order(rows, matrix)
    cases = _cases_here(report, cases, cell.target)
    with clock("setup"), clock.part("compile_aside"):
        _share_gpu(env, device, impls)
    _precompile(matrix, cell, cases, env, clock)
    per_case: dict[str, float] = {}
    with futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                    thread_name_prefix="sha256") as hasher:
        ctx = CaseContext(spec=ops.get(matrix.op), matrix=matrix, target=cell.target,
                          device=device, impls=impls, results=report["results"], clock=clock,
                          hasher=hasher, inference=bool(mode.torch.inference_mode),
                          with_timings=timings and matrix.timing.runs_on(cell.target),
                          deferred=[] if gpu_lock.path() is not None else None)
        weights = [case_weight(matrix, c) for c in cases]
        for number, case in enumerate(cases, start=1):
            started = time.perf_counter()
            key = _run_one_case(ctx, report, case)
            per_case[key] = round(time.perf_counter() - started, 3)
            elapsed = time.perf_counter() - t0
            progress = _progress(number, key, per_case, weights, elapsed, expected=expected,
                                 left=[str(case_key(c)) for c in cases[number:]])
            if on_case is not None and number < len(cases):
                on_case(_snapshot(report, cases, number, elapsed, clock, per_case), progress)
            elif on_case is not None:
                last_progress = progress
        _time_deferred(ctx)
    _finish_status(report, matrix, ctx.broken if cases else [], ctx.no_baseline if cases else [])
    report["finished_at"] = now_utc()
    report["duration_s"] = round(time.perf_counter() - t0, 3)
    report["phases"] = {**clock.as_report(total_s=report["duration_s"]), "cases": per_case}
    report["exit_code"] = 0
    env["load_average"]["end"] = environment.load_average()
    if loaded := versioned.environment_record(rows):  # how each library row was loaded
        env["kernel_only"] = loaded
    if on_case is not None and cases:
        on_case(report, last_progress)
    return report


def _share_gpu(env: dict, device: str, impls: list) -> None:
    """Record whether the cell shares its GPU under the lock (``env["gpu_lock"]``); on a
    GPU, let the lock go while compiling (:mod:`contract.compile_aside`; the hooks in are
    ``env["compile_aside"]``), and where one of ``impls`` uses ``torch.compile``, import
    what it imports first."""
    env["gpu_lock"] = gpu_lock.path() is not None
    compiles = any(getattr(i, "compiles_per_shape", False) for i in impls)
    if device == "cuda" and (hooks := compile_aside.install(compilers=compiles)):
        env["compile_aside"] = hooks


def _time_deferred(ctx: CaseContext) -> None:
    """Where the GPU is shared (``ctx.deferred``): every case's timings in one exclusive
    pass after the last case, with a line at least every heartbeat."""
    if ctx.deferred:
        with Heartbeat(f"{ctx.matrix.op} timings of {len(ctx.deferred)} case(s)"):
            cases_of_cell.time_pending(ctx, ctx.deferred)


def _precompile(matrix, cell, cases: list, env: dict, clock: PhaseClock) -> None:
    """Compile the cell's kernels ahead of its cases in worker processes, where the plan
    has calls and there are CPUs for them; or only load them when an earlier precompile
    left its stamp on this cache. Records ``env["precompile"]``."""
    mode = matrix.modes[cell.mode]
    p = matrix.problem
    calls = precompile.cell_plan(matrix, cell, cases)
    workers = precompile.workers_for(calls, environment.available_cpus())
    if not workers:
        return
    stamp = precompile.stamp_key(calls, torch_settings=mode.torch.model_dump(),
                                 mode_env=dict(mode.env), op=matrix.op, sizes=p.sizes,
                                 target=cell.target)
    if precompile.stamped(stamp, calls):  # an earlier precompile filled this cache: load only
        env["precompile"] = {"workers": 0, "calls": len(calls), "seconds": 0.0,
                             "failed": [], "stamp": stamp}
        precompile.load_only()
    else:  # their compiling may time kernels on the GPU (autotuning): shared lock
        share = gpu_budget.WORKER_MIB * workers if cell.target == "cuda" else 0
        with clock("precompile"), gpu_budget.reserve(share, "precompile"), gpu_lock.shared():
            env["precompile"] = precompile.run(
                calls, torch_settings=mode.torch.model_dump(), op=matrix.op,
                sizes=p.sizes, target=cell.target, workers=workers)
        precompile.leave_stamp(stamp, calls, env["precompile"])


def _run_one_case(ctx: CaseContext, report: dict, case) -> str:
    """Build ``case``'s inputs, run every implementation on them (:func:`run_case`) and
    record the inputs with their sha256 in ``report["inputs"]``; returns the case's key."""
    matrix, spec, clock, p = ctx.matrix, ctx.spec, ctx.clock, ctx.matrix.problem
    key = str(case_key(case))
    dtype, index_dtype = matrix.case_dtypes(case)
    with clock("inputs"):
        x = build(spec, n=case.n, sizes=p.sizes, dtype=dtype, index_dtype=index_dtype,
                  seed=p.seed, specials=case.specials, grouped=case.grouped,
                  case_id=case.base_id)
        input_hashes = {k: ctx.hasher.submit(compare.tensor_sha256, v)
                        for k, v in x.tensors.items()}
        report["inputs"][key] = {"n": case.n, "specials": case.specials,
                                 **({"grouped": True} if case.grouped else {}),
                                 "dtype": dtype, "index_dtype": index_dtype,
                                 "sha256": None,
                                 **({"index_counts": x.index_counts(p.sizes[spec.groups])}
                                    if spec.groups else {})}
    # on a GPU host's shared GPU: the case's share of the memory, waited for outside the lock
    with gpu_budget.reserve(gpu_budget.mib_of(x.tensors.values(), gpu_budget.COPIES)
                            if ctx.device == "cuda" else 0, "case"):
        run_case(ctx, case, x, key, dtype)
    with clock("hashing"):
        report["inputs"][key]["sha256"] = {k: f.result() for k, f in input_hashes.items()}
    return key


def _snapshot(report: dict, cases: list, number: int, elapsed: float, clock: PhaseClock,
              per_case: dict[str, float]) -> dict:
    """The ``partial`` report after the first ``number`` of ``cases``, with the time and
    phases so far: what ``on_case`` gets before the last case."""
    done = [case_key(c) for c in cases[:number]]
    missing = [case_key(c) for c in cases[number:]]
    snapshot = partial_view(report, done, missing)
    snapshot["duration_s"] = round(elapsed, 3)
    snapshot["phases"] = {**clock.as_report(total_s=elapsed), "cases": per_case}
    return snapshot


def _cases_here(report: dict, asked, target: str) -> tuple:
    """The cases of ``asked`` that run on ``target``; none of them: ``report`` is
    ``skipped``, with each case's targets in the reason."""
    cases = cases_on(asked, target)
    if asked and not cases:
        report["status"] = Status.SKIPPED
        report["reason"] = (f"no selected case runs on target {target} (case targets: "
                            + ", ".join(f"{c.id}: {'/'.join(c.targets or ())}" for c in asked)
                            + ")")
    return cases


def _progress(number: int, key: str, per_case: dict[str, float], weights: list[float],
              elapsed: float, *, left: list[str] | None = None,
              expected: dict[str, float] | None = None) -> dict:
    """What ``on_case`` gets after case ``number`` (1-based) of ``len(weights)``, with the time
    left. Where ``expected`` (seconds per case key, from this cell's previous report) has
    every case ``left`` (their keys), the estimate is their previous times, scaled by how
    this run's cases after the first compare with theirs (the first pays for imports and
    compiling, in both runs). Otherwise: the rate of the cases after the first, weighted by
    :func:`case_weight` (after the first case, its own rate)."""
    if expected and left is not None and all(k in expected for k in left):
        again = [k for k in list(per_case)[1:] if expected.get(k)]
        scale = (sum(per_case[k] for k in again) / sum(expected[k] for k in again)
                 if again else 1.0)
        eta = scale * sum(expected[k] for k in left)
        return {"case": number, "of": len(weights), "id": key, "case_s": per_case[key],
                "elapsed_s": round(elapsed, 1), "eta_s": round(eta, 1)}
    done_w, left_w = sum(weights[1:number]), sum(weights[number:])
    since_first = sum(list(per_case.values())[1:])
    eta = (since_first / done_w * left_w if done_w
           else per_case[key] / weights[0] * left_w)
    return {"case": number, "of": len(weights), "id": key, "case_s": per_case[key],
            "elapsed_s": round(elapsed, 1), "eta_s": round(eta, 1)}
