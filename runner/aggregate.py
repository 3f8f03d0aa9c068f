"""Readable reports as cells for the tables: labels, filter facets, selection, table model.

The tables (:mod:`runner.tables`, :mod:`runner.html`, :mod:`runner.summary`) never read a
report's JSON layout directly for these: a :class:`Cell` wraps one readable report (ours or
foreign) with its label and the facets the filters use (op, stack, mode, target, dtype, gpu),
:class:`Filters` selects cells and implementations, and every table is a :class:`Table` of
:class:`Row` values (display strings) that the Markdown and HTML renderers share.

A foreign report (the RL-Kernel reference layout) has no ``cell`` or ``problem``: its mode is
taken from ``environment.mode_environment`` when it names exactly one, its target is ``cuda``
when it names a GPU, and its stack and dtype are unknown (``None``), so a ``--stack`` or
``--dtype`` filter leaves it out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from runner.errors import SelectionError
from runner.report import LoadedReport
from runner.status import Status

__all__ = ["ABSENT", "FACETS", "STATUSES", "Cell", "Filters", "Row", "Table", "case_order",
           "cell_label", "cmp_kind", "find_cell", "format_cmp", "load_cells", "matches", "ms",
           "num", "status_kind", "text"]

ABSENT = "—"
"""Shown for a tensor or value the report does not have."""

FACETS = ("op", "stack", "mode", "target", "dtype", "gpu")
"""Cell attributes the filters select on (command line and HTML page)."""

STATUSES = tuple(s.value for s in Status if s is not Status.PARTIAL)
"""Cell statuses in the order the summaries count them (docs/report-format.md)."""

_BAD = {s.value for s in Status if s.failed}
_CASE_RE = re.compile(r"^([0-9]+)(-specials)?$")


def case_order(cases: Iterable[str]) -> list[str]:
    """Case ids once each, as the matrix orders them: plain N ascending, then specials.

    Example:
        >>> case_order(["257-specials", "4097", "1", "257", "1"])
        ['1', '257', '4097', '257-specials']
    """
    def key(case: str) -> tuple[int, int, str]:
        m = _CASE_RE.match(case)
        return (2, 0, case) if m is None else (int(bool(m.group(2))), int(m.group(1)), case)

    return sorted(dict.fromkeys(cases), key=key)


def text(value: Any) -> str:
    """A table value on one line (runs of whitespace become one space)."""
    return " ".join(str(value).split())


def num(value: Any) -> str:
    """``:g`` for numbers, ``"inf"`` as is, :data:`ABSENT` for None/missing.

    Example:
        >>> num(0.0078125), num(None), num("inf")
        ('0.0078125', '—', 'inf')
    """
    if value is None:
        return ABSENT
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return text(value)


def ms(value: Any) -> str:
    """A time in milliseconds to 4 significant digits, :data:`ABSENT` when not a number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f"{value:.4g}" if ok else ABSENT


def format_cmp(cmp: Mapping[str, Any] | None) -> str:
    """One CMP (docs/report-format.md) as a table value.

    Example:
        >>> format_cmp({"equal": False, "differ": 46978, "numel": 48384, "max_abs": 32.0})
        '46978/48384 (32, -)'
    """
    if cmp is None:
        return ABSENT
    if cmp.get("equal"):
        return "equal"
    ulp = cmp.get("max_ulp")
    parts = [num(cmp.get("max_abs")), "-" if ulp is None else str(ulp)]
    if cmp.get("nan_differ"):
        parts.append(f"nan {cmp['nan_differ']}")
    return f"{cmp.get('differ')}/{cmp.get('numel')} ({', '.join(parts)})"


def cmp_kind(cmp: Mapping[str, Any] | None) -> str:
    """The colour class of a CMP: ``eq``, ``diff`` or ``absent``."""
    if cmp is None:
        return "absent"
    return "eq" if cmp.get("equal") else "diff"


def status_kind(status: str) -> str:
    """The colour class of a cell or implementation status."""
    if status == "ok":
        return "ok"
    if status in _BAD:
        return "bad"
    if status == "mismatch":
        return "warn"
    return "skip" if status in ("skipped", "unavailable") else ""


_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:()+/@,=-]")


def cell_label(report: LoadedReport) -> str:
    """Our cell id, or ``reference:<file stem> (<gpu>)`` for a foreign report.

    The label is shown in notes and code spans as well as in table cells, so any character
    outside letters, digits, space and ``._:()+/@,=-`` (a file name or GPU string may hold
    backticks, ``<``, newlines) becomes ``?``.
    """
    data = report.data or {}
    if report.origin == "ours":
        label = str(data["cell"]["id"])
    else:
        gpu = (data.get("environment") or {}).get("gpu") or "unknown GPU"
        label = f"reference:{report.path.stem} ({gpu})"
    return _LABEL_UNSAFE.sub("?", text(label))


