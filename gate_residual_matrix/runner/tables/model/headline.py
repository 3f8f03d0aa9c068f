"""The headline: can I swap X for Y on GPU Z with version V? One mark per pair and column.

Rows are implementation pairs (each candidate vs the baseline it was compared with, per op);
columns are GPU × stack (with its library versions) × mode. A mark sums up every case of the
cells in that column (usually one):

* ``✓``: every tensor of every case has the same bits on both sides;
* ``✗ gate 97% NR``: the tensors that differ in at least one case (``out``, ``res``, ``y``,
  ``gate``), the largest fraction of differing elements over those cases and tensors, and
  whether both sides repeated their own bits in every repeat within their process, in the
  cases that differ (``R``), one side did not in some (``NR``), or the report has no repeats
  (no letter);
* ``n/a: unavailable`` where the candidate did not run there, ``—`` where the column has no
  such pair.

A mark whose own reports were not made at the current project commit, or were made from a
dirty tree, is marked stale (:func:`staleness`, :meth:`Headline.stale`), never a whole column.
Cells without any comparison (skipped, failed before a case ran, every implementation
unavailable) get no column: :func:`not_run` collapses them to one line per status and reason.

When the columns are too many for one page the table can merge them (:data:`LEVELS`): modes
first (GPU × stack), then stacks (GPU alone); the merged mark is the worst of its cells.
Sources: ``results[impl]["vs <other>"][case]`` (:func:`runner.tables.model.bits.pair_results`),
``results[impl].repeatable``, ``environment.{gpu,torch,libraries,project}``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gate_residual_matrix import ops
from gate_residual_matrix.runner.reports import tensors as report_tensors
from gate_residual_matrix.runner.tables.model.bits import pair_results
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.values import ABSENT, text

__all__ = ["KERNEL_ONLY", "LEGEND", "LEVELS", "Column", "Headline", "Mark", "cached_headline",
           "cell_marks", "choose_level", "gpu_label", "headline", "name_list", "not_run", "percent",
           "stack_label", "staleness"]

LEVELS = ("GPU × stack × mode", "GPU × stack", "GPU")
"""How far columns are merged: level 0 keeps every mode apart, 2 merges stacks too."""
LIBRARY_KEYS = ("vllm", "vllm-omni", "sglang", "sgl-kernel", "sglang-kernel", "diffusers",
                "RL-Kernel")
"""Libraries named beside torch in a stack's label when the report says they are installed."""
KERNEL_ONLY = "ᴷ"
"""Appended to a mark where one side is a library row that ran kernel-only: the library's
kernel modules loaded from its released wheel under this host's torch and triton, not a
full-stack install (``environment.kernel_only[impl].mode``)."""
LEGEND = (
    "Each mark sums up every case of the column's cells: `✓` every tensor has the same bits "
    "in every case; `✗` the tensors that differ in at least one case (`out`, {legend}), "
    "the largest fraction of their "
    "elements that differ, then `R` when both sides gave the same bits in every repeat "
    "within their process in the cases that differ, `NR` when one side did not (no letter: "
    "no repeats recorded); `NaN out` those tensors differ in NaN payloads only (`≈` when "
    "nothing else does); `n/a: unavailable` the candidate did not run there; `—` no such "
    "pair there; `ᴷ` a library row that ran kernel-only (its kernel modules loaded from the "
    "released wheel, under this host's torch and triton: not a full-stack install; the "
    "kernel-only table of the cell's page has the record). "
    "⚠ follows a mark whose own reports (not its column's others) were not made at the "
    "current commit (`at <commit>`) or were made from a dirty tree. A mark links to the cell's "
    "page.")
"""How to read a mark; ``{legend}`` takes the shown reports' tensor names
(:func:`runner.reports.tensors.legend`)."""
_BASELINES = ("eager", "diffusers")  # a foreign report's baseline, by name
_MAX_NAMES = 30
_STACK_SUFFIX = re.compile(r"\+.*$")


