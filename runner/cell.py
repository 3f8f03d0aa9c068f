"""Run one cell in this process and build its report (``docs/report-format.md``).

For every case that runs on the cell's target (a case's ``targets``): build the inputs from
the seed in the case's dtypes (:mod:`runner.inputs`; the report records them and the rows per
gate index), run every implementation ``repeats`` times on fresh clones (forward, then
backward with the fixed ``grad_out``), check in-process repeatability bit for bit, compare
every implementation with the baseline bitwise (:func:`runner.compare.bitwise`) and with the
accuracy reference (:func:`runner.compare.accuracy`), then time forward and forward+backward.

An implementation that raises is recorded (status ``error`` or ``oom`` with the message) and
the others go on; the cell's status is the worst of its implementations', or ``mismatch``
when an implementation breaks one of its ``bitwise_claims``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
import traceback

import torch

from runner import compare, environment, timing
from runner.cells import cases_on
from runner.implementations import Implementation, get
from runner.inputs import make_inputs

KIND = "gate_residual_matrix"
SCHEMA_VERSION = 1
TENSORS = ("out", "res", "y", "gate")
_SEVERITY = {"ok": 0, "mismatch": 1, "unavailable": 0, "error": 2, "oom": 2}


def _now() -> str:
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


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocator's refusal: CUDA out of memory, :class:`MemoryError`,
    or the CPU allocator's ``RuntimeError: ... can't allocate memory``."""
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def _one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def skeleton(matrix, cell, cases, *, backend: str, run_id: str, status: str,
             reason: str | None = None, env: dict | None = None) -> dict:
    """A report with no results: the frame every report shares (also for skipped cells).

    ``cases`` are the selected cases; those whose ``targets`` leave out this cell's target
    are not listed.
    """
    project = (env or {}).get("project") or environment.project_state()
    p = matrix.problem
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "op": "gate_residual",
        "run_id": run_id,
        "cell": {"id": cell.id, "stack": cell.stack, "mode": cell.mode, "target": cell.target,
                 "backend": backend},
        "status": status,
        "reason": reason,
        "log_tail": None,
        "exit_code": None,
        "fingerprint": fingerprint(matrix, cell, cases, project),
        "started_at": _now(),
        "finished_at": _now(),
        "duration_s": 0.0,
        "problem": {"D": p.D, "G": p.G, "dtype": p.dtype, "index_dtype": p.index_dtype,
                    "seed": p.seed},
        "cases": [case_key(c) for c in cases_on(cases, cell.target)],
        "baseline": matrix.baseline,
        "accuracy_reference": matrix.accuracy_reference,
        "repeats": matrix.repeats,
        "environment": env or {"project": project},
        "inputs": {},
        "results": {},
    }


def _clone(inputs: dict) -> dict:
    return {k: v.clone() for k, v in inputs.items()}


def changed_inputs(before: dict, after: dict) -> list[str]:
    """Names of the inputs whose bits differ between ``before`` and ``after`` (a call's
    clones after it returned); NaN payloads and the sign of zero count."""
    return [k for k, v in before.items()
            if k in after and not torch.equal(compare.bits(v), compare.bits(after[k]))]


def call(impl: Implementation, inputs: dict, *, backward: bool, inference: bool = False):
    """One call on fresh clones: (outputs among TENSORS, detached; names of mutated inputs).

    ``inference``: forward only, under ``torch.inference_mode()``.
    """
    clones = _clone(inputs)
    if inference:
        with torch.inference_mode():
            got = impl.run(clones, backward=False)
    else:
        got = impl.run(clones, backward=backward)
    return ({k: v.detach() for k, v in got.items() if k in TENSORS},
            changed_inputs(inputs, clones))


def _run_repeats(impl: Implementation, inputs: dict, repeats: int, inference: bool = False):
    """First run's outputs, per tensor whether every repeat had the same bits, and the
    inputs any call changed (in order of first change)."""
    backward = impl.has_backward and not inference
    first, mutated = call(impl, inputs, backward=backward, inference=inference)
    same = {k: True for k in first}
    for _ in range(repeats - 1):
        again, changed = call(impl, inputs, backward=backward, inference=inference)
        mutated += [k for k in changed if k not in mutated]
        for k in first:
            same[k] = same[k] and torch.equal(compare.bits(first[k]), compare.bits(again[k]))
        del again
    return first, same, mutated


def _layout(tensors: dict, fn, *, out_list: bool = True) -> dict:
    """``{"out": [fn("out")], "grads": {"res": ..., ...}}`` for the tensors present
    (``out`` is a list in the reference report's comparisons, an object elsewhere)."""
    entry = {"out": [fn("out")] if out_list else fn("out")} if "out" in tensors else {}
    grads = {k: fn(k) for k in ("res", "y", "gate") if k in tensors}
    if grads:
        entry["grads"] = grads
    return entry


