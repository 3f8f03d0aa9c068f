"""The headline marks a pair whose library side ran kernel-only (issue 13), and only that."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables.model.cells import load_cells
from gate_residual_matrix.runner.tables.model.headline import KERNEL_ONLY, headline
from tests.committed_reports import COMMITTED

REPORT = COMMITTED / "host-plain-cuda.json"


def _marks(tmp_path: Path, data: dict) -> dict[str, str]:
    (tmp_path / "host-plain-cuda.json").write_text(json.dumps(data))
    h = headline(load_cells(read_reports(tmp_path)))
    return {pair: h.marks[(pair, 0)].label() for pair in h.pairs}


def test_kernel_only_rows_are_marked_and_installed_ones_are_not(tmp_path):
    data = json.loads(REPORT.read_text())
    records = data["environment"]["kernel_only"]
    kernel_only = [impl for impl, r in records.items() if r.get("mode") == "kernel-only"]
    assert kernel_only, "the committed H200 report has kernel-only library rows"
    marks = _marks(tmp_path, data)
    for impl in kernel_only:
        if f"{impl} vs eager" in marks and not marks[f"{impl} vs eager"].startswith("n/a"):
            assert marks[f"{impl} vs eager"].endswith(f" {KERNEL_ONLY}"), impl
    assert not marks["numba vs eager"].endswith(KERNEL_ONLY)
    assert not marks["compiled vs eager"].endswith(KERNEL_ONLY)

    installed = copy.deepcopy(data)  # the same rows, imported from an installed library
    for record in installed["environment"]["kernel_only"].values():
        record["mode"] = "installed"
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    assert not any(m.endswith(KERNEL_ONLY) for m in _marks(tmp_path, installed).values())


def test_a_mark_links_to_its_own_cell_in_a_column_both_ops_share(tmp_path):
    """host · plain holds gate_residual's and indexed_scale_shift's cells: each pair's mark
    points at the cell of its op, not at the first cell of the column."""
    for name in ("host-plain-cuda.json", "scale_shift-host-plain-cuda.json"):
        shutil.copy(REPORT.parent / name, tmp_path / name)
    cells = load_cells(read_reports(tmp_path))
    h = headline(cells)
    [column] = [n for n, c in enumerate(h.columns) if len(c.cells) == 2]
    by_op = {c.op: c.index for c in cells}
    for pair in h.pairs:
        mark = h.marks.get((pair, column))
        if mark is None or not mark.compared:
            continue
        op = "indexed_scale_shift" if pair.endswith("(indexed_scale_shift)") else "gate_residual"
        assert mark.only_cell == by_op[op], pair