def staleness(cell: CellReport, head: str | None) -> str:
    """Why a report may not describe the current code: ``""`` when it was made at ``head``
    from a clean tree; else ``"dirty 14d9ef6"``, ``"at 3c518f2"``, ``"no commit"``.
    A foreign report's commit is another project's: only its dirty flag counts."""
    project = cell.environment.get("project") or {}
    commit = project.get("commit")
    dirty = bool(project.get("dirty")) or (not cell.ours and bool(cell.data.get(
        "tracked_tree_dirty")))
    short = str(commit)[:7] if commit else ""
    if not cell.ours:
        return "dirty" if dirty else ""
    if dirty:
        return f"dirty {short}".strip()
    if not commit:
        return "no commit"
    if head and not (head.startswith(str(commit)) or str(commit).startswith(head)):
        return f"at {short}"
    return ""


def gpu_label(cell: CellReport) -> str:
    """The cell's GPU as a column shows it: ``CPU`` for the cpu target."""
    if cell.target == "cpu":
        return "CPU"
    return cell.gpu or ABSENT


def stack_label(cell: CellReport) -> str:
    """``host (torch 2.11.0)``, ``torch2.14-vllm0.33 (torch 2.14.0, vllm 0.33.0)``."""
    env = cell.environment
    libs = env.get("libraries") or {}
    torch = libs.get("torch") or _STACK_SUFFIX.sub("", str(env.get("torch") or "")) or None
    versions = [f"torch {torch}"] if torch else []
    versions += [f"{k} {libs[k]}" for k in LIBRARY_KEYS if libs.get(k)]
    name = cell.stack if cell.stack else cell.label.split(" (")[0]
    return text(f"{name} ({', '.join(versions)})" if versions else name)


@dataclass
class Mark:
    """One pair in one column: differing tensors, worst fraction, repeatability, cells."""

    compared: int = 0
    differ: dict[str, float] = field(default_factory=dict)  # tensor -> worst fraction
    payload: set[str] = field(default_factory=set)  # tensors differing in NaN payloads only
    repeats_known: bool = False
    not_repeatable: set[str] = field(default_factory=set)
    missing: str = ""  # why the candidate has no comparison here (its status)
    order: tuple[str, ...] = ()  # the op's tensor keys in display order
    kernel_only: bool = False  # a side ran kernel-only (runner/tables/model/kernel_only.py)
    cells: set[int] = field(default_factory=set)  # indexes of the cells it sums up

    @property
    def only_cell(self) -> int | None:
        """The index of the one cell this mark sums up (its page is the mark's link), or
        None when it sums up several (a merged column) or none."""
        return next(iter(self.cells)) if len(self.cells) == 1 else None

    def _ordered(self, keys: set[str] | dict[str, float]) -> list[str]:
        """``keys`` in the op's tensor order (any others after, sorted)."""
        return ([t for t in self.order if t in keys]
                + sorted(t for t in keys if t not in self.order))

    def add(self, other: Mark) -> None:
        """Merge ``other`` (another cell of a merged column) into this mark: the worst."""
        self.compared += other.compared
        for t, f in other.differ.items():
            self.differ[t] = max(self.differ.get(t, 0.0), f)
        self.payload |= other.payload
        self.repeats_known |= other.repeats_known
        self.not_repeatable |= other.not_repeatable
        self.missing = self.missing or other.missing
        self.kernel_only |= other.kernel_only
        self.cells |= other.cells
        self.order = tuple(dict.fromkeys((*self.order, *other.order)))

    @property
    def equal(self) -> bool:
        return self.compared > 0 and not self.differ and not self.nan_only

    @property
    def nan_only(self) -> list[str]:
        """Tensors whose only differences, in every case, are NaN payloads."""
        return [t for t in self._ordered(self.payload) if t not in self.differ]

    def kind(self) -> str:
        """``eq``, ``diff``, ``nan`` (NaN payloads only) or ``absent`` (the colour class)."""
        if not self.compared:
            return "absent"
        return "eq" if self.equal else ("nan" if not self.differ else "diff")

    def differing(self) -> list[str]:
        """The tensors that differ (beyond NaN payloads), in the op's order."""
        return self._ordered(self.differ)

    def worst(self) -> float:
        return max(self.differ.values(), default=0.0)

    def label(self) -> str:
        """``✓``, ``✗ gate 97% NR``, ``✗ gate 73% R; NaN out,y``, ``≈ NaN out``,
        ``n/a: unavailable``, ``—``; :data:`KERNEL_ONLY` appended where a side ran
        kernel-only (``✗ out 0.3% R ᴷ``)."""
        if not self.compared:
            return f"n/a: {self.missing}" if self.missing else ABSENT
        return self._verdict() + (f" {KERNEL_ONLY}" if self.kernel_only else "")

    def _verdict(self) -> str:
        if self.equal:
            return "✓"
        nan = f"NaN {','.join(self.nan_only)}" if self.nan_only else ""
        if not self.differ:
            return f"≈ {nan}"
        tensors = ",".join(self._ordered(self.differ))
        rep = ("NR" if self.not_repeatable else "R") if self.repeats_known else ""
        main = " ".join(x for x in ("✗", tensors, percent(self.worst()), rep) if x)
        return f"{main}; {nan}" if nan else main


