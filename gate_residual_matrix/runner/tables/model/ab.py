"""A/B: two cells side by side, headed by what differs in their set-up, then what changed.

:func:`ab_tables` gives three tables: the configuration keys that differ
(:func:`~runner.tables.model.cells.configuration`: versions, GPU, driver, mode, image, problem),
then per implementation, case and tensor both cells have whether the bits changed (sha256; void
where the inputs differ), max_abs and max ULP against fp64 and in-process repeatability on each
side, then the median times and their ratio.
``python -m gate_residual_matrix report --ab A B`` picks the cells; otherwise :func:`default_ab`
picks two of our cells with results that differ in one facet (stack, mode or target).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.cases import (
    CaseFilter,
    case_order,
    case_problem,
    dtype_label,
)
from gate_residual_matrix.runner.tables.model.cells import CellReport, configuration
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, ms, num

__all__ = ["DEFAULT_WHY", "ab_tables", "default_ab"]


DEFAULT_WHY = ("the default: the first two of our cells with results that differ in one of "
               "stack, mode and target alone (else the first two with results)")


def default_ab(cells: Sequence[CellReport]) -> tuple[CellReport, CellReport] | None:
    """Two of our cells with results, as comparable as they come: the first pair, in the
    cells' order, that differs in one of stack, mode and target alone (what changed is then
    that one facet), else the first two with results; None when fewer than two of ours have
    results (a skipped or failed cell has nothing to compare)."""
    ready = [c for c in cells if c.ours and c.results]
    for i, a in enumerate(ready):
        for b in ready[i + 1:]:
            if sum(getattr(a, f) != getattr(b, f) for f in ("stack", "mode", "target")) == 1:
                return a, b
    return (ready[0], ready[1]) if len(ready) >= 2 else None


def _acc(cell: CellReport, impl: str, case: str, tensor: str) -> Mapping[str, Any] | None:
    acc = cell.per_case(impl, "accuracy", case) or {}
    return report_tensors.flat(acc).get(tensor)


def _inputs_differ(a: CellReport, b: CellReport, case: str) -> bool:
    """Whether case ``case`` ran another problem (the case's own dtypes) or other inputs."""
    ia = ((a.data.get("inputs") or {}).get(case) or {}).get("sha256")
    ib = ((b.data.get("inputs") or {}).get(case) or {}).get("sha256")
    return (case_problem(a, case) != case_problem(b, case)
            or (ia is not None and ib is not None and ia != ib))


def _dtypes(a: CellReport, b: CellReport, case: str) -> str:
    """The case's dtypes, ``A → B`` where the two cells ran it in different ones."""
    da, db = dtype_label(a, case), dtype_label(b, case)
    return da if da == db else f"{da} → {db}"


def _yes(value: Any) -> str:
    return "" if value is None else ("eq" if value else "diff")


def _ratio(a: Any, b: Any) -> str:
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return f"{b / a:.2f}x" if ok and a > 0 else ABSENT


def ab_tables(a: CellReport, b: CellReport, filters: Filters | None = None,
              why: str = "") -> list[Table]:
    """A/B of two cells: configuration differences, bits and accuracy, time."""
    filters = filters or Filters()
    by_dtype = CaseFilter.of(filters)
    ca, cb = configuration(a), configuration(b)
    diffs = [Row((k, ca.get(k, ABSENT), cb.get(k, ABSENT)))
             for k in dict.fromkeys([*ca, *cb]) if ca.get(k, ABSENT) != cb.get(k, ABSENT)]
    head = Table("ab", f"A/B: {a.label} vs {b.label}", ("configuration", "A", "B"), diffs,
                 note=f"A = `{a.label}`, B = `{b.label}`{why}. Configuration keys that "
                      "differ (versions, GPU, driver, mode, image, problem), then what changed.",
                 empty="No configuration differences.")
    both = [i for i in a.results if i in b.results and filters.keeps_impl(i)]
    only = [f"{', '.join(x)} only in {side}" for side, x in (
        ("A", [c for c in case_order(a.cases) if c not in b.case_set]),
        ("B", [c for c in case_order(b.cases) if c not in a.case_set]),
        ("A", [i for i in a.results if i not in b.results and filters.keeps_impl(i)]),
        ("B", [i for i in b.results if i not in a.results and filters.keeps_impl(i)])) if x]
    bits, times = [], []
    for impl in both:
        def cases_of(*keys: str, impl: str = impl) -> list[str]:
            ka, kb = ({c for k in keys for c in (x.results[impl].get(k) or {})} for x in (a, b))
            return [c for c in case_order(ka & kb) if by_dtype.keeps(a, c)]

        for case in cases_of("sha256", "accuracy"):
            for tensor in report_tensors.columns((a.data, b.data)):
                sa = (a.per_case(impl, "sha256", case) or {}).get(tensor)
                sb = (b.per_case(impl, "sha256", case) or {}).get(tensor)
                fa, fb = _acc(a, impl, case, tensor) or {}, _acc(b, impl, case, tensor) or {}
                if not (sa or sb or fa or fb):
                    continue
                if not (sa and sb):
                    verdict, kind = ABSENT, "absent"
                elif _inputs_differ(a, b, case):
                    verdict, kind = "void: inputs differ", "void"
                else:
                    verdict, kind = ("same", "eq") if sa == sb else ("CHANGED", "diff")
                ra = (a.per_case(impl, "repeatable", case) or {}).get(tensor)
                rb = (b.per_case(impl, "repeatable", case) or {}).get(tensor)
                bits.append(Row((impl, case, _dtypes(a, b, case), tensor, verdict,
                                 num(fa.get("max_abs")), num(fb.get("max_abs")),
                                 num(fa.get("max_abs_ulps")), num(fb.get("max_abs_ulps")),
                                 num(ra), num(rb)),
                                None, ("", "", "", "", kind, "", "", "", "", _yes(ra), _yes(rb))))
        for case in cases_of("timings"):
            ta = a.per_case(impl, "timings", case) or {}
            tb = b.per_case(impl, "timings", case) or {}
            fwd_a, fwd_b = ta.get("forward_ms"), tb.get("forward_ms")
            both_a, both_b = ta.get("forward_backward_ms"), tb.get("forward_backward_ms")
            times.append(Row((impl, case, _dtypes(a, b, case), ms(fwd_a), ms(fwd_b),
                              _ratio(fwd_a, fwd_b), ms(both_a), ms(both_b),
                              _ratio(both_a, both_b))))
    changed = sum(r.values[4] == "CHANGED" for r in bits)
    same = sum(r.values[4] == "same" for r in bits)
    return [
        head,
        Table("ab-bits", "Bits and accuracy", ("impl", "case", "dtype", "tensor", "bits A→B",
                                               "max_abs A", "max_abs B", "err ULP vs fp64 A",
                                               "err ULP vs fp64 B", "repeatable A",
                                               "repeatable B"),
              bits, note=f"Bits: {same} tensors the same, {changed} changed (sha256 of the "
                         "bits; void where the inputs differ). Accuracy against fp64 (`err ULP "
                         "vs fp64`: as in the accuracy table). Implementations and cases both "
                         "cells have" + (f" ({'; '.join(only)})." if only else "."),
              empty="No implementation has bits or accuracy figures in either cell.", level=3),
        Table("ab-time", "Time (median ms)", ("impl", "case", "dtype", "forward A", "forward B",
                                              "B/A", "fwd+bwd A", "fwd+bwd B", "B/A"), times,
              empty="No timings in either cell.", level=3),
    ]
