"""The seed comparison: a reference report's pair, case by case, beside ours.

A reference report (``reports/reference/*.json``, e.g. RL-Kernel's own B200 run) compares two
implementations under its own names (``rl_kernel vs diffusers``). The op's spec maps those
names onto the matrix's implementations (:attr:`ops.spec.OpSpec.reference_names`:
``diffusers`` -> ``eager``, ``rl_kernel`` -> ``rl_kernel_h3`` for gate_residual). This table
puts, for each of the reference's cases and tensors, its CMP beside the same pair's CMP in
each of our cells of that op and mode that compared it (``differ/numel (max_abs, max_ulp)``,
:func:`runner.tables.model.values.format_cmp`): the reference's layout, our GPUs beside its GPU.
Cases are matched by id: the reference's ``1`` ... ``32768`` are our cases of the problem's
own dtypes (bf16/int64 in matrix.yaml).
"""

from __future__ import annotations

from collections.abc import Sequence

from gate_residual_matrix import ops
from gate_residual_matrix.runner.tables.model.bits import pair_results
from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import ABSENT, cmp_kind, format_cmp

__all__ = ["seed_tables"]


def _names(op: str | None) -> dict[str, str]:
    """The op's reference names -> ours (empty for an unknown op or none declared)."""
    try:
        return dict(ops.get(str(op)).reference_names)
    except KeyError:
        return {}


def _by_case(cell: CellReport, a: str, b: str, filters: Filters | None) -> dict[str, dict]:
    """``case -> {tensor: CMP}`` of pair ``a``/``b`` (either order) in ``cell``."""
    return {r.case: r.tensors for r in pair_results(cell, filters) if {r.a, r.b} == {a, b}}


def seed_tables(cells: Sequence[CellReport], filters: Filters | None = None) -> list[Table]:
    """One table per reference report and pair whose names the op's spec maps: rows are
    (case, tensor) in the reference's order; columns the reference, then each of our cells
    (same op; same mode where the reference names one) with that pair. No table where no
    cell of ours has the pair."""
    tables = []
    for ref in (c for c in cells if not c.ours):
        names = _names(ref.op)
        for pair in dict.fromkeys((r.a, r.b) for r in pair_results(ref, filters)):
            if not all(n in names for n in pair):
                continue
            ours_pair = (names[pair[0]], names[pair[1]])
            theirs = _by_case(ref, *pair, filters)
            columns = [(c, got) for c in cells
                       if c.ours and c.op == ref.op and (ref.mode is None or c.mode == ref.mode)
                       and (got := _by_case(c, *ours_pair, filters))
                       and any(case in got for case in theirs)]
            if not columns:
                continue
            rows = []
            for case, tensors in theirs.items():
                for tensor, cmp in tensors.items():
                    mine = [got.get(case, {}).get(tensor) for _, got in columns]
                    rows.append(Row((case, tensor, format_cmp(cmp),
                                     *(format_cmp(m) if m else ABSENT for m in mine)),
                                    kinds=("", "", cmp_kind(cmp), *(cmp_kind(m) for m in mine))))
            headers = ("case", "tensor", f"{ref.label}: {pair[0]} vs {pair[1]}",
                       *(f"{c.label} ({c.facet('gpu')}): {ours_pair[0]} vs {ours_pair[1]}"
                         for c, _ in columns))
            tables.append(Table(
                f"seed-{ref.index}-{pair[0]}-{pair[1]}",
                f"Seed comparison: {pair[0]} vs {pair[1]}, the reference beside our cells",
                headers, rows,
                note=(f"The reference report's comparison, case by case, in its layout "
                      f"(`differ/numel (max_abs, max_ulp)`, or `equal`), beside the same pair "
                      f"in our cells: `{pair[0]}` is our `{ours_pair[0]}`, `{pair[1]}` our "
                      f"`{ours_pair[1]}` (the op's reference names)."), level=2))
    return tables