@dataclass(frozen=True)
class Cell:
    """One readable report as the tables see it.

    ``index`` is the cell's position in the list the tables were built from (the HTML page
    filters rows by it); facets are ``None`` where the report does not say.
    """

    index: int
    report: LoadedReport
    label: str
    op: str | None
    stack: str | None
    mode: str | None
    target: str | None
    dtype: str | None
    gpu: str | None

    @property
    def data(self) -> dict[str, Any]:
        return self.report.data or {}

    @property
    def origin(self) -> str:
        return str(self.report.origin)

    @property
    def ours(self) -> bool:
        return self.report.origin == "ours"

    @property
    def status(self) -> str:
        """The cell status; :data:`ABSENT` for a foreign report (it has none)."""
        return str(self.data.get("status") or ABSENT)

    @property
    def reason(self) -> str | None:
        return self.data.get("reason")

    @property
    def results(self) -> dict[str, Any]:
        return self.data.get("results") or {}

    @property
    def environment(self) -> dict[str, Any]:
        return self.data.get("environment") or {}

    @cached_property
    def cases(self) -> tuple[str, ...]:
        """The report's case ids as strings, in its order (computed once: a report may list
        20,000 cases and the tables ask for them per implementation and pair)."""
        return tuple(str(c) for c in self.data.get("cases", []))

    @cached_property
    def case_set(self) -> frozenset[str]:
        """:attr:`cases` as a set, for membership tests."""
        return frozenset(self.cases)

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Facts the tables derive from this report once per cell and reuse (a case's
        dtypes: :func:`runner.table_cases.case_dtypes`); empty at first."""
        return {}

    def in_order(self, keys: Iterable[str]) -> list[str]:
        """``keys`` (case ids of some per-case map) in the report's case order, then those
        it does not list in their own order; linear in the cases and keys.

        Example:
            >>> cell.in_order(["4097", "9", "1"])   # cases [1, 257, 4097]
            ['1', '4097', '9']
        """
        keys = list(dict.fromkeys(keys))
        present = set(keys)
        listed = self.case_set
        return [c for c in self.cases if c in present] + [k for k in keys if k not in listed]

    @property
    def problem_key(self) -> tuple[Any, ...] | None:
        """(op, dtype, sizes, index dtype, seed): cells with the same key ran the same
        problem."""
        p = self.data.get("problem")
        if not p:
            return None
        sizes = tuple((k, v) for k, v in p.items() if k not in ("dtype", "index_dtype", "seed"))
        return (self.op, p["dtype"], sizes, p["index_dtype"], p["seed"])

    def per_case(self, impl: str, key: str, case: str) -> Any:
        """``results[impl][key][case]`` (e.g. ``key="sha256"``), None where absent."""
        return ((self.results.get(impl) or {}).get(key) or {}).get(case)

    def facet(self, name: str) -> str:
        """A facet's value for display and filtering, :data:`ABSENT` when unknown."""
        value = getattr(self, name)
        return ABSENT if value is None else str(value)


def _cell(index: int, report: LoadedReport) -> Cell:
    data = report.data or {}
    env = data.get("environment") or {}
    gpu = env.get("gpu") or None
    if report.origin == "ours":
        cell, problem = data["cell"], data.get("problem") or {}
        stack, mode, target = cell["stack"], cell["mode"], cell["target"]
        dtype = problem.get("dtype")
    else:
        modes = list(env.get("mode_environment") or {})
        stack, dtype = None, None
        mode = modes[0] if len(modes) == 1 else None
        target = "cuda" if gpu else None
    return Cell(index, report, cell_label(report), data.get("op"), stack, mode, target, dtype,
                gpu)


def load_cells(reports: Iterable[LoadedReport]) -> list[Cell]:
    """The readable reports as cells: ours first, then foreign ones, each in the given order.

    Example:
        >>> [c.label for c in load_cells(read_reports(Path("reports")))]
        ['host-plain-cuda', 'reference:gate_residual_b200 (NVIDIA B200)']
    """
    readable = [r for r in reports if r.ok]
    ordered = [r for r in readable if r.origin == "ours"]
    ordered += [r for r in readable if r.origin != "ours"]
    return [_cell(i, r) for i, r in enumerate(ordered)]


def _quote(name: str) -> str:
    return '"' + name.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


def _fold(value: str) -> str:
    return " ".join(value.casefold().split())


def matches(wanted: str, value: str, present: Sequence[str] = ()) -> bool:
    """Whether a filter value as typed selects ``value``: equal ignoring case and runs of
    spaces, else a part of it, unless some value in ``present`` equals it whole (then only
    that one): ``--gpu H200`` selects "NVIDIA H200", ``--stack vllm`` every stack with
    "vllm" in its name, ``--mode plain`` mode "plain" and not "plain_tf32".

    Example:
        >>> matches("h200", "NVIDIA H200"), matches("plain", "plain_tf32", ["plain"])
        (True, False)
    """
    w, v = _fold(wanted), _fold(value)
    if not w:
        return False
    if w == v:
        return True
    return w in v and not any(_fold(p) == w for p in present)


