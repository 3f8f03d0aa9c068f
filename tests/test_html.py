"""Tests for runner.html: reports/index.html, checked as text and in a real headless Chromium.

The browser tests drive Debian's chromium through the Chrome DevTools Protocol (playwright,
with ``executable_path``: no browser download). CI installs chromium with
``.ci/install-chromium.sh``; where it is missing these tests fail with that hint, unless
``SKIP_BROWSER_TESTS=1`` says to skip them. Screenshots are written under the test's tmp dir
and copied to ``artifacts/`` (git-ignored).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.tables import write_tables

ROOT = Path(__file__).parent.parent
TABLES = Path(__file__).parent / "data" / "tables"
REFERENCE = ROOT / "reports" / "reference" / "gate_residual_b200.json"
H200 = Path(__file__).parent / "data" / "h200" / "host-plain-cuda.json"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@pytest.fixture(scope="module")
def page_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """index.html for the synthetic reports, the reference report and the real H200 one."""
    reports = tmp_path_factory.mktemp("html") / "reports"
    shutil.copytree(TABLES / "reports", reports)
    (reports / "reference").mkdir()
    shutil.copy(REFERENCE, reports / "reference" / REFERENCE.name)
    (reports / "h200").mkdir()
    text = H200.read_text(encoding="utf-8").replace('"id": "host-plain-cuda"',
                                                    '"id": "h200-plain-cuda"', 1)
    (reports / "h200" / "host-plain-cuda-h200.json").write_text(text, encoding="utf-8")
    write_tables(reports)
    return reports / "index.html"


@pytest.fixture(scope="module")
def html(page_path: Path) -> str:
    return page_path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- as text


def test_page_is_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(link|img|iframe)\b", html)
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert not re.search(r"url\(", html)
    external = re.findall(r'(?:href|src)="([^"#][^"]*)"', html)
    assert set(external) == {"README.md", "summary.csv", "summary.json"}  # siblings only


def test_page_escapes_report_text(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(TABLES / "reports", reports)
    path = reports / "docker-vllm-plain-cuda.json"
    text = path.read_text(encoding="utf-8").replace(
        "RuntimeError: CUDA error", "<script>alert(1)</script></script> RuntimeError")
    path.write_text(text, encoding="utf-8")
    write_tables(reports)
    page = (reports / "index.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_every_cell_has_a_heatmap_row_and_filter_values(html: str) -> None:
    for label in ("docker-vllm-plain-cuda", "docker-sglang-plain-cuda", "h200-plain-cuda",
                  "reference:gate_residual_b200 (NVIDIA B200)"):
        assert f'<th class="cellname">{label}' in html
    assert 'data-dim="stack" value="docker-torch213"' in html
    assert 'data-dim="gpu" value="NVIDIA B200"' in html
    assert 'data-dim="dtype" value="bfloat16"' in html
    assert "illegal memory access" in html  # the error's reason, in its heatmap row


# --------------------------------------------------------------------------- in Chromium


def _chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser",
                      "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if os.environ.get("SKIP_BROWSER_TESTS") == "1":
        pytest.skip("SKIP_BROWSER_TESTS=1")
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the test extra installs it
        pytest.fail("playwright is not installed: pip install -e '.[test]'")
    if executable is None:
        pytest.fail("no chromium found: run .ci/install-chromium.sh (or set CHROMIUM=path; "
                    "SKIP_BROWSER_TESTS=1 skips these tests)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A loaded page and everything it logged."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.messages: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda m: self.messages.append(f"console {m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.messages.append(f"pageerror: {e}"))
        self.page.on("requestfailed", lambda r: self.messages.append(f"failed: {r.url}"))
        self.page.on("request", lambda r: r.url.startswith("file:")
                     or self.messages.append(f"request: {r.url}"))
        self.page.goto(path.as_uri())

    def visible_rows(self, table_id: str) -> list[str]:
        """The first cell of each visible body row of ``table_id``."""
        return self.page.eval_on_selector_all(
            f"#{table_id} tbody tr",
            "rows => rows.filter(r => !r.hidden).map(r => r.cells[0].textContent.trim())")

    def click(self, selector: str) -> None:
        self.page.click(selector)

    def text(self, selector: str) -> str:
        return self.page.inner_text(selector)

    def screenshot(self, tmp_path: Path, name: str) -> Path:
        path = tmp_path / name
        self.page.screenshot(path=str(path), full_page=True)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(path, ARTIFACTS / name)
        return path


def _box(dim: str, value: str) -> str:
    return f'#filters input[data-dim="{dim}"][value="{value}"]'


def _verdict(page: Page, impl: str, case: str, tensor: str) -> str:
    return page.page.evaluate(
        """([impl, c, t]) => {
            const row = Array.from(document.querySelectorAll("#t-across-outputs tbody tr"))
              .find(r => r.cells[1].textContent === impl && r.cells[2].textContent === c
                         && r.cells[3].textContent === t);
            return row.querySelector("td.verdict").textContent;
        }""", [impl, case, tensor])


def test_loads_without_console_errors_and_screenshot(browser: Any, page_path: Path,
                                                     tmp_path: Path) -> None:
    page = Page(browser, page_path)
    assert page.text("#shown") == "7 of 7 cells shown"
    assert page.text("#count-t-bitwise").endswith("rows shown")
    shot = page.screenshot(tmp_path, "index.png")
    assert shot.stat().st_size > 10_000
    assert page.messages == []


def test_filters_change_what_is_shown(browser: Any, page_path: Path, tmp_path: Path) -> None:
    page = Page(browser, page_path)
    everything = page.visible_rows("t-bitwise")
    assert {"host-plain-cuda", "docker-vllm-plain-cuda", "h200-plain-cuda"} <= set(everything)
    assert _verdict(page, "eager", "257", "gate") == "3 variants (3 cells)"

    page.click(_box("stack", "host"))  # uncheck: the host cells disappear everywhere
    shown = page.visible_rows("t-bitwise")
    assert not {"host-plain-cuda", "host-compile-cpu", "h200-plain-cuda"} & set(shown)
    assert "docker-vllm-plain-cuda" in shown and len(shown) < len(everything)
    for table in ("t-heat", "t-cells", "t-environment", "t-accuracy", "t-timings"):
        assert "host-plain-cuda" not in page.visible_rows(table), table
    assert page.text("#shown") == "4 of 7 cells shown"
    assert _verdict(page, "eager", "257", "gate") == "1 cell only"  # recomputed

    page.click("#reset")
    page.click('#filters button.only[data-dim="gpu"][value="NVIDIA B200"]')
    assert page.visible_rows("t-cells") == ["reference:gate_residual_b200 (NVIDIA B200)"]
    assert page.text("#shown") == "1 of 7 cells shown"
    assert _verdict(page, "numba", "257", "out") == "no cell shown"

    page.click("#reset")
    page.click('#filters button.only[data-dim="dtype"][value="bfloat16"]')
    assert "reference:gate_residual_b200 (NVIDIA B200)" not in page.visible_rows("t-cells")
    page.click('#filters button.only[data-dim="stack"][value="docker-torch213"]')
    assert page.visible_rows("t-cells") == ["docker-torch213-plain-cuda"]
    assert page.text("#count-t-cells") == "1 of 7 rows shown"
    page.screenshot(tmp_path, "index-filtered.png")

    page.click("#reset")
    assert page.visible_rows("t-bitwise") == everything
    assert page.messages == []


def test_only_rows_that_differ(browser: Any, page_path: Path) -> None:
    page = Page(browser, page_path)
    all_rows = page.page.eval_on_selector_all("#t-across-outputs tbody tr", "r => r.length")
    page.click("input.only-variants")
    kept = page.page.eval_on_selector_all(
        "#t-across-outputs tbody tr",
        "rows => rows.filter(r => !r.hidden).map(r => r.querySelector('td.verdict').textContent)")
    assert 0 < len(kept) < all_rows
    assert all("variants" in v or v.startswith("void") for v in kept)
    assert page.messages == []


def test_dtype_filter_hides_the_rows_of_other_case_dtypes(browser: Any,
                                                           tmp_path: Path) -> None:
    """One real cell with cases in two dtypes: the dtype filter acts on rows, not cells."""
    from runner.cell import run_cell
    from runner.cells import Cell
    from runner.config import parse_matrix
    from runner.report import write_report

    matrix = parse_matrix({
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 16, "G": 3, "dtype": "bfloat16", "index_dtype": "int64", "seed": 3},
        "cases": [{"n": 9}, {"n": 9, "dtype": "float16", "index_dtype": "int32"}],
        "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
        "accuracy_reference": "fp64", "repeats": 1, "modes": {"plain": {}},
        "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"]})
    reports = tmp_path / "reports"
    write_report(run_cell(matrix, Cell("host", "plain", "cpu"), matrix.cases, timings=False),
                 reports)
    write_tables(reports)
    page = Page(browser, reports / "index.html")

    def dtypes(table: str, column: int) -> list[str]:
        return page.page.eval_on_selector_all(
            f"#{table} tbody tr",
            f"rows => rows.filter(r => !r.hidden).map(r => r.cells[{column}].textContent)")

    assert dtypes("t-bitwise", 4) == ["bfloat16/int64", "float16/int32"]
    page.click(_box("dtype", "float16"))  # uncheck
    assert dtypes("t-bitwise", 4) == ["bfloat16/int64"]
    assert set(dtypes("t-accuracy", 3)) == {"bfloat16/int64"}
    assert page.text("#shown") == "1 of 1 cells shown"  # the cell stays: it has bf16 cases
    assert len(dtypes("t-heat", 1)) == 1  # one heatmap row per dtype pair
    page.click('#filters button.only[data-dim="dtype"][value="float16"]')
    assert dtypes("t-bitwise", 4) == ["float16/int32"]
    page.click("#reset")
    assert len(dtypes("t-bitwise", 4)) == 2 and len(dtypes("t-heat", 1)) == 2
    assert page.messages == []
