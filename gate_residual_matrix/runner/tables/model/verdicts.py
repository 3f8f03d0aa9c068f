"""The verdicts: one line per cell and implementation pair, at the top of the tables.

Each line sums up the pair's rows of the bitwise table over the cases shown: the tensors whose
bits are equal in every case, those that differ (in how many cases, NaN payloads apart), and
for those whether each side repeated its own bits within a process, e.g.

    numba vs eager: out, grad_res, grad_y bitwise equal in all 5 cases; grad_gate differs in
    4 of 5 cases (numba repeatable, eager not repeatable in 3 of 4)

Sources: ``results[impl]["vs <other>"][case]`` (:func:`runner.tables.model.bits.pair_results`) and
``results[impl].repeatable[case][tensor]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.bits import PairResult, pair_results
from gate_residual_matrix.runner.tables.model.cases import case_dtypes, short_dtype
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT

__all__ = ["describe_dtypes", "pair_verdict", "verdict_table"]


def _repeats(cell: CellReport, impl: str, tensor: str, cases: Sequence[str]) -> tuple[int, int]:
    """(cases with in-process repeats recorded, of which not repeatable) for ``impl``."""
    values = [(cell.per_case(impl, "repeatable", c) or {}).get(tensor) for c in cases]
    known = [v for v in values if isinstance(v, bool)]
    return len(known), known.count(False)


def _repeat_clause(cell: CellReport, a: str, b: str, tensor: str, cases: Sequence[str]) -> str:
    """``numba repeatable, eager not repeatable in 3 of 4``, ``both repeatable``; empty when
    the report has no in-process repeats (a foreign report, one repeat)."""
    sides = {x: _repeats(cell, x, tensor, cases) for x in (a, b)}
    words = {}
    for x, (known, failed) in sides.items():
        if known:
            words[x] = ("repeatable" if not failed else "not repeatable" if failed == known
                        else f"not repeatable in {failed} of {known}")
    if len(words) == 2 and len(set(words.values())) == 1 and words[a] in ("repeatable",
                                                                          "not repeatable"):
        return "both repeatable" if words[a] == "repeatable" else "neither repeatable"
    return ", ".join(f"{x} {w}" for x, w in words.items())


def _count(k: int, m: int) -> str:
    """``the one case``, ``both cases``, ``all 5 cases``, ``3 of 5 cases``."""
    if k == m:
        return {1: "the one case", 2: "both cases"}.get(m, f"all {m} cases")
    return f"{k} of {m} cases"


def _tensor_phrase(cell: CellReport, results: Sequence[PairResult], tensor: str) -> tuple[str, str]:
    """(phrase, "equal" or "differ") for one tensor over the pair's cases; ("", "") when
    the tensor is absent from every case."""
    present = [(r.case, r.tensors[tensor]) for r in results if r.tensors.get(tensor)]
    if not present:
        return "", ""
    m = len(present)
    of = "" if m == len(results) else " that have it"
    differ = [(c, cmp) for c, cmp in present if not cmp.get("equal")]
    payload = [c for c, cmp in differ
               if cmp.get("nan_payload_differ") and cmp["nan_payload_differ"] == cmp["differ"]]
    real = [c for c, _ in differ if c not in payload]
    if not differ:
        return f"bitwise equal in {_count(m, m)}{of}", "equal"
    if not real:
        return (f"bitwise equal in {_count(m - len(payload), m)}{of}, NaN payloads apart in "
                f"{', '.join(payload)}", "equal")
    phrase = f"{_count(len(real), m)}{of}"
    clause = _repeat_clause(cell, results[0].a, results[0].b, tensor, real)
    phrase += f" ({clause})" if clause else ""
    if payload:  # besides those: cases where only NaN payloads differ
        phrase += f", and in NaN payloads only in {', '.join(payload)}"
    return phrase, "differ"


def pair_verdict(cell: CellReport, results: Sequence[PairResult]) -> str:
    """The verdict sentence for one pair's results in ``cell`` (all for the same pair).

    Example:
        >>> pair_verdict(cell, pair_results(cell)[:5])
        'out, grad_res, grad_y bitwise equal in all 5 cases; grad_gate differs in 4 of 5 ...'
    """
    groups: dict[tuple[str, str], list[str]] = {}
    absent = []
    names = report_tensors.labels(cell.data)
    for tensor, name in names.items():
        phrase, verb = _tensor_phrase(cell, results, tensor)
        if not phrase:
            absent.append(name)
            continue
        groups.setdefault((verb, phrase), []).append(name)
    parts = []
    for (verb, phrase), group in groups.items():
        if verb == "differ":
            verb = "differs in" if len(group) == 1 else "differ in"
            parts.append(f"{', '.join(group)} {verb} {phrase}")
        else:
            parts.append(f"{', '.join(group)} {phrase}")
    if absent and any(name not in absent for name in names.values()):
        parts.append(f"no {', '.join(absent)} (no backward)")
    return "; ".join(parts) or ABSENT


def describe_dtypes(pairs: Sequence[tuple[str | None, str | None]]) -> str:
    """``bf16, fp16, fp32 × int64, int32`` when the pairs are a full product, else
    ``bf16/int64, fp16/int32``; :data:`ABSENT` when unknown.

    Example:
        >>> describe_dtypes([("bfloat16", "int64"), ("bfloat16", "int32")])
        'bf16 × int64, int32'
    """
    pairs = list(dict.fromkeys(p for p in pairs if p[0] is not None))
    if not pairs:
        return ABSENT
    dtypes = list(dict.fromkeys(d for d, _ in pairs))
    indexes = list(dict.fromkeys(i for _, i in pairs))
    if None not in indexes and len(pairs) == len(dtypes) * len(indexes):
        return f"{', '.join(map(short_dtype, dtypes))} × {', '.join(map(str, indexes))}"
    return ", ".join(short_dtype(d) + (f"/{i}" if i else "") for d, i in pairs)


def _where(cell: CellReport) -> str:
    if cell.gpu:
        return cell.gpu
    return "CPU" if cell.target == "cpu" else ABSENT


def _labels(cells: Sequence[CellReport]) -> str:
    """```out`, `grad_res`, ...``: the labels of the cells' tensors, each once, in order."""
    found: dict[str, None] = {}
    for cell in cells:
        found.update(dict.fromkeys(report_tensors.labels(cell.data).values()))
    return ", ".join(f"`{name}`" for name in found) or "none"


