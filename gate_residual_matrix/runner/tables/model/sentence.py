"""One sentence per op that answers "can I swap A for B?" for the pairs people ask about.

The pairs: trainer against rollout (a comparison in which neither side is the report's
baseline: the matrix's ``pairs``), ours against the baseline (eager), and each library row
against the baseline. The sentence is about one GPU × stack, the op's first column of our
reports on a GPU (:func:`runner.tables.model.answers.op_grids` orders them), over every mode
it ran there; it names the modes it did not run that other reports ran on that GPU × stack,
and the pairs that did not run (``not run: ... (unavailable)``). Pairs are grouped: those
with the same bits in every case, then, per kernel (its variants together: names that differ
in the last word), other side and set of differing tensors, those that differ, with the
largest share of differing elements and each side's largest error against fp64 (which side is
closer to the truth); at most :data:`MAX_DIFFER` of those, ours first, the rest counted
with the pairs of no interest ("N more pairs in the grid"). Every figure is read from the
reports through
:mod:`runner.tables.model.answers`; nothing is assumed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from gate_residual_matrix.runner.tables.model.answers import (
    GridColumn,
    GridMark,
    OpGrid,
    Stats,
    base,
    names,
    op_grids,
    ulp,
)
from gate_residual_matrix.runner.tables.model.build import Tables
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.headline import (
    Mark,
    gpu_label,
    percent,
    stack_label,
)

__all__ = ["OURS", "op_answers", "op_sentence"]

OURS = ("numba",)
"""Our kernel's implementation name, in every op."""


@dataclass
class _Group:
    """Pairs that share one clause: candidates, the other side, their figures merged."""

    left: list[str] = field(default_factory=list)
    right: list[str] = field(default_factory=list)
    grid: GridMark = field(default_factory=lambda: GridMark(Mark(), Stats()))
    pairs: int = 0

    def add(self, a: str, b: str, grid: GridMark) -> None:
        self.pairs += 1
        self.left += [a] if a not in self.left else []
        self.right += [b] if b not in self.right else []
        self.grid.mark.add(grid.mark)
        self.grid.stats.add(grid.stats)


def _is_library(cell: CellReport, impl: str) -> bool:
    records = cell.environment.get("kernel_only") or {}
    base, _, version = impl.rpartition("-")
    return impl in records or bool(base and version[:1].isdigit())


def _of_interest(cells: Sequence[CellReport], a: str, b: str) -> bool:
    """Trainer vs rollout (neither side the baseline), ours or a library vs the baseline."""
    baselines = {c.data.get("baseline") or "eager" for c in cells}
    if b not in baselines and a not in baselines:
        return True
    other = a if b in baselines else b
    return other in OURS or any(_is_library(c, other) for c in cells)


def _scope(grid: OpGrid) -> list[int]:
    """The columns the sentence is about: the first GPU × stack of our reports on a GPU,
    else of ours, else the first."""
    order = sorted(range(len(grid.columns)), key=lambda n: (
        grid.columns[n].foreign, grid.columns[n].gpu == "CPU", n))
    first = grid.columns[order[0]]
    return [n for n, c in enumerate(grid.columns) if (c.gpu, c.stack) == (first.gpu, first.stack)]


MAX_DIFFER = 3
"""Clauses of pairs that differ a sentence names (ours first, then trainer against
rollout, then libraries against the baseline); the rest are counted, and in the grid."""


def _modes(columns: list[GridColumn], everything: Sequence[CellReport]) -> str:
    """``all 6 modes``, or the modes run of those other reports ran on this GPU × stack:
    ``plain, inference (2 of 6 modes)``."""
    run = [m for c in columns for m in c.modes]
    gpu, stack = columns[0].gpu, columns[0].stack
    known = dict.fromkeys(c.facet("mode") for c in everything
                          if (gpu_label(c), stack_label(c)) == (gpu, stack))
    missing = [m for m in known if m not in run]
    if not missing:
        return f"all {len(run)} modes" if len(run) > 1 else f"mode {run[0]}"
    return f"{', '.join(run)} ({len(run)} of {len(run) + len(missing)} modes)"


def _priority(key: tuple[str, str, tuple[str, ...]], g: _Group, baselines: set[str]) -> int:
    """0: ours on either side; 1: trainer against rollout (neither side the baseline);
    2: a library against the baseline."""
    if any(base(i)[0] in OURS for i in g.left + g.right):
        return 0
    return 1 if key[1] not in baselines else 2


def _differ_clause(g: _Group) -> str:
    mark, (ea, eb) = g.grid.mark, g.grid.errors()
    left, right = ", ".join(names(g.left)), ", ".join(names(g.right))
    tensors = ",".join(mark.differing())
    facts = [f"up to {percent(mark.worst())} of elements"]
    if ea is not None and eb is not None:
        closer = g.grid.closer()
        side = None if closer is None else [g.left, g.right][closer]
        bases = list(dict.fromkeys(base(i)[0] for i in side or []))
        who = "" if side is None else f", {bases[0] if len(bases) == 1 else 'left'} closer"
        facts.append(f"max error vs fp64 {ulp(ea)} | {ulp(eb)} ULP{who}")
    return f"{left} vs {right}: {tensors} differ ({'; '.join(facts)})"


