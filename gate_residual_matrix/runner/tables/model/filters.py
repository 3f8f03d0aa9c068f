"""What the tables show: :class:`Filters` over cells and implementations, and ``--ab`` names.

A filter value is matched as people type it (:func:`matches`): ``--gpu H200`` selects "NVIDIA
H200". Values of one facet are alternatives, facets combine with "and"; a value that selects
nothing is a :class:`~runner.errors.SelectionError` naming the values present. The ``--dtype``
facet selects cases, not cells (:class:`runner.tables.model.cases.CaseFilter`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gate_residual_matrix.runner.errors import SelectionError
from gate_residual_matrix.runner.tables.model.cells import CellReport

__all__ = ["FACETS", "Filters", "find_cell", "matches"]

FACETS = ("op", "stack", "mode", "target", "dtype", "gpu")
"""Cell attributes the filters select on (command line and HTML page)."""


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
        """Whether any filter is set."""
        return any(getattr(self, f) for f in (*FACETS, "impl"))

    def describe(self) -> str:
        """The filters as command-line options, ``""`` when none is set."""
        return " ".join(f"--{f} {v}" for f in (*FACETS, "impl") for v in getattr(self, f))

    def resolve(self, cells: Sequence[CellReport]) -> Filters:
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

    def keeps(self, cell: CellReport) -> bool:
        """Whether ``cell`` passes every facet filter (values as :meth:`resolve` gives them)."""
        return all(not getattr(self, f) or cell.facet(f) in getattr(self, f) for f in FACETS)

    def keeps_impl(self, *impls: str) -> bool:
        """Whether a row about ``impls`` (one, or the two sides of a pair) is shown."""
        return not self.impl or any(i in self.impl for i in impls)

    def select(self, cells: Sequence[CellReport]) -> list[CellReport]:
        """The cells that pass, re-indexed from 0 in their order."""
        kept = [c for c in cells if self.keeps(c)]
        return [replace(c, index=i) for i, c in enumerate(kept)]


def find_cell(cells: Sequence[CellReport], name: str) -> CellReport:
    """The cell named by its label, cell id, report file name or stem, or report path
    (``--ab``).

    Raises:
        SelectionError: no cell has that name (the message lists the labels).
    """
    for cell in cells:
        path = cell.report.path
        if name in (cell.label, path.name, path.stem, str(path), path.as_posix()):
            return cell
    raise SelectionError(f"--ab: no report is named {_quote(name)}; choose from "
                         + (", ".join(c.label for c in cells) or "nothing"))
