"""Partial runs merged into a cell's existing report, case by case.

Two kinds of partial run meet an existing report: a ``--case`` selection (fewer cases than
the matrix names: :func:`plan_partial` decides before the run, :func:`finish_partial`
after it) and the resume of a cell that was stopped (its ``partial`` report lists
``cases_missing``: :mod:`runner.backends.staging` runs only those). Both merge with
:func:`merge_reports`, and only reports of the same code, matrix and machine
(:data:`MACHINE_KEYS`) are merged.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.cell.run import fingerprint
from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.cells import Cell, select_cases
from gate_residual_matrix.runner.reports import store as report_io

MACHINE_KEYS = ("gpu", "capability", "driver", "torch", "cuda", "python", "libraries", "cpu",
                "torch_cpu_capability", "tf32", "mode_environment", "project")
"""``environment`` keys that must agree for two runs' cases to share one report (``host``
and ``platform`` may differ: a container's host name is its id)."""


@dataclass(frozen=True)
class PartialPlan:
    """What a partial run does with a cell's existing report.

    ``action``: ``fresh`` (no report to keep: none, unreadable, skipped), ``replace`` (a
    failed report, or ``--force`` over one that cannot take the cases), ``merge``,
    ``reuse`` (the report is current and holds every selected case) or ``refuse`` (it holds
    other cases of other code or another machine: not run, kept). ``old``: the report.
    """

    action: str
    old: dict | None = None
    note: str | None = None


def _case_ids(report: dict) -> list[str]:
    return [str(c) for c in report.get("cases") or []]


def plan_partial(path: Path, matrix: Matrix, cell: Cell, cases: Sequence[Case],
                 project: dict[str, Any], extra: dict[str, Any], *,
                 force: bool) -> PartialPlan:
    """Decide, before running, what a partial run of ``cell`` does with ``path``.

    The existing report can take the run's cases when it is ``ok`` and its fingerprint is
    the one this run would give its own case list: same matrix content, stack, mode,
    target, project commit and uncommitted diff, and docker image.
    """
    loaded = report_io.read_report(path) if path.exists() else None
    old = loaded.data if loaded and loaded.origin == "ours" else None
    if old is None or old.get("status") == "skipped" or old["cell"]["id"] != cell.id:
        return PartialPlan("fresh")
    if old["status"] != "ok":
        return PartialPlan("replace", old, f"replaced the existing {old['status']} report "
                                           "(a failed report is not merged into)")
    old_ids = _case_ids(old)
    try:
        same = old.get("fingerprint") == fingerprint(
            matrix, cell, select_cases(matrix, old_ids), project, extra)
    except ConfigError:  # a case the matrix no longer has
        same = False
    if same:
        if not force and {c.id for c in cases} <= set(old_ids):
            return PartialPlan("reuse", old, "same fingerprint: not run again")
        return PartialPlan("merge", old)
    made = (old.get("environment") or {}).get("project") or {}
    why = (f"made at commit {made['commit'][:12]}, this checkout is at "
           f"{str(project.get('commit'))[:12]}"
           if made.get("commit") and made["commit"] != project.get("commit") else
           "the matrix file, the stack, the mode, the uncommitted changes or the image differ")
    if force:
        return PartialPlan("replace", old, f"replaced (--force) the report of cases "
                                           f"{', '.join(old_ids)}: {why}")
    return PartialPlan("refuse", old, (
        f"not run: {path.name} holds cases {', '.join(old_ids)} of another fingerprint "
        f"({why}); merging would mix them, so it is kept. Run every case (no --case) to "
        "replace it, or add --force to replace it with these cases only"))


def finish_partial(plan: PartialPlan, result: dict[str, Any], matrix: Matrix, cell: Cell,
                   project: dict[str, Any], extra: dict[str, Any], *,
                   force: bool) -> tuple[dict[str, Any] | None, str, str | None]:
    """After a partial run: (the report to write, or None to keep the existing one; the
    outcome's status; its reason).

    A merge also needs the two runs' machines to agree (:data:`MACHINE_KEYS`; a report the
    runner wrote for a cell process that captured nothing is not compared): when they do
    not, the existing report is kept and this run's is not written (``refused``), or with
    ``force`` replaces it.
    """
    status, reason = result["status"], result.get("reason")
    if plan.action in ("fresh", "replace"):
        return result, status, "; ".join(r for r in (reason, plan.note) if r) or None
    if not _case_ids(result):  # none of the selected cases runs on this cell's target
        return None, status, "; ".join(r for r in (reason, "kept the existing report") if r)
    old = plan.old
    if old is None:  # pragma: no cover - plan_partial gives "merge" with the report only
        raise ValueError("a merge plan without the existing report")
    old_env, new_env = old.get("environment") or {}, result.get("environment") or {}
    differ = [f"{k} {old_env.get(k)!r} -> {new_env.get(k)!r}" for k in MACHINE_KEYS
              if "torch" in new_env and old_env.get(k) != new_env.get(k)]
    if differ and force:
        return result, status, (f"replaced (--force) the report of cases "
                                f"{', '.join(_case_ids(old))}: it was made elsewhere "
                                f"({'; '.join(differ[:3])})")
    if differ:
        return None, "refused", (
            f"not merged: the existing report was made elsewhere ({'; '.join(differ[:3])}), "
            f"so it is kept and this run's {status} result is not written. Run every case "
            "to replace it, or add --force")
    merged = merge_reports(old, result, matrix)
    merged["fingerprint"] = fingerprint(matrix, cell, select_cases(matrix, _case_ids(merged)),
                                        project, extra)
    return merged, status, reason


