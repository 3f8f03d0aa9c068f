"""The kernel-only marker table: which library rows ran kernel-only.

A row ``<implementation>-<version>`` whose library was not installed ran only that library's
kernel modules, loaded from its wheel's files (contract/kernel_only.py), under
this host's torch and triton, not the versions the library pins: its bits are the kernel's,
not a full-stack run's. This table lists every such row (``kernel-only``) beside the rows that
imported the installed library (``installed``) and the RL-Kernel source tree that ran, from
each report's ``environment.kernel_only`` record, and, where the cell ran several versions of
the row's implementation, the first version whose bits differ from its predecessor's
(:mod:`runner.tables.model.versions`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gate_residual_matrix.runner.tables.model.cells import CellReport
from gate_residual_matrix.runner.tables.model.filters import Filters
from gate_residual_matrix.runner.tables.model.table import Row, Table
from gate_residual_matrix.runner.tables.model.values import status_kind
from gate_residual_matrix.runner.tables.model.versions import first_change_text

MARK = "kernel-only"
LEGEND = ("`kernel-only`: the library's kernel modules only, loaded from its released wheel's "
          "files (each checked against the wheel's RECORD) with stand-in parent packages, run "
          "by this host's torch and triton, not a full-stack install of that version; "
          "`installed`: the installed library, imported normally. The full record (wheel "
          "sha256, files loaded and their sha256, substitutes) is in each report's "
          "`environment.kernel_only` and `results[impl].code_path`. `first change`: of the "
          "versions of the row's implementation that ran in the cell, the first whose bits "
          "(sha256 of every tensor in every case both ran) differ from the previous version's, "
          "with the tensors and cases that differ; `none` when all have the same bits.")


def kernel_only_table(cells: Sequence[CellReport], filters: Filters | None = None) -> Table:
    """One row per (cell, library row) with a load record: how it was loaded, its version,
    wheel, torch/triton, and its status in that cell."""
    filters = filters or Filters()
    rows = []
    for c in cells:
        records = (c.data.get("environment") or {}).get("kernel_only") or {}
        for impl, rec in records.items():
            if not filters.keeps_impl(impl) or not isinstance(rec, dict):
                continue
            status = str((c.results.get(impl) or {}).get("status"))
            wheel = rec.get("wheel") or {}
            where = (f"{wheel.get('filename')} ({str(wheel.get('sha256'))[:12]})" if wheel
                     else str(rec.get("tree") or "—"))
            rows.append(Row((c.label, impl, str(rec.get("mode")),
                             f"{rec.get('distribution')} {rec.get('version') or ''}".strip(),
                             where, str(rec.get("runtime") or "—"), status,
                             first_change_text(c, impl)),
                            c.index, ("", "", "warn" if rec.get("mode") == MARK else "", "",
                                      "", "", status_kind(status))))
    return Table("kernel_only", "Library rows: kernel-only or installed",
                 ("cell", "impl", "loaded", "library", "wheel / tree", "ran with", "status",
                  "first change"),
                 rows, note=LEGEND, level=3,
                 empty="No report records how a library row was loaded.")
