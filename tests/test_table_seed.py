"""The seed comparison: the reference report's pair beside ours, case by case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables import format_cmp, load_cells
from gate_residual_matrix.runner.tables.model.seed import seed_tables
from tests.committed_reports import COMMITTED

ROOT = COMMITTED  # copies of committed reports: never the working tree's reports/


def _tables(tmp_path: Path, *ours: str):
    (tmp_path / "reference").mkdir()
    shutil.copy(ROOT / "reference" / "gate_residual_b200.json", tmp_path / "reference")
    for name in ours:
        shutil.copy(ROOT / name, tmp_path / name)
    return seed_tables(load_cells(read_reports(tmp_path)))


def _cmp(entry: dict, tensor: str) -> dict:
    return entry["out"][0] if tensor == "out" else entry["grads"][tensor]


def test_the_reference_pair_sits_beside_the_same_pair_of_our_plain_cells(tmp_path):
    [table] = _tables(tmp_path, "host-plain-cuda.json", "host-deterministic-cuda.json")
    assert len(table.headers) == 4, table.headers  # case, tensor, reference, plain only
    assert "host-plain-cuda" in table.headers[3] and "eager vs rl_kernel_h3" in table.headers[3]
    ref = json.loads((ROOT / "reference" / "gate_residual_b200.json").read_text())
    ours = json.loads((ROOT / "host-plain-cuda.json").read_text())
    cases = [str(c) for c in ref["cases"]]
    assert [r.values[0] for r in table.rows][::4] == cases
    for row in table.rows:
        case, tensor = row.values[:2]
        theirs = ref["results"]["diffusers"]["vs rl_kernel"][case]
        mine = ours["results"]["rl_kernel_h3"]["vs eager"][case]
        assert row.values[2] == format_cmp(_cmp(theirs, tensor))
        assert row.values[3] == format_cmp(_cmp(mine, tensor))


def test_no_table_without_a_cell_that_has_the_pair(tmp_path):
    data = json.loads((ROOT / "host-plain-cuda.json").read_text())
    data["results"] = {k: v for k, v in data["results"].items() if k != "rl_kernel_h3"}
    for entry in data["results"].values():
        entry.pop("vs rl_kernel_h3", None)
    (tmp_path / "host-plain-cuda.json").write_text(json.dumps(data))
    assert _tables(tmp_path) == []