def _checks(value) -> Iterator[bool]:
    """Every batch-invariance check's verdict in a report's ``batch_invariant`` value: a
    bool, a map of checks (``row_alone``, ``sub_batches``, ``size_sweep``: bools beside
    figures such as ``first_failing_size``), or either per case and/or per tensor."""
    if isinstance(value, bool):
        yield value
    elif isinstance(value, Mapping):
        for inner in value.values():
            yield from _checks(inner)


def _invariance(cells: Sequence[CellReport]) -> str | None:
    """``batch-invariant in every case checked: A, B; not batch-invariant: C`` over the
    implementations whose reports hold batch-invariance checks (the accuracy reference
    left out); None when no report holds one. A row is batch-invariant when every check
    of every case of every cell passed."""
    verdict: dict[str, bool] = {}
    for cell in cells:
        reference = cell.data.get("accuracy_reference")
        for impl, entry in (cell.data.get("results") or {}).items():
            if impl == reference or not isinstance(entry, Mapping):
                continue
            for ok in _checks(entry.get("batch_invariant")):
                verdict[impl] = verdict.get(impl, True) and ok
    yes = [i for i, ok in verdict.items() if ok]
    no = [i for i, ok in verdict.items() if not ok]
    parts = ([f"batch-invariant in every case checked: {', '.join(names(yes))}"] * bool(yes)
             + [f"not batch-invariant: {', '.join(names(no))}"] * bool(no))
    return "; ".join(parts) or None


def op_sentence(grid: OpGrid, everything: Sequence[CellReport]) -> str:
    """The answer for ``grid``'s op, e.g. ``rms_norm on NVIDIA H200, host (torch 2.11.0),
    plain, inference (2 of 6 modes): numba = vllm_x 0.30.0/0.33.0 bitwise in every case (52
    comparisons); ...``. ``everything``: every shown cell (to name the modes not run).

    Example:
        >>> op_sentence(op_grids(cells)[0], cells).split(":")[0]
        'gate_residual on NVIDIA H200, host (torch 2.11.0), all 6 modes'
    """
    if not grid.columns:
        return f"{grid.op}: not run."
    scope = _scope(grid)
    columns = [grid.columns[n] for n in scope]
    cells = [c for col in columns for c in col.cells]
    merged: dict[str, GridMark] = {}
    for n in scope:
        for pair in grid.pairs:
            if (pair, n) in grid.marks:
                m = merged.setdefault(pair, GridMark(Mark(), Stats()))
                m.mark.add(grid.marks[(pair, n)].mark)
                m.stats.add(grid.marks[(pair, n)].stats)
    equal: dict[str, _Group] = {}
    differ: dict[tuple[str, str, tuple[str, ...]], _Group] = {}
    missing = _Group()
    rest = 0
    for pair, m in merged.items():
        a, _, b = pair.partition(" vs ")
        if not _of_interest(cells, a, b):
            rest += 1
        elif not m.mark.compared:
            missing.add(a, m.mark.missing or "not run", m)
        elif not m.mark.differ:
            equal.setdefault(base(a)[0], _Group()).add(a, b, m)
        else:
            # variants of one kernel (Liger's casting modes) share a clause, kernels do not
            key = (base(a)[0].rpartition("_")[0] or a, base(b)[0], tuple(m.mark.differing()))
            differ.setdefault(key, _Group()).add(a, b, m)
    clauses = [f"{', '.join(names(g.left))} = {', '.join(names(g.right))} bitwise"
               + (" but NaN payloads" if g.grid.mark.nan_only else "")
               + f" in every case ({g.grid.mark.compared} case comparisons)"
               for g in equal.values()]
    invariance = _invariance(cells)
    clauses += [invariance] if invariance else []
    baselines = {c.data.get("baseline") or "eager" for c in cells}
    ranked = sorted(differ.items(), key=lambda kv: _priority(kv[0], kv[1], baselines))
    clauses += [_differ_clause(g) for _, g in ranked[:MAX_DIFFER]]
    rest += sum(g.pairs for _, g in ranked[MAX_DIFFER:])
    if missing.left:
        clauses.append(f"not run: {', '.join(names(missing.left))} "
                       f"({', '.join(dict.fromkeys(missing.right))})")
    others = [f"{c.gpu}, {c.stack.split(' (')[0]}" for n, c in enumerate(grid.columns)
              if n not in scope]
    if rest or others:
        more = f"{rest} more pair{'s' * (rest != 1)}"
        clauses.append(more * bool(rest) + (" and " if rest and others else "")
                       + (f"{len(dict.fromkeys(others))} more GPU × stack" if others else "")
                       + " in the grid")
    where = f"{columns[0].gpu}, {columns[0].stack}, {_modes(columns, everything)}"
    return f"{grid.op} on {where}: {'; '.join(clauses) or 'no pair of interest'}."


def op_answers(tables: Tables) -> list[OpGrid]:
    """:func:`runner.tables.model.answers.op_grids` of the shown cells, each with its
    sentence; computed once per built tables."""
    key = ("answers",)
    if key not in tables.cache:
        grids = op_grids(tables.cells, tables.filters, tables.head)
        for grid in grids:
            grid.sentence = op_sentence(grid, tables.cells)
        tables.cache[key] = grids
    return tables.cache[key]
