"""The tables' read path: jsonschema-rs (when installed) must judge reports as jsonschema does.

runner.reports.store asks jsonschema-rs first and runs jsonschema only for a report it rejects
(for the message), which is what makes 1,000 reports aggregate in seconds
(scripts/bench_tables.py). These tests read every test report, and reports broken in the ways
test_report.py lists, with and without the fast path, and compare the outcome.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gate_residual_matrix.runner.reports import store as report_mod
from tests.committed_reports import REFERENCE

DATA = Path(__file__).parent / "data"
FILES = sorted([*(DATA / "reports").glob("*.json"), *(DATA / "tables" / "reports").glob("*.json"),
                DATA / "h200" / "host-plain-cuda.json",
                REFERENCE])
CMP = ["results", "numba", "vs eager", "257", "grads", "gate"]
BREAKS = [
    (["status"], "crashed"), (["unknown_top_level"], 1), (["cell", "id"], "../evil"),
    ([*CMP, "max_abs"], -1.0), ([*CMP, "max_ulp"], 1.5), ([*CMP, "extra"], 1),
    ([*CMP, "differ"], 3), (["problem", "dtype"], "float8"), (["cases"], [1, 257, 0]),
    (["results", "numba", "status"], "maybe"), (["results", "numba", "sha256", "1", "out"], "x"),
    (["inputs", "1", "sha256", "y"], "not a hash"), (["environment", "capability"], [9]),
]


def _both(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[object, object]:
    fast = report_mod.read_report(path)
    monkeypatch.setattr(report_mod, "fast_validator", lambda: None)
    slow = report_mod.read_report(path)
    monkeypatch.undo()
    return fast, slow


def test_fast_validator_is_installed_here() -> None:
    pytest.importorskip("jsonschema_rs")
    assert report_mod.fast_validator() is not None


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_same_outcome_for_test_reports(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    fast, slow = _both(monkeypatch, path)
    assert fast == slow


@pytest.mark.parametrize(("where", "value"), BREAKS, ids=lambda v: str(v)[:30])
def test_same_problem_for_broken_reports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         where: list, value: object) -> None:
    doc = copy.deepcopy(json.loads((DATA / "reports" / "host-plain-cuda.json").read_text()))
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(doc))
    fast, slow = _both(monkeypatch, path)
    assert fast == slow and fast.problem is not None


def test_values_the_fast_check_cannot_take_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``str`` subclass (``torch.__version__`` is one) is valid JSON text to jsonschema;
    jsonschema-rs refuses the type, and the slow pass decides instead of an exception."""

    class Version(str):
        pass

    doc = json.loads((DATA / "reports" / "host-plain-cuda.json").read_text())
    doc["environment"]["torch"] = Version("2.11.0+cu130")
    report_mod.validate(doc)
    doc["status"] = Version("crashed")
    with pytest.raises(report_mod.ReportError, match="status: 'crashed' is not one of"):
        report_mod.validate(doc)


def test_tables_elsewhere_do_not_read_the_reports_dirs_own_tables(tmp_path):
    """``report --out DIR``: summary.json written earlier into the reports directory is this
    tool's output, not a report (it used to be listed as unreadable, exit 3)."""
    import shutil

    from gate_residual_matrix.runner import tables

    reports = tmp_path / "reports"
    shutil.copytree(Path(__file__).parent / "data" / "tables" / "reports", reports)
    tables.write_tables(reports)  # README.md, index.html, summary.* in the reports directory
    out = tables.write_tables(reports, tmp_path / "elsewhere" / "README.md")
    text = out.read_text()
    assert "summary.json" not in text.split("Unreadable", 1)[-1] or "Unreadable" not in text
