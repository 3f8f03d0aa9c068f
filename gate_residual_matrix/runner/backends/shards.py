"""One cell's cases over several cell processes at once (its shards), and their reports
combined into the cell's one report.

A cuda cell is bound by its host, not its GPU: at N = 32768 a call is a millisecond of GPU
time, and a cell is mostly Python (dynamo tracing about 400 graphs, autograd, the checks).
So the host backend may run a cell as ``K`` processes of ``python -m gate_residual_matrix cell``,
each with part of the cases (:func:`split`), on the same GPU under :mod:`contract.gpu_lock` (each
case's timing loops alone on the GPU, every other stretch of GPU work shared), and combine their
reports (:func:`combine`). The cases are split by their dtypes first: ``torch.compile``
specialises its graphs on dtype and shape, so shards of different dtypes compile disjoint
graphs and no graph is traced twice.

Nothing in a case depends on the process it runs in: its inputs come from the seed and
its checks compare bits. A sharded cell's report differs from an unsharded one's only in
its times: ``duration_s`` is the runner's wall time for the cell, from the start of the
first process to the end of the last (an unsharded cell's counts from its first case's
set-up, after its imports: the sharded figure is the stricter one), ``phases`` are summed
over the shards (process seconds: they add up to more than the wall time), and
``environment.shards`` records each shard's cases, status and duration.

How many shards (:func:`count`): ``GATE_RESIDUAL_SHARDS`` (``runner matrix --shards``) sets
it; by default a cuda cell takes one shard per dtype group of its cases, up to one per two
CPUs, and a cpu cell one (its cases compute on those CPUs: shards would only share them).

Example::

    >>> from gate_residual_matrix.runner.config.matrix import load_matrix
    >>> m = load_matrix("matrix.yaml")
    >>> [len(part) for part in split(m, m.cases, 6)]
    [5, 5, 5, 5, 5, 5]
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from gate_residual_matrix import settings
from gate_residual_matrix.runner.cell import phases
from gate_residual_matrix.runner.reports.merge import merge_reports
from gate_residual_matrix.runner.status import SEVERITY, Status

ENV = "GATE_RESIDUAL_SHARDS"
"""Shards per cell: a positive integer, or ``auto`` (the default: :func:`count`)."""

MAX_SHARDS = 8

PLAN_FILE = "shards.json"
"""In a sharded cell's stage: ``{"cell": id, "shards": [[case ids], ...]}`` (so that a run
after a dead runner can combine what the shards wrote: :mod:`runner.backends.staging`, which names
the same file)."""

NOTHING_WRITTEN = {"status": Status.ERROR, "reason": "the shard wrote no report"}
"""The stand-in for a shard that wrote nothing, for :func:`combine`."""

_WITH_DATA = (Status.OK, Status.MISMATCH, Status.ERROR, Status.OOM, Status.PARTIAL)


def requested() -> int | None:
    """The shard count :data:`ENV` asks for, None for ``auto`` or unset.

    Raises:
        ValueError: the variable is neither ``auto`` nor a positive integer (one line).
    """
    return settings.get(ENV)


def groups(matrix, cases: Sequence) -> list[list]:
    """``cases`` grouped by (dtype, index dtype), in order of first appearance."""
    out: dict[tuple[str, str], list] = {}
    for case in cases:
        out.setdefault(matrix.case_dtypes(case), []).append(case)
    return list(out.values())


def count(matrix, cases: Sequence, target: str, cpus: int | None) -> int:
    """How many shards a cell of ``cases`` on ``target`` runs in: :data:`ENV` when set (at
    most one per case); else 1 on the cpu target, and on cuda one per dtype group up to
    ``cpus // 2`` and :data:`MAX_SHARDS`."""
    asked = requested()
    if asked is not None:
        return max(1, min(asked, len(cases)))
    if target != "cuda":
        return 1
    return max(1, min(len(groups(matrix, cases)), (cpus or 1) // 2, MAX_SHARDS))


def split(matrix, cases: Sequence, n: int) -> list[list]:
    """``cases`` in at most ``n`` non-empty parts, each in the matrix's order.

    Whole dtype groups first (:func:`groups`); while there are fewer groups than ``n`` the
    heaviest group is halved (its cases alternately); the groups then go to the parts
    heaviest first, each to the lightest part (longest processing time first). Weights:
    :func:`runner.cell.run.case_weight`.
    """
    from gate_residual_matrix.runner.cell.run import case_weight

    weight = {id(c): case_weight(matrix, c) for c in cases}
    units = groups(matrix, cases)
    while len(units) < n:
        heaviest = max(units, key=lambda u: (sum(weight[id(c)] for c in u), len(u)))
        if len(heaviest) < 2:
            break
        units.remove(heaviest)
        units += [heaviest[0::2], heaviest[1::2]]
    parts: list[list] = [[] for _ in range(min(n, len(units)))]
    for unit in sorted(units, key=lambda u: -sum(weight[id(c)] for c in u)):
        lightest = min(parts, key=lambda p: sum(weight[id(c)] for c in p))
        lightest += unit
    order = {id(c): i for i, c in enumerate(cases)}
    return [sorted(p, key=lambda c: order[id(c)]) for p in parts if p]


def _ids(report: dict) -> list[str]:
    return [str(c) for c in report.get("cases") or []]


def _done(report: dict) -> list[str]:
    """The cases a shard's report holds data of (a failed report lists its cases, with
    none)."""
    return [c for c in _ids(report) if c in (report.get("inputs") or {})]


_RESUMES = "; the next run of this cell runs only the missing ones"


def _why(part: dict) -> str:
    return str(part.get("reason") or "").removesuffix(_RESUMES)


_STOPPED_AFTER = re.compile(r"stopped after \d+ of \d+ cases \((?P<why>.*)\)", re.DOTALL)


def stopped_note(stopped: Sequence[tuple[int, dict]]) -> str:
    """Why the shards ``stopped`` (``(index, report)``) stopped, shards with the same reason
    named together: ``shards 1-3, 5 stopped: partial: timeout: ...``. A shard's own "stopped
    after K of M cases" is left out (the cell's reason counts its cases), so that six shards
    stopped by one deadline read as one reason, not six.

    >>> late = "stopped after {} of 5 cases (timeout: late)"
    >>> stopped_note([(0, {"status": "partial", "reason": late.format(3)}),
    ...               (1, {"status": "partial", "reason": late.format(2)}),
    ...               (3, {"status": "error", "reason": "killed"})])
    'shards 1-2 stopped: partial: timeout: late; shard 4 stopped: error: killed'
    """
    whys = []
    for i, p in stopped:
        why = _why(p)
        after = _STOPPED_AFTER.fullmatch(why)
        whys.append((i, f"{p.get('status')}: {after['why'] if after else why}"))
    return _by_reason(whys, " stopped")


def _by_reason(whys: Sequence[tuple[int, str]], verb: str = "") -> str:
    """``(shard index, reason)`` pairs as ``shards 1-3{verb}: reason; shard 5{verb}: ...``,
    the shards with one reason named together, in the order of first appearance."""
    named: dict[str, list[int]] = {}
    for i, why in whys:
        named.setdefault(why, []).append(i + 1)
    return "; ".join(f"{'shard' if len(ns) == 1 else 'shards'} {_spans(ns)}{verb}: {why}"
                     for why, ns in named.items())


def _spans(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``."""
    out, run = [], [numbers[0]]
    for n in numbers[1:]:
        if n == run[-1] + 1:
            run.append(n)
        else:
            out.append(run)
            run = [n]
    out.append(run)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _rank(status: str) -> int:
    return SEVERITY.get(Status(status), 0) if status in Status._value2member_map_ else 0


def _worst(statuses: Sequence[str]) -> str:
    return max(statuses, key=_rank, default=Status.OK)


def _join(texts) -> str | None:
    seen = list(dict.fromkeys(t for t in texts if t))
    return "; ".join(seen) or None


def _environment(parts: Sequence[dict], merged_env: dict) -> dict:
    """The cell's environment: the shards' (one machine), their precompiles summed, the
    load average from the first start to the last end, and ``shards``."""
    envs = [p.get("environment") or {} for p in parts]
    env = dict(merged_env)
    pre = [e["precompile"] for e in envs if isinstance(e.get("precompile"), dict)]
    if pre:
        env["precompile"] = {**pre[0],
                             "workers": sum(int(p.get("workers") or 0) for p in pre),
                             "calls": sum(int(p.get("calls") or 0) for p in pre),
                             "seconds": max(float(p.get("seconds") or 0.0) for p in pre),
                             "failed": [f for p in pre for f in p.get("failed") or []]}
    loads = [e.get("load_average") or {} for e in envs]
    starts = [x["start"] for x in loads if x.get("start") is not None]
    ends = [x["end"] for x in loads if x.get("end") is not None]
    env["load_average"] = {"start": starts[0] if starts else None,
                           "end": max(ends) if ends else None}
    kernel_only: dict = {}
    for e in envs:
        kernel_only.update(e.get("kernel_only") or {})
    if kernel_only:
        env["kernel_only"] = kernel_only
    return env


def combine(parts: Sequence[dict], planned: Sequence[Sequence[str]], matrix, *,
            wall_s: float, started_at: str | None = None,
            finished_at: str | None = None) -> dict:
    """The cell's report from its shards' (``parts``, one per shard, in shard order; each
    final, ``partial``, or a failed report without cases), ``planned[i]`` the case ids
    shard ``i`` was given.

    * Per-case data is the union (:func:`runner.reports.merge.merge_reports`); each
      implementation's status is its worst in any shard, with that shard's reason.
    * Every case done: the worst shard status; the reasons of the shards with it.
    * Some cases not done (a shard stopped or failed): ``partial``, with
      ``cases_missing`` and each stopped shard's reason; the next run resumes it.
    * No case done at all: the first failed shard's report, with every shard's reason.

    ``duration_s`` is ``wall_s``; ``phases`` are summed over the shards; ``environment.
    shards`` lists each shard's cases, status and duration.
    """
    with_data = [p for p in parts if p.get("status") in _WITH_DATA and _ids(p)
                 and p.get("inputs")]
    stopped = [(i, p) for i, p in enumerate(parts)
               if p.get("status") not in _WITH_DATA or p.get("status") == Status.PARTIAL
               or set(_done(p)) != set(planned[i])]
    shard_note = {"count": len(parts),
                  "parts": [{"cases": list(planned[i]), "done": _done(p),
                             "status": str(p.get("status")),
                             "duration_s": p.get("duration_s")} for i, p in enumerate(parts)]}
    if not with_data:
        return _first_failed(parts, stopped, shard_note, wall_s)
    merged = copy.deepcopy(with_data[0])
    for p in with_data[1:]:
        merged = merge_reports(merged, p, matrix)
    _worst_results(merged, with_data)
    order = [c.id for c in matrix.cases]
    every = [c for c in order if c in {x for plan in planned for x in plan}]
    done = set(_ids(merged))
    # as the report's cases list holds ids: int N for a plain case (runner.cell.run.case_key)
    missing = [int(c) if c.isdigit() else c for c in every if c not in done]
    merged["phases"] = None
    for p in with_data:
        merged["phases"] = phases.add(merged["phases"], p.get("phases"))
    if merged["phases"] and isinstance(merged["phases"].get("cases"), dict):
        per_case = merged["phases"]["cases"]
        merged["phases"]["cases"] = {c: per_case[c] for c in every if c in per_case}
    merged["environment"] = {**_environment(with_data, merged.get("environment") or {}),
                             "shards": shard_note}
    merged["duration_s"] = round(wall_s, 3)
    merged["started_at"] = started_at or min(p.get("started_at") or "" for p in with_data)
    merged["finished_at"] = finished_at or max(p.get("finished_at") or "" for p in with_data)
    codes = [p.get("exit_code") for _, p in stopped]
    merged["exit_code"] = next((c for c in codes if c), None if missing else 0)
    merged["log_tail"] = _join(p.get("log_tail") for _, p in stopped)
    if missing:
        merged.update(status=Status.PARTIAL, cases_missing=missing, reason=(
            f"{len(done)} of {len(every)} cases done; " + stopped_note(stopped) + _RESUMES))
        return merged
    merged.pop("cases_missing", None)
    merged["status"], merged["reason"] = _worst_status(with_data)
    return merged


def _first_failed(parts: Sequence[dict], stopped: list[tuple[int, dict]], shard_note: dict,
                  wall_s: float) -> dict:
    """The cell's report when no shard did a case: the first stopped shard's report (else
    the first shard's), with every shard's reason (shards with one reason named together)."""
    first = next((p for _, p in stopped), parts[0])
    out = copy.deepcopy(first)
    out["reason"] = _by_reason([(i, f"{p.get('status')}: {p.get('reason')}")
                                for i, p in enumerate(parts)])
    out["environment"] = {**(out.get("environment") or {}), "shards": shard_note}
    out["duration_s"] = round(wall_s, 3)
    return out


def _worst_results(merged: dict, with_data: Sequence[dict]) -> None:
    """Each implementation's status in ``merged``: its worst in any shard, with the reasons
    of the shards where it had that status (and the first one's traceback)."""
    for name, entry in merged["results"].items():
        entries = [p["results"][name] for p in with_data if name in p.get("results", {})]
        worst = _worst([e["status"] for e in entries])
        if worst != Status.OK:
            bad = [e for e in entries if e["status"] == worst]
            entry.update(status=worst, reason=_join(e.get("reason") for e in bad))
            if bad[0].get("traceback"):
                entry["traceback"] = bad[0]["traceback"]


def _worst_status(with_data: Sequence[dict]) -> tuple[str, str | None]:
    """``(status, reason)`` of a cell whose shards did every case: the worst shard status,
    with the reasons of the shards that have it (broken claims joined into one list)."""
    worst = _worst([p["status"] for p in with_data])
    reasons = [p.get("reason") for p in with_data if p["status"] == worst]
    prefix = "bitwise claim broken: "
    if worst == Status.MISMATCH and all(r and r.startswith(prefix) for r in reasons):
        return worst, prefix + ", ".join(r[len(prefix):] for r in reasons if r)
    return worst, (_join(reasons) if worst != Status.OK
                   else _join(p.get("reason") for p in with_data))


def planned_ids(parts: Sequence[Sequence[Any]]) -> list[list[str]]:
    """Case ids (``runner.cell.run.case_key``) of each part of :func:`split`."""
    from gate_residual_matrix.runner.cell.run import case_key

    return [[str(case_key(c)) for c in part] for part in parts]