@dataclass(frozen=True)
class Filters:
    """What to show: each facet's allowed values (empty: all), and implementations.

    Values of one facet are alternatives (``--stack a --stack b``); facets combine with
    "and". The implementation filter keeps rows about a selected implementation (a pair when
    either side is selected); it never hides a cell from the cell and environment tables.

    Example:
        >>> Filters(stack=("host",)).describe()
        '--stack host'
    """

    op: tuple[str, ...] = ()
    stack: tuple[str, ...] = ()
    mode: tuple[str, ...] = ()
    target: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    impl: tuple[str, ...] = ()

    @classmethod
    def from_lists(cls, **values: Sequence[str] | None) -> Filters:
        """From argparse's ``action="append"`` lists (``None`` for an unused option)."""
        return cls(**{k: tuple(v or ()) for k, v in values.items()})

    @property
    def active(self) -> bool:
        return any(getattr(self, f) for f in (*FACETS, "impl"))

    def describe(self) -> str:
        """The filters as command-line options, ``""`` when none is set."""
        return " ".join(f"--{f} {v}" for f in (*FACETS, "impl") for v in getattr(self, f))

    def resolve(self, cells: Sequence[Cell]) -> Filters:
        """These filters with each value as typed replaced by the values of ``cells`` it
        selects (:func:`matches`: ``--gpu H200`` becomes ``--gpu "NVIDIA H200"``).

        Raises:
            SelectionError: a value that selects nothing, naming the values present, e.g.
                ``--stack: no report has stack "hots"; choose from host``.
        """
        found = {}
        for facet in FACETS:
            present = list(dict.fromkeys(c.facet(facet) for c in cells
                                         if getattr(c, facet) is not None))
            found[facet] = self._resolve(facet, getattr(self, facet), present)
        impls = list(dict.fromkeys(i for c in cells for i in c.results))
        return replace(self, **found, impl=self._resolve("impl", self.impl, impls))

    def check(self, cells: Sequence[Cell]) -> None:
        """Raise :class:`SelectionError` where :meth:`resolve` would."""
        self.resolve(cells)

    @staticmethod
    def _resolve(name: str, wanted: tuple[str, ...], present: list[str]) -> tuple[str, ...]:
        out: list[str] = []
        for value in wanted:
            hits = [p for p in present if matches(value, p, present)]
            if not hits:
                raise SelectionError(f"--{name}: no report has {name} {_quote(value)}; "
                                     f"choose from {', '.join(present) or 'nothing'}")
            out += [h for h in hits if h not in out]
        return tuple(out)

    def keeps(self, cell: Cell) -> bool:
        """Whether ``cell`` passes every facet filter (values as :meth:`resolve` gives them)."""
        return all(not getattr(self, f) or cell.facet(f) in getattr(self, f) for f in FACETS)

    def keeps_impl(self, *impls: str) -> bool:
        """Whether a row about ``impls`` (one, or the two sides of a pair) is shown."""
        return not self.impl or any(i in self.impl for i in impls)

    def select(self, cells: Sequence[Cell]) -> list[Cell]:
        """The cells that pass, re-indexed from 0 in their order."""
        kept = [c for c in cells if self.keeps(c)]
        return [replace(c, index=i) for i, c in enumerate(kept)]


def find_cell(cells: Sequence[Cell], name: str) -> Cell:
    """The cell named by its label, cell id, report file name or stem, or report path.

    Raises:
        SelectionError: no cell has that name (the message lists the labels).
    """
    for cell in cells:
        path = cell.report.path
        if name in (cell.label, path.name, path.stem, str(path), path.as_posix()):
            return cell
    raise SelectionError(f"--ab: no report is named {_quote(name)}; choose from "
                         + (", ".join(c.label for c in cells) or "nothing"))


@dataclass(frozen=True)
class Row:
    """One table row: display strings, the cell it belongs to (for the HTML filters; None
    for a row about several cells) and an optional colour class per value."""

    values: tuple[str, ...]
    cell: int | None = None
    kinds: tuple[str, ...] = ()


@dataclass
class Table:
    """A titled table shared by the Markdown and HTML renderers.

    ``note`` is a paragraph above the table and ``footer`` one below (plain text with
    ``code`` spans in backticks); ``empty`` replaces the table when there are no rows.
    """

    key: str
    title: str
    headers: tuple[str, ...]
    rows: list[Row] = field(default_factory=list)
    note: str = ""
    empty: str = "Nothing to show."
    footer: str = ""
    level: int = 2
