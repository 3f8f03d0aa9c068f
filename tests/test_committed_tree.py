"""Every ``*.json`` committed under ``reports/`` reads as a report, once per cell.

The tables read every ``*.json`` below ``reports/`` (:func:`read_reports`). Evidence kept
beside the reports (a timeline, a probe's copy of a cell's report) once made ``nox -s report``
end in an error and stood in for an adopted report. The files are taken from git's ``HEAD``
into a folder of the test's own, never from the working tree's ``reports/``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gate_residual_matrix.runner.reports.store import read_reports
from gate_residual_matrix.runner.tables.write import OUTPUTS

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True,
                          timeout=120).stdout


def test_every_committed_json_under_reports_is_a_readable_report(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no committed reports/ to read")
    listed = _git("ls-tree", "-r", "--name-only", "HEAD", "--", "reports").decode()
    names = [n for n in listed.splitlines() if n.endswith(".json")]
    assert names, "no *.json under reports/ at HEAD"
    for name in names:
        target = tmp_path / Path(name).relative_to("reports")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_git("show", f"HEAD:{name}"))
    loaded = read_reports(tmp_path, skip={os.path.realpath(tmp_path / n) for n in OUTPUTS})
    problems = [f"{r.path.relative_to(tmp_path)}: {r.problem}" for r in loaded if not r.ok]
    assert not problems, "\n".join(problems)
    tables_skip = [n for n in names if n.startswith("reports/bench/")
                   or n in {f"reports/{o}" for o in OUTPUTS}]
    assert len(loaded) == len(names) - len(tables_skip)  # every other file listed was read