def verdict_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """One row per cell and implementation pair: where it ran, the dtypes, the verdict."""
    rows = []
    for cell in cells:
        status = cell.data.get("status")
        failed = None
        if status not in (None, "ok", "skipped"):  # a failed cell says so before its pairs
            reason = (str(cell.data.get("reason") or "").strip().splitlines() or [""])[0]
            failed = f"**cell {status}**" + (f": {reason}" if reason else "")
        by_pair: dict[tuple[str, str], list[PairResult]] = {}
        for r in pair_results(cell, filters):
            by_pair.setdefault((r.a, r.b), []).append(r)
        if failed and not by_pair:
            rows.append(Row((cell.label, _where(cell), "—", "—", failed), cell.index))
        for (a, b), results in by_pair.items():
            dtypes = describe_dtypes([case_dtypes(cell, r.case) for r in results])
            verdict = pair_verdict(cell, results)
            rows.append(Row((cell.label, _where(cell), dtypes, f"{a} vs {b}",
                             f"{failed}; {verdict}" if failed else verdict), cell.index))
    return Table(
        "verdicts", "Verdicts", ("cell", "on", "dtypes", "pair", "verdict"), rows,
        note="One line per cell and implementation pair, over the cases shown in the bitwise "
             "table below: the tensors whose bits are equal in every case, and those that "
             "differ, in how many cases, and whether each side gave the same bits in every "
             "repeat within its process (`repeatable`) in the cases where they differ. "
             "Tensors, by their labels: " + _labels(cells) + ". A cell whose "
             "status is not ok (error, oom, timeout, mismatch, ...) says so first.",
        empty="No comparisons.")
