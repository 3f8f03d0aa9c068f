"""Per-case facts the tables share: a case's dtypes, its id without them, its gate rows.

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

from runner.aggregate import ABSENT, Cell, Filters
from runner.errors import SelectionError

__all__ = ["DTYPE_NAMES", "CaseFilter", "base_case", "case_dtypes", "case_problem", "cell_dtypes",
           "dtype_label", "index_rows", "short_dtype"]

CASE_RE = re.compile(r"^(?P<base>[0-9]+(?:-specials)?)"
                     r"(?:-(?P<dtype>bfloat16|float16|float32)-(?P<index>int64|int32))?$")
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DTYPE_NAMES = tuple(_SHORT)
"""The storage dtypes a case may have."""


def base_case(case: str) -> str:
    """The case id without its dtypes: ``"257-float16-int32"`` -> ``"257"``."""
    m = CASE_RE.match(case)
    return m.group("base") if m else case


def case_dtypes(cell: Cell, case: str) -> tuple[str | None, str | None]:
    """(storage dtype, index dtype) of ``case`` in ``cell``; None where the report does not
    say (a foreign report). Computed once per cell and case (``cell.memo``): every table
    asks, per implementation and tensor."""
    key = ("case_dtypes", case)
    found = cell.memo.get(key)
    if found is None:
        found = cell.memo[key] = _case_dtypes(cell, case)
    return found


def _case_dtypes(cell: Cell, case: str) -> tuple[str | None, str | None]:
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


def case_problem(cell: Cell, case: str) -> tuple[object, ...] | None:
    """(op, dtype, sizes, index dtype, seed) of ``case``: cases with the same key, in any
    cells, ran the same problem (with the same base id, the same inputs)."""
    p = cell.data.get("problem")
    if not p:
        return None
    dtype, index_dtype = case_dtypes(cell, case)
    return (cell.op, dtype, problem_sizes(p), index_dtype, p["seed"])


def short_dtype(dtype: str | None) -> str:
    """``bf16``, ``fp16``, ``fp32`` (other names as they are; :data:`ABSENT` for None)."""
    return ABSENT if dtype is None else _SHORT.get(dtype, dtype)


def dtype_label(cell: Cell, case: str) -> str:
    """``bfloat16/int64``: a case's dtypes as the tables show them."""
    dtype, index_dtype = case_dtypes(cell, case)
    if dtype is None:
        return ABSENT
    return f"{dtype}/{index_dtype}" if index_dtype else dtype


def cell_dtypes(cell: Cell) -> list[str]:
    """The storage dtypes of a cell's cases, in first-seen order (the problem's when the
    report lists no case); empty for a foreign report."""
    found = [case_dtypes(cell, c)[0] for c in cell.cases]
    if not found:
        found = [(cell.data.get("problem") or {}).get("dtype")]
    return [d for d in dict.fromkeys(found) if d]


def index_rows(cell: Cell, case: str) -> tuple[int, int] | None:
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

    def check(self, cells: Sequence[Cell]) -> None:
        """Raise :class:`SelectionError` for a dtype no case of any report has."""
        found = {d for c in cells for d in cell_dtypes(c)}
        present = [d for d in DTYPE_NAMES if d in found] + sorted(found - set(DTYPE_NAMES))
        for value in self.dtypes:
            if value not in present:
                shown = value.encode("unicode_escape").decode("ascii").replace('"', '\\"')
                raise SelectionError(f'--dtype: no report has dtype "{shown}"; choose from '
                                     + (", ".join(present) or "nothing"))

    def keeps(self, cell: Cell, case: str) -> bool:
        """Whether rows about ``case`` of ``cell`` are shown."""
        return not self.dtypes or case_dtypes(cell, case)[0] in self.dtypes

    def keeps_cell(self, cell: Cell) -> bool:
        """Whether ``cell`` has a shown case (a cell without cases: by its problem dtype)."""
        return not self.dtypes or any(d in self.dtypes for d in cell_dtypes(cell))

    def cases(self, cell: Cell, cases: Iterable[str]) -> list[str]:
        """The shown ``cases`` of ``cell``, in their order."""
        return [c for c in cases if self.keeps(cell, c)]
