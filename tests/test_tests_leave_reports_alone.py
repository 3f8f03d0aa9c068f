"""No test names the working tree's ``reports/`` folder: the README's commands run in any order.

``nox -s matrix`` and ``nox -s report`` rewrite ``reports/``; a test that read it (a report to
copy, the reference report) passed or failed depending on what ran before it, and one that
wrote there would change the project's results. Tests take committed fixtures instead
(tests/committed_reports.py). This scans the test modules' source for the ways a path to the
project's own ``reports/`` is spelled.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# ROOT / "reports", Path(__file__).parent.parent / "reports", ROOT / "reports/x.json",
# Path("reports"), ROOT.glob("reports/*.json")
NAMES_REPORTS = re.compile(
    r"""\b\w*(?:ROOT|parent|REPO)\w*\s*/\s*["']reports["'/]"""
    r"""|\bPath\(\s*["']reports\b"""
    r"""|\b\w*(?:ROOT|parent|REPO)\w*\s*\.\s*r?glob\(\s*["']reports\b""")


def hits(source: str) -> list[str]:
    """The lines of ``source`` that spell a path into the project's ``reports/``."""
    return [line.strip() for line in source.splitlines() if NAMES_REPORTS.search(line)]


def test_the_scan_finds_each_spelling() -> None:
    bad = ['x = ROOT / "reports" / "host-plain-cpu.json"',
           "x = Path(__file__).parent.parent / 'reports/reference/r.json'",
           'x = Path("reports")', 'x = [*ROOT.glob("reports/*.json")]',
           'x = REPO_ROOT / "reports"']
    assert [len(hits(b)) for b in bad] == [1] * len(bad)
    good = ['x = tmp_path / "reports"', 'x = ROOT / "tests" / "data" / "reports" / "a.json"',
            '"""reports/index.html"""', 'argv = ["--reports", str(tmp_path / "reports")]']
    assert [hits(g) for g in good] == [[]] * len(good)


def test_no_test_module_names_the_working_trees_reports_folder() -> None:
    found = {p.name: hits(p.read_text(encoding="utf-8")) for p in sorted(TESTS.glob("*.py"))
             if p.name != Path(__file__).name}
    assert {name: lines for name, lines in found.items() if lines} == {}
