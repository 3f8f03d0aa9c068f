"""Per-case facts the tables share: case order, a case's dtypes, its id without them, its rows
per index value, bytes per element.

A case of one cell may run in its own storage and index dtypes (matrix.yaml ``cases[i].dtype``,
``index_dtype``; report ``inputs[case].dtype``, ``index_dtype``). The tables read a case's
dtypes from its inputs, else from its id (``257-float16-int32``), else from the report's
``problem`` (reports written before cases had their own dtypes); a foreign report has none.

The ``--dtype`` filter (docs/tables.md) selects cases, not cells: :class:`CaseFilter` keeps a
cell when one of its cases has a selected dtype, and the tables keep only those cases' rows.

Example::

    >>> base_case("257-specials-float16-int32"), base_case("4097")
    ('257-specials', '4097')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from gate_residual_matrix.runner.errors import SelectionError
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.values import ABSENT

__all__ = ["DTYPE_NAMES", "ITEMSIZE", "CaseFilter", "Problem", "base_case", "case_dtypes",
           "case_order", "case_problem", "cell_dtypes", "dtype_label", "index_rows",
           "short_dtype"]

CASE_RE = re.compile(r"^(?P<base>[0-9]+(?:-specials)?(?:-grouped)?)"
                     r"(?:-(?P<dtype>bfloat16|float16|float32)-(?P<index>int64|int32))?$")
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DTYPE_NAMES = tuple(_SHORT)
"""The storage dtypes a case may have."""
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of each storage dtype."""
_ORDER_RE = re.compile(r"^([0-9]+)(-specials)?(-grouped)?$")


def case_order(cases: Iterable[str]) -> list[str]:
    """Case ids once each, as the matrix orders them: plain N ascending, then grouped, then
    specials.

    Example:
        >>> case_order(["257-specials", "4097", "1", "257", "1"])
        ['1', '257', '4097', '257-specials']
    """
    def key(case: str) -> tuple[int, int, str]:
        m = _ORDER_RE.match(case)
        if m is None:
            return (3, 0, case)
        return (2 if m.group(2) else int(bool(m.group(3))), int(m.group(1)), case)

    return sorted(dict.fromkeys(cases), key=key)


def base_case(case: str) -> str:
    """The case id without its dtypes: ``"257-float16-int32"`` -> ``"257"``."""
    m = CASE_RE.match(case)
    return m.group("base") if m else case


def case_dtypes(cell: CellReport, case: str) -> tuple[str | None, str | None]:
    """(storage dtype, index dtype) of ``case`` in ``cell``; None where the report does not
    say (a foreign report). Computed once per cell and case (``cell.memo``): every table
    asks, per implementation and tensor."""
    key = ("case_dtypes", case)
    found = cell.memo.get(key)
    if found is None:
        found = cell.memo[key] = _case_dtypes(cell, case)
    return found


def _case_dtypes(cell: CellReport, case: str) -> tuple[str | None, str | None]:
    given = (cell.data.get("inputs") or {}).get(case) or {}
    m = CASE_RE.match(case)
    problem = cell.data.get("problem") or {}
    named = (m.group("dtype"), m.group("index")) if m else (None, None)
    return (given.get("dtype") or named[0] or problem.get("dtype"),
            given.get("index_dtype") or named[1] or problem.get("index_dtype"))


PROBLEM_KEYS = ("dtype", "index_dtype", "seed")
"""The keys of a report's ``problem`` besides its op's sizes."""


def problem_sizes(problem: dict) -> tuple[tuple[str, object], ...]:
    """The op's sizes of a report's ``problem``, in its order (``(("D", 5376), ("G", 9))``)."""
    return tuple((k, v) for k, v in problem.items() if k not in PROBLEM_KEYS)


class Problem(NamedTuple):
    """What a case ran: cases with the same problem, in any cells, ran the same computation
    (with the same base id, the same inputs)."""

    op: str | None
    dtype: str | None
    sizes: tuple[tuple[str, object], ...]  # the op's sizes, in the report's order
    index_dtype: str | None
    seed: object