def _claims_broken(impl: Implementation, cmp_entry: dict, target: str) -> list[str]:
    """Claimed tensors that differ from the baseline. On the CPU target NaN payloads are
    exempt: eager's own bfloat16 NaN bits there depend on the element's position (vectorised
    block or tail), see kernels/gate_residual_cpu.py."""
    broken = []
    for name in impl.bitwise_claims:
        cmp = cmp_entry["out"][0] if name == "out" else cmp_entry.get("grads", {}).get(name)
        if cmp is None:
            continue
        allowed = cmp["nan_payload_differ"] if target == "cpu" else 0
        if cmp["differ"] > allowed:
            broken.append(name)
    return broken


def _timings(impl: Implementation, inputs: dict, device: str, matrix,
             inference: bool = False) -> dict:
    """Median forward (and forward+backward) times. On the CPU: one warm-up call at most
    (the repeats before it have compiled and warmed everything; at N = 32768 each further
    call costs seconds) and 3 s of timed calls; on a GPU: ``timing.warmup`` calls, 10 s."""
    budget = 10.0 if device == "cuda" else 3.0
    warmup = matrix.timing.warmup if device == "cuda" else min(matrix.timing.warmup, 1)
    kw = {"device": device, "warmup": warmup, "iters": matrix.timing.iters,
          "max_seconds": budget}
    inputs = _clone(inputs)  # an implementation that writes into its inputs spoils only these
    fwd = timing.median_ms(lambda _i: impl.run(inputs, backward=False), **kw)
    out = {"forward_ms": fwd["median_ms"], "forward_iters": fwd["iters"]}
    if impl.has_backward and not inference:
        both = timing.median_ms(lambda _i: impl.run(inputs, backward=True), **kw)
        out.update(forward_backward_ms=both["median_ms"], forward_backward_iters=both["iters"])
    return out


