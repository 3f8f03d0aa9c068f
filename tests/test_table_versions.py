"""The first change across versions (runner/tables/model/versions.py): the library rows table
says, per library implementation of a cell, the first version whose bits differ from its
predecessor's.

The rows are fabricated from a real H200 report (tests/data/h200/host-plain-cuda.json):
numba's entry stands in for versions 0.1.0, 0.2.0 and 0.10.0 of a library row (version
order, not string order: 0.10.0 is the newest), one of them with other bits in one case.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables import build_tables
from gate_residual_matrix.runner.tables.model.cells import load_cells
from gate_residual_matrix.runner.tables.model.versions import (
    first_change_text,
    first_changes,
    library_row,
)

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json"
VERSIONS = ("0.10.0", "0.1.0", "0.2.0")  # the report's order is not the versions'


def with_versions(tmp_path: Path, edit=None) -> Path:
    data: dict[str, Any] = json.loads(H200.read_text())
    results = data["results"]
    numba = results.pop("numba")
    eager_vs = results["eager"].pop("vs numba")
    data["environment"]["kernel_only"] = {}
    for version in VERSIONS:
        name = f"lib_gate-{version}"
        results[name] = copy.deepcopy(numba)
        results["eager"][f"vs {name}"] = copy.deepcopy(eager_vs)
        data["environment"]["kernel_only"][name] = {
            "mode": "kernel-only", "distribution": "lib", "version": version,
            "wheel": {"filename": f"lib-{version}-py3-none-any.whl", "sha256": "0" * 64},
            "runtime": "torch 2.11.0+cu130, triton 3.6.0"}
    if edit is not None:
        edit(results)
    (tmp_path / "host-plain-cuda.json").write_text(json.dumps(data))
    return tmp_path


def library_rows(directory: Path) -> dict[str, str]:
    tables = build_tables(read_reports(directory))
    (table,) = [t for t in tables.sections if t.key == "kernel_only"]
    column = table.headers.index("first change")
    return {r.values[1]: r.values[column] for r in table.rows}


def test_the_same_bits_in_every_version_is_none(tmp_path) -> None:
    rows = library_rows(with_versions(tmp_path))
    assert rows == dict.fromkeys(
        (f"lib_gate-{v}" for v in VERSIONS),
        "none: 0.1.0, 0.2.0, 0.10.0 have the same bits (5 cases)")


def test_the_first_version_whose_bits_differ_from_its_predecessor(tmp_path) -> None:
    def newest_moves(results: dict[str, Any]) -> None:
        results["lib_gate-0.10.0"]["sha256"]["257"]["out"] = "e" * 64
        results["lib_gate-0.10.0"]["sha256"]["1"]["gate"] = "d" * 64

    rows = library_rows(with_versions(tmp_path, newest_moves))
    assert set(rows.values()) == {"0.10.0 (out, grad_gate in 2 of 5 cases vs 0.2.0)"}


def test_a_version_without_bits_is_passed_over(tmp_path) -> None:
    def middle_missing_then_change(results: dict[str, Any]) -> None:
        middle = results["lib_gate-0.2.0"]
        middle["status"], middle["reason"] = "unavailable", "import lib failed (test)"
        for key in ("sha256", "repeatable", "accuracy", "timings"):
            middle.pop(key, None)
        results["eager"].pop("vs lib_gate-0.2.0")
        middle.pop("vs eager")
        results["lib_gate-0.10.0"]["sha256"]["257"]["y"] = "e" * 64

    directory = with_versions(tmp_path, middle_missing_then_change)
    cell = load_cells(read_reports(directory))[0]
    (found,) = first_changes(cell).values()
    assert (found.versions, found.version, found.previous) == (("0.1.0", "0.10.0"), "0.10.0",
                                                               "0.1.0")
    assert (found.tensors, found.cases) == (("grad_y",), ("257",))
    assert first_change_text(cell, "eager") == "—"  # not a library row


def test_library_row_names() -> None:
    assert library_row("sglang_indexed_gate_triton_inplace-0.5.23")[0] == (
        "sglang_indexed_gate_triton_inplace")
    assert str(library_row("vllm_omni_h3_fused-0.30.0")[1]) == "0.30.0"
    assert library_row("rl_kernel_h3") is None and library_row("compiled_emulate") is None


def test_the_versions_table_groups_cells_and_opens_the_pages(tmp_path) -> None:
    def newest_moves(results: dict[str, Any]) -> None:
        results["lib_gate-0.10.0"]["sha256"]["257"]["out"] = "e" * 64

    directory = with_versions(tmp_path, newest_moves)
    tables = build_tables(read_reports(directory))
    (table,) = [t for t in tables.sections if t.key == "versions"]
    assert [r.values for r in table.rows] == [
        ("lib_gate", "0.1.0, 0.2.0, 0.10.0", "0.10.0 (out in 1 of 5 cases vs 0.2.0)",
         "host-plain-cuda")]
    from gate_residual_matrix.runner.tables import write_tables

    readme = write_tables(directory, tmp_path / "out" / "README.md", head=None).read_text()
    assert "## First change across library versions" in readme
    assert "First change across library versions" in (tmp_path / "out" / "index.html").read_text()


def test_no_versions_table_without_two_versions() -> None:
    tables = build_tables(read_reports(H200.parent))
    assert "versions" not in {t.key for t in tables.sections}