def case_problem(cell: CellReport, case: str) -> Problem | None:
    """The :class:`Problem` of ``case`` (its own dtypes); None for a report without
    ``problem`` (a foreign one)."""
    p = cell.data.get("problem")
    if not p:
        return None
    dtype, index_dtype = case_dtypes(cell, case)
    return Problem(cell.op, dtype, problem_sizes(p), index_dtype, p["seed"])


def short_dtype(dtype: str | None) -> str:
    """``bf16``, ``fp16``, ``fp32`` (other names as they are; :data:`ABSENT` for None)."""
    return ABSENT if dtype is None else _SHORT.get(dtype, dtype)


def dtype_label(cell: CellReport, case: str) -> str:
    """``bfloat16/int64``: a case's dtypes as the tables show them."""
    dtype, index_dtype = case_dtypes(cell, case)
    if dtype is None:
        return ABSENT
    return f"{dtype}/{index_dtype}" if index_dtype else dtype


def cell_dtypes(cell: CellReport) -> list[str]:
    """The storage dtypes of a cell's cases, in first-seen order (the problem's when the
    report lists no case); empty for a foreign report."""
    found = [case_dtypes(cell, c)[0] for c in cell.cases]
    if not found:
        found = [(cell.data.get("problem") or {}).get("dtype")]
    return [d for d in dict.fromkeys(found) if d]


def index_rows(cell: CellReport, case: str) -> tuple[int, int] | None:
    """(min, max) rows per index value of ``case`` (``inputs[case].index_counts``), or None.

    A gradient with one row per index value (an AdaLN row's) sums ``index_counts[k]``
    products in its row k, so its error grows with the count.
    """
    counts = ((cell.data.get("inputs") or {}).get(case) or {}).get("index_counts")
    if not counts:
        return None
    return min(counts), max(counts)


@dataclass(frozen=True)
class CaseFilter:
    """The ``--dtype`` filter, applied to cases: ``dtypes`` empty keeps everything."""

    dtypes: tuple[str, ...] = ()

    @classmethod
    def of(cls, filters: Filters | None) -> CaseFilter:
        """The dtype part of ``filters``; the tables' short names (bf16, fp16, fp32) stand
        for the dtypes they show."""
        long = {short: name for name, short in _SHORT.items()}
        return cls(tuple(long.get(d, d) for d in filters.dtype) if filters else ())

    @staticmethod
    def cell_part(filters: Filters) -> Filters:
        """``filters`` without ``dtype``: what :class:`Filters` itself selects cells by (it
        knows only a cell's problem dtype)."""
        return replace(filters, dtype=())

    def check(self, cells: Sequence[CellReport]) -> None:
        """Raise :class:`SelectionError` for a dtype no case of any report has."""
        found = {d for c in cells for d in cell_dtypes(c)}
        present = [d for d in DTYPE_NAMES if d in found] + sorted(found - set(DTYPE_NAMES))
        for value in self.dtypes:
            if value not in present:
                shown = value.encode("unicode_escape").decode("ascii").replace('"', '\\"')
                raise SelectionError(f'--dtype: no report has dtype "{shown}"; choose from '
                                     + (", ".join(present) or "nothing"))

    def keeps(self, cell: CellReport, case: str) -> bool:
        """Whether rows about ``case`` of ``cell`` are shown."""
        return not self.dtypes or case_dtypes(cell, case)[0] in self.dtypes

    def keeps_cell(self, cell: CellReport) -> bool:
        """Whether ``cell`` has a shown case (a cell without cases: by its problem dtype)."""
        return not self.dtypes or any(d in self.dtypes for d in cell_dtypes(cell))

    def cases(self, cell: CellReport, cases: Iterable[str]) -> list[str]:
        """The shown ``cases`` of ``cell``, in their order."""
        return [c for c in cases if self.keeps(cell, c)]
