"""The headline marks a pair whose library side ran kernel-only (issue 13), and only that."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from runner.aggregate import load_cells
from runner.report import read_reports
from runner.table_headline import KERNEL_ONLY, headline

REPORT = Path(__file__).resolve().parent.parent / "reports" / "host-plain-cuda.json"


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