def percent(share: float) -> str:
    """``97%``, ``0.4%``, ``<0.1%``, ``100%`` (only when every element differs)."""
    if share >= 1:
        return "100%"
    if share < 0.001:
        return "<0.1%"
    return f"{min(share * 100, 99.9):.2g}%" if share < 0.1 else f"{min(share * 100, 99):.0f}%"


@dataclass
class Column:
    """One column: its GPU, stack and mode labels, the cells in it, how stale they are."""

    gpu: str
    stack: str
    mode: str
    cells: list[CellReport] = field(default_factory=list)

    def stale(self, head: str | None) -> list[str]:
        """The distinct staleness notes of its cells (empty: all current)."""
        return list(dict.fromkeys(s for c in self.cells if (s := staleness(c, head))))

    def status(self) -> str:
        """The cells' statuses other than ok (``partial``, ``mismatch``), for the header."""
        return ", ".join(dict.fromkeys(c.status for c in self.cells if c.ours
                                       and c.status not in ("ok", ABSENT)))


@dataclass
class Headline:
    """The headline table: ``pairs`` (rows), ``columns`` and ``marks[(pair, column)]``."""

    level: int
    pairs: list[str]
    columns: list[Column]
    marks: dict[tuple[str, int], Mark]
    head: str | None
    never: dict[str, str] = field(default_factory=dict)  # pairs compared nowhere -> statuses

    def stale(self, mark: Mark) -> list[str]:
        """The staleness notes of the reports ``mark`` sums up: per report, never those of
        other reports in its column (another op's, in a column ops share)."""
        cells = {c.index: c for col in self.columns for c in col.cells}
        return list(dict.fromkeys(s for i in sorted(mark.cells)
                                  if i in cells and (s := staleness(cells[i], self.head))))

    def gpus(self) -> list[str]:
        """The GPUs in column order."""
        return list(dict.fromkeys(c.gpu for c in self.columns))


def cell_marks(cell: CellReport, filters: Filters | None) -> dict[str, Mark]:
    """pair -> :class:`Mark` of one cell; pairs of ops other than the first are named with
    their op (``numba vs eager (rms_norm)``)."""
    marks: dict[str, Mark] = {}
    for r in pair_results(cell, filters):
        a, b = (r.b, r.a) if r.a in _BASELINES and not cell.data.get("baseline") else (r.a, r.b)
        # the first op's pairs unlabelled (its reports predate ops), every other op's named
        pair = f"{a} vs {b}" + (f" ({cell.op})" if cell.op not in (None, ops.OPS[0]) else "")
        mark = marks.setdefault(pair, Mark(order=tuple(report_tensors.labels(cell.data))))
        mark.compared += 1
        mark.cells.add(cell.index)
        mark.kernel_only |= any(_kernel_only(cell, side) for side in (r.a, r.b))
        for tensor, cmp in r.tensors.items():
            if not cmp or cmp.get("equal"):
                continue
            if cmp.get("nan_payload_differ") and cmp.get("nan_payload_differ") == cmp.get(
                    "differ"):
                mark.payload.add(tensor)
                continue
            numel = cmp.get("numel") or 0
            differ = cmp.get("differ")
            share = differ / numel if isinstance(differ, int) and numel else 1.0
            mark.differ[tensor] = max(mark.differ.get(tensor, 0.0), share)
            for side in (r.a, r.b):
                rep = (cell.per_case(side, "repeatable", r.case) or {}).get(tensor)
                if isinstance(rep, bool):
                    mark.repeats_known = True
                    if not rep:
                        mark.not_repeatable.add(side)
    baseline = cell.data.get("baseline")
    for impl, entry in cell.results.items():  # candidates that did not run here
        status = entry.get("status") if isinstance(entry, dict) else None
        if status not in (None, "ok") and impl != baseline and (
                filters is None or filters.keeps_impl(impl)):
            marks.setdefault(f"{impl} vs {baseline}", Mark(missing=str(status)))
    return marks