def merge_reports(old: dict[str, Any], new: dict[str, Any], matrix: Matrix) -> dict[str, Any]:
    """``new`` (a partial run) merged into ``old`` (an ``ok`` report of the same fingerprint
    and machine), case by case.

    Every per-case map (``inputs``, and each map of ``results[impl]`` keyed by case ids:
    ``sha256``, ``vs <impl>``, ``timings``...) keeps ``old``'s entries for the cases ``new``
    did not run and takes ``new``'s for those it did (a case ``new`` lists without data,
    as after a timeout, loses its old data). Everything else is ``new``'s: its status and
    reason (``old`` was ok, so any fault is in ``new``'s cases), run id, times, log tail,
    exit code. ``environment.case_runs`` records, per case, the run id and finish time of
    the run that produced it. Cases are in the matrix's order.
    """
    ran = set(_case_ids(new))
    raw = {str(c): c for c in [*old["cases"], *new["cases"]]}
    order = [c.id for c in matrix.cases if c.id in raw]
    ids = set(order)

    def per_case(o: dict | None, n: dict | None) -> dict:
        both = {**{k: v for k, v in (o or {}).items() if k not in ran}, **(n or {})}
        return {k: both[k] for k in order if k in both}

    def is_per_case(value) -> bool:
        return isinstance(value, dict) and set(value) <= ids

    merged = copy.deepcopy(new)
    merged["cases"] = [raw[c] for c in order]
    merged["inputs"] = per_case(old.get("inputs"), new.get("inputs"))
    results = {}
    for impl in dict.fromkeys([*new.get("results", {}), *old.get("results", {})]):
        o, n = old["results"].get(impl) or {}, new["results"].get(impl)
        entry = copy.deepcopy(n if n is not None else o)
        for key, value in o.items():
            if is_per_case(value) and (n is None or is_per_case(n.get(key, {}))):
                entry[key] = per_case(value, None if n is None else n.get(key))
        gone = _unavailable_in_part(o, n, [c for c in order if c not in ran],
                                    [c for c in order if c in ran])
        if gone:
            entry["status"] = "ok"
        mutated = {k: v for k, v in (entry.get("mutated_inputs") or {}).items() if v}
        if entry.get("status") == "ok":  # an ok implementation's reason, as runner/cell/run.py
            entry["reason"] = "; ".join(r for r in (gone, ("mutates its inputs: " + "; ".join(
                f"case {k}: {', '.join(v)}" for k, v in mutated.items())) if mutated else None)
                if r) or None
        results[impl] = entry
    merged["results"] = results
    old_env = old.get("environment") or {}
    runs = dict(old_env.get("case_runs") or {c: {"run_id": old["run_id"],
                                                 "finished_at": old["finished_at"]}
                                             for c in _case_ids(old)})
    runs.update({c: {"run_id": new["run_id"], "finished_at": new["finished_at"]} for c in ran})
    merged["environment"] = {**old_env, **(new.get("environment") or {}),
                             "case_runs": {c: runs[c] for c in order if c in runs}}
    # a run's shards describe that run's cases only: with another run's cases beside them
    # the record would mislead (case_runs says which run made which case)
    if set(merged["environment"]["case_runs"]) - ran:
        merged["environment"].pop("shards", None)
    return merged


def _unavailable_in_part(o: dict, n: dict | None, kept: list[str], ran: list[str]) -> str | None:
    """When an implementation was ``ok`` in one part of a merge and ``unavailable`` in the
    other (a library file present in one run and not in the next), the merged entry holds
    the ok part's cases: it is ``ok``, and this reason names the cases where it could not
    run and why. None when both parts agree, or when the ok part kept no case."""
    if not o or n is None or {o.get("status"), n.get("status")} != {"ok", "unavailable"}:
        return None
    if o.get("status") == "ok":
        ok_cases, gone, why = kept, ran, n.get("reason")
    else:
        ok_cases, gone, why = ran, kept, o.get("reason")
    if not ok_cases or not gone:
        return None
    return f"unavailable in case(s) {', '.join(gone)}: {why}"