def run_cell(matrix, cell, cases, *, backend: str = "host", run_id: str = "",
             timings: bool = True, mode_environment: dict | None = None) -> dict:
    """Run ``cases`` of ``matrix`` for ``cell`` here and return the report dict (not written).

    ``cell.target`` "cuda" needs ``torch.cuda.is_available()``; the caller checks. The
    accuracy reference always computes on the CPU in float64. ``mode_environment``: what
    the cell command set for the mode (:func:`runner.modes.mode_environment`); by default
    the mode's declared variables. A mode with ``torch.inference_mode`` runs forward only,
    under ``torch.inference_mode()``. Every call gets fresh clones, which are compared with
    the inputs afterwards: ``results[impl]["mutated_inputs"][case]`` lists those it changed.
    With ``batch_invariance`` in the matrix, implementations with a backward are checked
    (:mod:`runner.batch_invariance`).

    Each case runs in its own dtypes (:meth:`runner.config.Matrix.case_dtypes`), on inputs
    keyed by its id without them (``Case.base_id``): ``257-float16-int32`` has the values of
    ``257`` rounded to float16, and the same index. Cases whose ``targets`` leave out this
    cell's target are not run; when no selected case is left the cell is ``skipped``. An
    implementation with a ``dtypes`` attribute that leaves out a case's dtype is not run on
    it (``results[impl].unsupported[case]`` says why).
    """
    from runner import batch_invariance

    t0 = time.perf_counter()
    device = "cuda" if cell.target == "cuda" else "cpu"
    mode = matrix.modes[cell.mode]
    inference = bool(mode.torch.inference_mode)
    mode_env = mode_environment or {cell.mode: dict(mode.env)}
    env = environment.capture(cell.target, mode_env)
    report = skeleton(matrix, cell, cases, backend=backend, run_id=run_id, status="ok", env=env)
    impls = [get(name) for name in matrix.implementations]
    results = report["results"]
    for impl in impls:
        results[impl.name] = {"source": impl.source, "has_backward": impl.has_backward,
                              "role": impl.role, "code_path": impl.ran(), "status": "ok",
                              "reason": None, "sha256": {}, "repeatable": {}, "accuracy": {},
                              "timings": {}, "mutated_inputs": {}}
        why = impl.unavailable_reason(cell.target)
        if why:
            results[impl.name].update(status="unavailable", reason=why)
    broken: list[str] = []
    no_baseline: list[str] = []  # cases where the baseline gave nothing to compare with
    p = matrix.problem
    asked, cases = cases, cases_on(cases, cell.target)
    if asked and not cases:
        report["status"] = "skipped"
        report["reason"] = (f"no selected case runs on target {cell.target} (case targets: "
                            + ", ".join(f"{c.id}: {'/'.join(c.targets or ())}" for c in asked)
                            + ")")
    for case in cases:
        key = str(case_key(case))
        dtype, index_dtype = matrix.case_dtypes(case)
        x = make_inputs(n=case.n, d=p.D, g=p.G, dtype=dtype, index_dtype=index_dtype,
                        seed=p.seed, specials=case.specials, case_id=case.base_id)
        report["inputs"][key] = {"n": case.n, "specials": case.specials, "dtype": dtype,
                                 "index_dtype": index_dtype, "sha256": x.sha256(),
                                 "index_counts": x.index_counts(p.G)}
        on_device = {k: v.to(device) for k, v in x.tensors.items()}
        outputs: dict[str, dict] = {}
        for impl in impls:
            entry = results[impl.name]
            if entry["status"] == "unavailable":
                continue
            supported = getattr(impl, "dtypes", None)  # an optional Implementation field
            if supported and dtype not in supported:
                entry.setdefault("unsupported", {})[key] = (
                    f"takes {', '.join(supported)} only, not {dtype}")
                continue
            repeats = 1 if impl.role == "accuracy_reference" else matrix.repeats
            try:
                inputs = on_device if impl.device is None else x.tensors
                first, same, mutated = _run_repeats(impl, inputs, repeats, inference)
                entry["mutated_inputs"][key] = mutated
                if impl.role != "accuracy_reference" and timings:
                    entry["timings"][key] = _timings(impl, inputs, device, matrix, inference)
                if (matrix.batch_invariance is not None and impl.has_backward
                        and not inference and impl.role != "accuracy_reference"):
                    entry.setdefault("batch_invariant", {})[key] = batch_invariance.check(
                        impl, inputs, max_size=matrix.batch_invariance.max_size)
            except Exception as err:  # an implementation's failure is data, not a crash
                oom = out_of_memory(err)
                entry.update(status="oom" if oom else "error",
                             reason=f"case {key}: {_one_line(err)}",
                             traceback=traceback.format_exc()[-4000:])
                if oom and device == "cuda":
                    torch.cuda.empty_cache()
                continue
            outputs[impl.name] = first
            entry["sha256"][key] = {k: compare.tensor_sha256(v) for k, v in first.items()}
            entry["repeatable"][key] = same if repeats > 1 else {k: None for k in same}
        ref = outputs.get(matrix.accuracy_reference) if matrix.accuracy_reference else None
        base = outputs.get(matrix.baseline)
        if base is None:
            no_baseline.append(key)
        for impl in impls:
            mine = outputs.get(impl.name)
            if mine is None or impl.role == "accuracy_reference":
                continue
            if ref is not None:
                results[impl.name]["accuracy"][key] = _layout(
                    mine, lambda k, m=mine, r=ref: compare.accuracy(m[k], r[k]), out_list=False)
            if base is not None and impl.name != matrix.baseline:
                cmp_entry = _layout(mine, lambda k, m=mine, b=base: compare.bitwise(m[k], b[k]))
                results[impl.name].setdefault(f"vs {matrix.baseline}", {})[key] = cmp_entry
                results[matrix.baseline].setdefault(f"vs {impl.name}", {})[key] = cmp_entry
                broken += [f"{impl.name}.{t}@{key}" for t in _claims_broken(impl, cmp_entry,
                                                                            cell.target)]
        del outputs, on_device
        if device == "cuda":
            torch.cuda.empty_cache()
    for entry in results.values():
        changed = {k: v for k, v in entry["mutated_inputs"].items() if v}
        if changed and entry["status"] == "ok":
            entry["reason"] = "mutates its inputs: " + "; ".join(
                f"case {k}: {', '.join(v)}" for k, v in changed.items())
    worst = max((r["status"] for r in results.values()), key=lambda s: _SEVERITY.get(s, 0))
    if _SEVERITY.get(worst, 0) >= 2:
        report["status"] = worst
        report["reason"] = "; ".join(f"{n}: {r['reason']}" for n, r in results.items()
                                     if r["status"] in ("error", "oom"))
        tracebacks = "\n".join(f"{n}: {r['traceback']}" for n, r in results.items()
                               if r.get("traceback"))
        report["log_tail"] = tracebacks[-6000:] or None
    elif no_baseline:  # nothing in those cases was compared: not an ok cell
        base = results[matrix.baseline]
        why = base["reason"] or "; ".join(sorted(set((base.get("unsupported") or {}).values())))
        report["status"] = "error"
        report["reason"] = (f"baseline {matrix.baseline} gave no result in case(s) "
                            f"{', '.join(no_baseline)} ({why or 'no output'}), so nothing "
                            "there was compared with it")
    elif broken:
        report["status"] = "mismatch"
        report["reason"] = "bitwise claim broken: " + ", ".join(broken)
    report["finished_at"] = _now()
    report["duration_s"] = round(time.perf_counter() - t0, 3)
    report["exit_code"] = 0
    env["load_average"]["end"] = environment.load_average()
    return report
