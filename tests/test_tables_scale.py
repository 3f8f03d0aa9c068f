"""The tables at 1,000 cells: size limits and render time.

The reports are synthesised by ``scripts/bench_tables.py`` from the H200 report in
tests/data/h200 (five cases, three implementations; one in twenty failed), over 100 stacks,
5 modes and 2 targets. Limits: ``README.md`` under 200 KB, ``index.html`` under 1.5 MB, and
``write_tables`` end to end (read, validate, build, render every page and picture, write)
under 15 s on the 2-core CPU machine.

And one report of thousands of cases (a report of 20,000 cases took 309 s, the
table step being quadratic in a report's cases): 4,000 cases render end to end under 15 s
(about 4 s now; the quadratic code took 33 s on the shared 2-core machine).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from gate_residual_matrix.runner.tables import write_tables

ROOT = Path(__file__).parent.parent
CELLS = 1000
README_LIMIT = 200 * 1024
HTML_LIMIT = 1.5 * 1024 * 1024
SECONDS = 15.0


def _synthesise():
    spec = importlib.util.spec_from_file_location("bench_tables",
                                                  ROOT / "scripts" / "bench_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthesise


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    reports = tmp_path_factory.mktemp("scale") / "reports"
    reports.mkdir()
    _synthesise()(reports, CELLS)
    start = time.perf_counter()
    write_tables(reports, head="0" * 40)
    return reports, time.perf_counter() - start


def test_thousand_cells_render_in_time(rendered: tuple[Path, float]) -> None:
    _, seconds = rendered
    assert seconds < SECONDS, f"write_tables took {seconds:.1f} s for {CELLS} cells"


def test_thousand_cells_stay_within_the_size_limits(rendered: tuple[Path, float]) -> None:
    reports, _ = rendered
    readme = (reports / "README.md").stat().st_size
    page = (reports / "index.html").stat().st_size
    assert readme < README_LIMIT, f"README.md is {readme / 1024:.0f} KB"
    assert page < HTML_LIMIT, f"index.html is {page / 1024:.0f} KB"
    assert len(list((reports / "cells").glob("*.md"))) == CELLS + 1  # a page each + index
    text = (reports / "README.md").read_text(encoding="utf-8")
    assert text.index("## Can I swap") < text.index("## Pictures")
    assert "50 error" in text  # one in twenty failed: collapsed to one line
    # no rendered table wider than a screen: at most COLUMNS_PER_TABLE marks a row
    widest = max(line.count("](cells/") for line in text.splitlines())
    assert 0 < widest <= 4


HUGE_CASES = 4000
HUGE_SECONDS = 15.0


def test_a_report_of_thousands_of_cases_renders_in_linear_time(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    _synthesise()(reports, 1, cases=HUGE_CASES)
    start = time.perf_counter()
    write_tables(reports, head="0" * 40)
    seconds = time.perf_counter() - start
    assert seconds < HUGE_SECONDS, f"write_tables took {seconds:.1f} s for {HUGE_CASES} cases"
    text = (reports / "README.md").read_text(encoding="utf-8")
    assert "1 cell reports: 1 ours (1 ok)." in text and "Unreadable files" not in text
    rows = (reports / "summary.csv").read_text(encoding="utf-8").count("\n") - 1
    assert rows == HUGE_CASES * 3 * 4  # eager, numba, fp64 x every case x 4 tensors
