"""The headline: kernel-only marks, links, and per op the sentence and the grid (collapsed
modes, both sides' errors against fp64, ⚠ per report); no generated Markdown line too long."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables.model.answers import op_grids, ulp
from gate_residual_matrix.runner.tables.model.cells import load_cells
from gate_residual_matrix.runner.tables.model.headline import KERNEL_ONLY, headline
from gate_residual_matrix.runner.tables.model.sentence import MAX_DIFFER, op_sentence
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


# --------------------------------------------------------------------------- the answer per op


def _committed(tmp_path: Path, names: tuple[str, ...]) -> Path:
    from tests.committed_reports import committed_reports
    everything = committed_reports(tmp_path / "all")
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in names:
        if not (everything / name).is_file():
            pytest.skip(f"{name} is not committed here (no git)")
        shutil.copy(everything / name, reports / name)
    return reports


def test_sentence_says_what_the_rms_norm_report_supports(tmp_path):
    reports = _committed(tmp_path, ("rms_norm-host-plain-cuda.json",
                                    "host-deterministic-cuda.json"))
    cells = load_cells(read_reports(reports))
    [grid] = [g for g in op_grids(cells) if g.op == "rms_norm"]
    text = op_sentence(grid, cells)
    assert text.startswith("rms_norm on NVIDIA H200, host (torch 2.11.0), plain (1 of 2 "
                           "modes): "), text
    assert "numba = vllm_rms_norm_batch_invariant 0.30.0/0.33.0 bitwise in every case" in text
    assert "not run: vllm_rms_norm_cuda 0.33.0 (unavailable)" in text
    # ours first, then trainer against rollout (vLLM's CUDA kernel is a rollout row too)
    assert text.index("numba vs eager") < text.index("numba vs vllm_rms_norm_cuda 0.30.0"), text
    assert text.count(" differ (") == MAX_DIFFER and "more pairs in the grid" in text, text
    assert "max error vs fp64" in text and len(text) < 1200, len(text)
    # the known failure: vLLM's CUDA RMSNorm is not batch-invariant, its Triton one and ours are
    yes, _, no = text.partition("not batch-invariant: ")
    assert ("batch-invariant in every case checked: numba, vllm_rms_norm_batch_invariant "
            "0.30.0/0.33.0;") in yes, text
    assert "vllm_rms_norm_cuda 0.30.0" in no.split(";")[0], text


def test_one_failed_batch_invariance_check_moves_a_row_to_not(tmp_path):
    reports = _committed(tmp_path, ("rms_norm-host-plain-cuda.json",))
    path = reports / "rms_norm-host-plain-cuda.json"
    data = json.loads(path.read_text())
    data["results"]["numba"]["batch_invariant"]["4097"].update(size_sweep=False,
                                                                first_failing_size=2047)
    path.write_text(json.dumps(data))
    cells = load_cells(read_reports(reports))
    [grid] = [g for g in op_grids(cells) if g.op == "rms_norm"]
    yes, _, no = op_sentence(grid, cells).partition("not batch-invariant: ")
    assert "numba" not in yes.rpartition("batch-invariant in every case checked: ")[2]
    assert no.startswith("eager, eager_functional, numba,"), no


def _only(folder: Path, name: str) -> Path:
    """A folder beside ``folder`` holding its report ``name`` alone."""
    alone = folder.parent / f"{folder.name}-{name}"
    alone.mkdir()
    shutil.copy(folder / name, alone / name)
    return alone


def test_modes_with_the_same_marks_share_a_column_and_a_mark_shows_both_errors(tmp_path):
    for name in ("host-plain-cuda.json", "host-deterministic-cuda.json"):
        shutil.copy(COMMITTED / name, tmp_path / name)
    data = json.loads((COMMITTED / "host-plain-cuda.json").read_text())
    data["cell"].update(id="host-tf32-cuda", mode="tf32")  # the same marks as plain
    (tmp_path / "host-tf32-cuda.json").write_text(json.dumps(data))
    [grid] = op_grids(load_cells(read_reports(tmp_path)))
    assert [c.modes for c in grid.columns] == [["plain", "tf32"], ["deterministic"]]
    # the shared column's marks count both modes' case comparisons, as the sentence says
    alone = op_grids(load_cells(read_reports(_only(tmp_path, "host-plain-cuda.json"))))[0]
    for pair in ("numba vs eager", "compiled vs eager"):
        assert grid.marks[(pair, 0)].mark.compared == 2 * alone.marks[(pair, 0)].mark.compared
    numba = grid.marks[("numba vs eager", 0)]
    assert numba.mark.label().startswith("✗ gate")
    ours, eager = numba.errors()
    assert ours is not None and eager is not None and ours < eager and numba.closer() == 0
    assert f"· {ulp(ours)} | {ulp(eager)}" in numba.text()


def test_stale_mark_is_per_report_not_per_shared_column(tmp_path):
    """host · plain holds two ops' reports: only the stale one's marks carry ⚠."""
    for name in ("host-plain-cuda.json", "scale_shift-host-plain-cuda.json"):
        data = json.loads((COMMITTED / name).read_text())
        data["environment"]["project"] = {"commit": "a" * 40 if name.startswith("host")
                                          else "b" * 40, "dirty": False}
        (tmp_path / name).write_text(json.dumps(data))
    grids = {g.op: g for g in op_grids(load_cells(read_reports(tmp_path)), head="a" * 40)}
    fresh, stale = grids["gate_residual"], grids["indexed_scale_shift"]
    assert not any(m.warnings for m in fresh.marks.values()) and not fresh.warnings
    compared = [m for m in stale.marks.values() if m.mark.compared]
    assert compared and all(m.text().endswith("⚠") for m in compared)
    assert [why for _, why in stale.warnings] == ["at bbbbbbb"]


def test_every_generated_markdown_line_fits(tmp_path):
    from gate_residual_matrix.runner.tables import write_tables
    from gate_residual_matrix.runner.tables.render.markdown import LINE
    from tests.committed_reports import committed_reports
    reports = committed_reports(tmp_path / "reports")
    write_tables(reports, head="0" * 40)
    pages = list(reports.rglob("*.md"))
    assert len(pages) > 10
    long = [(p.name, n) for p in pages for n, line in enumerate(p.read_text().splitlines())
            if len(line) > LINE]
    assert long == []
    readme = (reports / "README.md").read_text()
    for op in ("gate_residual", "indexed_scale_shift", "rms_norm", "add_rms_norm",
               "rms_norm_scale_shift"):
        assert f"- **{op}** on " in readme, op