def _kernel_only(cell: CellReport, impl: str) -> bool:
    """Whether ``impl`` ran kernel-only in ``cell`` (its report's load record says so)."""
    records = (cell.data.get("environment") or {}).get("kernel_only") or {}
    record = records.get(impl) if isinstance(records, dict) else None
    return isinstance(record, dict) and record.get("mode") == "kernel-only"


def _key(cell: CellReport, level: int) -> tuple[str, str, str]:
    gpu, stack, mode = gpu_label(cell), stack_label(cell), cell.facet("mode")
    if level >= 1:
        mode = "all modes"
    if level >= 2:
        stack = "all stacks"
    return gpu, stack, mode


def headline(cells: Sequence[CellReport], filters: Filters | None = None, head: str | None = None,
             level: int = 0) -> Headline:
    """The headline over the cells that have comparisons, columns merged to ``level``
    (:data:`LEVELS`). Columns are ordered GPUs first (CPU last), then stack, then mode;
    rows in the order the pairs first appear.

    Example:
        >>> h = headline(load_cells(read_reports(Path("reports"))))
        >>> h.marks[("numba vs eager", 0)].label()
        '✗ gate 97% NR'
    """
    by_cell = {c.index: cell_marks(c, filters) for c in cells}
    columns: dict[tuple[str, str, str], Column] = {}
    for cell in cells:
        if not any(m.compared for m in by_cell[cell.index].values()):
            continue
        key = _key(cell, level)
        columns.setdefault(key, Column(*key)).cells.append(cell)
    ordered = sorted(columns.values(), key=lambda c: (c.gpu in ("CPU", ABSENT), c.gpu,
                                                      c.stack, c.mode))
    pairs: list[str] = []
    marks: dict[tuple[str, int], Mark] = {}
    for n, column in enumerate(ordered):
        for cell in column.cells:
            for pair, mark in by_cell[cell.index].items():
                if pair not in pairs:
                    pairs.append(pair)
                marks.setdefault((pair, n), Mark()).add(mark)
    compared = [p for p in pairs if any(marks[(p, n)].compared for n in range(len(ordered))
                                        if (p, n) in marks)]
    never = {p: ", ".join(dict.fromkeys(marks[(p, n)].missing for n in range(len(ordered))
                                        if (p, n) in marks))
             for p in pairs if p not in compared}
    return Headline(level, compared, ordered, marks, head, never)


def choose_level(cells: Sequence[CellReport], tables: Tables, budget: int) -> Headline:
    """The headline with the fewest merges whose marks (pairs × columns) fit ``budget``
    (each output has its own: README.md's is smaller than index.html's)."""
    for level in range(len(LEVELS)):
        h = cached_headline(cells, tables, level)
        if len(h.pairs) * len(h.columns) <= budget or level == len(LEVELS) - 1:
            return h
    raise AssertionError("unreachable")


def cached_headline(cells: Sequence[CellReport], tables: Tables, level: int) -> Headline:
    """:func:`headline` of ``tables`` at ``level``, computed once per built tables."""
    key = ("headline", level, len(cells))
    if key not in tables.cache:
        tables.cache[key] = headline(cells, tables.filters, tables.head, level)
    return tables.cache[key]


def not_run(cells: Sequence[CellReport]) -> list[tuple[str, str, list[CellReport]]]:
    """Cells without any comparison, one entry per (status, reason): the reason with each
    cell's own stack name replaced by ``<stack>``, so "no image for stack X" collapses.

    Example:
        >>> not_run(cells)[0][:2]
        ('skipped', 'no Docker engine answers')
    """
    groups: dict[tuple[str, str], list[CellReport]] = {}
    for cell in cells:
        if any(r for r in pair_results(cell)):
            continue
        reason = text(cell.reason or "no comparisons in the report")
        if cell.stack:
            reason = reason.replace(cell.stack, "<stack>")
        groups.setdefault((cell.status, reason), []).append(cell)
    return [(status, reason, members) for (status, reason), members in groups.items()]


def name_list(cells: Sequence[CellReport], limit: int = _MAX_NAMES) -> str:
    """``a, b, c`` of the cells' labels, cut after ``limit`` with ``and 12 more``."""
    names = [c.label for c in cells[:limit]]
    more = len(cells) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")
