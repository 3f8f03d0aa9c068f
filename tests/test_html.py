"""Tests for runner.tables.render.html: reports/index.html, as text and in a headless Chromium.

The browser tests drive Debian's chromium through the Chrome DevTools Protocol (playwright,
with ``executable_path``: no browser download). CI installs chromium with
``.ci/install-chromium.sh``; where it is missing these tests fail with that hint, unless
``SKIP_BROWSER_TESTS=1`` says to skip them. Screenshots are written under the test's tmp dir
and copied to ``artifacts/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate_residual_matrix.runner.tables import write_tables
from tests.committed_reports import REFERENCE, committed_reports

ROOT = Path(__file__).parent.parent
TABLES = Path(__file__).parent / "data" / "tables"
H200 = Path(__file__).parent / "data" / "h200" / "host-plain-cuda.json"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@pytest.fixture(scope="module")
def page_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """index.html for the synthetic reports, the reference report, the real H200 one and the
    committed RMSNorm reports (the ops with trainer-vs-rollout pairs)."""
    reports = tmp_path_factory.mktemp("html") / "reports"
    shutil.copytree(TABLES / "reports", reports)
    (reports / "reference").mkdir()
    shutil.copy(REFERENCE, reports / "reference" / REFERENCE.name)
    (reports / "h200").mkdir()
    h200 = json.loads(H200.read_text(encoding="utf-8"))
    h200["cell"].update(id="h200-plain-cuda", stack="h200")  # the id is <stack>-<mode>-<target>
    (reports / "h200" / "h200-plain-cuda.json").write_text(json.dumps(h200), encoding="utf-8")
    # the reference run again under another CUDA: not a duplicate, and the same column
    again = json.loads(REFERENCE.read_text(encoding="utf-8"))
    again["environment"]["cuda"] = "12.9"
    (reports / "reference-cu129").mkdir()
    (reports / "reference-cu129" / REFERENCE.name).write_text(json.dumps(again), "utf-8")
    committed = committed_reports(tmp_path_factory.mktemp("committed"))
    for name in ("rms_norm-host-plain-cuda.json", "rms_norm_scale_shift-host-plain-cuda.json",
                 "add_rms_norm-host-plain-cuda.json", "scale_shift-host-plain-cuda.json"):
        if (committed / name).is_file():  # without git: the fixtures only
            shutil.copy(committed / name, reports / name)
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
    assert not re.search(r"url\((?!#)", html)  # the SVGs' own url(#clip) only
    external = set(re.findall(r'(?:href|src)="([^"#][^"]*)"', html))
    assert {"README.md", "cells/README.md", "summary.csv", "summary.json",
            "cells/host-compile-cpu.md", "plots/bits-differ.svg"} <= external
    assert all(re.fullmatch(r"(cells|plots)/[A-Za-z0-9._-]+|[A-Za-z]+\.(md|csv|json)"
                            r"|data:image/png;base64,[A-Za-z0-9+/=\s]+", e)
               for e in external), external  # siblings or inline pictures, nothing fetched
    assert html.count("<svg") >= 3  # the pictures are inlined


def test_headline_legend_names_the_reports_tensors(html: str) -> None:
    """The legend's tensor list is filled in, as on the Markdown pages (it once showed a
    literal ``{legend}``)."""
    full = html.split('<section id="headline"', 1)[1]
    legend = full.split('<details class="legend">', 1)[1].split("</details>", 1)[0]
    assert "{legend}" not in html
    assert re.search(r"<code>out</code>, .*<code>res</code> = grad_res", legend), legend[:600]


def test_page_escapes_report_text(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(TABLES / "reports", reports)
    path = reports / "docker-vllm-plain-cuda.json"
    text = path.read_text(encoding="utf-8").replace(
        "RuntimeError: CUDA error", "<!--<script>alert(1)</script></script> RuntimeError")
    path.write_text(text, encoding="utf-8")
    write_tables(reports)
    page = (reports / "index.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "<!--<" not in page


def test_headline_has_a_column_per_gpu_stack_mode_and_links_to_cell_pages(html: str) -> None:
    head = html.split('id="t-headline"')[1].split("</table>")[0]
    assert '<span class="gpu">NVIDIA B200</span>' in head
    assert '<span class="gpu">NVIDIA H200</span><br>host (torch 2.11.0)<br>' in head
    assert '<a href="cells/host-compile-cpu.md">' in head
    # the two B200 reference runs share GPU x stack x mode: one column, linked to the list
    assert '<a href="cells/README.md">' in head
    assert 'data-pair="numba vs eager"' in head
    assert "⚠ dirty" in head  # the H200 report was made from a dirty tree
    assert "illegal memory access" in html  # the failed cell, in the not-run list


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


SCREEN = {"width": 1400, "height": 900}


def _box_of(page: Page, selector: str) -> dict[str, float]:
    box = page.page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not rendered"
    return box


def _on_first_screen(box: dict[str, float], whole: bool = False) -> bool:
    """Whether an element's box starts on the first screen (and, ``whole``, ends there)."""
    top, bottom = box["y"], box["y"] + box["height"]
    if whole:
        return 0 <= top and bottom <= SCREEN["height"] and box["x"] + box["width"] <= (
            SCREEN["width"] + 1)
    return 0 <= top < SCREEN["height"] - 40 and box["height"] > 0


def _grid_overflow(page: Page) -> list[list[float]]:
    """``[scrollWidth, container clientWidth]`` of each headline grid that scrolls sideways,
    and of the document when it does."""
    return page.page.evaluate("""() => {
        const out = Array.from(document.querySelectorAll("#answers table"))
            .map((t) => [t.scrollWidth, t.parentElement.clientWidth])
            .filter(([w, c]) => w > c);
        const doc = document.scrollingElement;
        return doc.scrollWidth > doc.clientWidth ? out.concat([[doc.scrollWidth, doc.clientWidth]])
            : out;
    }""")


def _sentences_below_first_screen(page: Page) -> list[str]:
    """The ops whose sentence (``#answers li``) does not end within the first screen."""
    return page.page.evaluate(f"""() => Array.from(document.querySelectorAll("#answers li"))
        .filter((li) => li.getBoundingClientRect().bottom > {SCREEN["height"]}
                        || li.getBoundingClientRect().height === 0)
        .map((li) => li.dataset.op)""")


def test_first_screen_shows_each_ops_answer_and_the_grids_fit(browser: Any, page_path: Path,
                                                              tmp_path: Path) -> None:
    """The headline's "done when": at 1400 px no headline grid scrolls sideways, and the first
    screen holds each op's sentence, with the filters; the screenshot is kept."""
    page = Page(browser, page_path)
    shot = tmp_path / "index-first-screen.png"
    page.page.screenshot(path=str(shot), timeout=120_000)  # the viewport: what a reader sees
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)
    assert shot.stat().st_size > 10_000
    ops = page.page.eval_on_selector_all("#answers li", "lis => lis.map(li => li.dataset.op)")
    assert {"gate_residual", "indexed_scale_shift"} <= set(ops), ops
    assert page.page.locator("#answers table.grid").count() >= len(ops)
    assert _grid_overflow(page) == []
    assert _sentences_below_first_screen(page) == []
    for dim in ("gpu", "stack", "mode", "pair"):
        assert _on_first_screen(_box_of(page, f'#filters input[data-dim="{dim}"]'), whole=True)
    assert page.page.evaluate("window.scrollY") == 0
    assert page.messages == []


def test_first_screen_check_fails_on_a_page_without_the_answers(browser: Any, page_path: Path,
                                                                tmp_path: Path) -> None:
    """The checks above can fail: the same page with the grids one wide table (as the
    headline was: every column side by side) scrolls sideways, and with the sentences pushed
    below a screen of other content they are not on the first screen."""
    html = page_path.read_text(encoding="utf-8")
    wide = re.sub(r'<table class="data grid">', '<table class="data grid" style="table-layout:'
                  'auto;width:auto;white-space:nowrap;min-width:2400px">', html)
    pushed = wide.replace('<ul class="answers">', '<div style="height:1200px"></div>'
                          '<ul class="answers">', 1)
    (tmp_path / "old.html").write_text(pushed, encoding="utf-8")
    page = Page(browser, tmp_path / "old.html")
    assert _grid_overflow(page) != []
    assert _sentences_below_first_screen(page) != []


def test_filters_take_what_people_type(browser: Any, page_path: Path, tmp_path: Path) -> None:
    page = Page(browser, page_path)

    def columns() -> list[str]:
        return page.page.eval_on_selector_all(
            "#t-headline thead th[data-col]",
            "ths => ths.filter(t => !t.hidden).map(t => t.querySelector('.gpu').textContent)")

    everything = columns()
    assert {"NVIDIA B200", "NVIDIA H200", "CPU"} <= set(everything)
    page.page.fill('#filters input[data-dim="gpu"]', "h200")  # as typed: part, any case
    assert set(columns()) == {"NVIDIA H200"}
    assert page.text("#count-t-headline").endswith(f"{len(columns())} of {len(everything)} "
                                                   "columns")
    assert "reference:gate_residual_b200 (NVIDIA B200)" not in page.visible_rows("t-cells")
    page.page.fill('#filters input[data-dim="gpu"]', "b200, H200")  # alternatives
    assert set(columns()) == {"NVIDIA B200", "NVIDIA H200"}
    page.page.fill('#filters input[data-dim="pair"]', "NUMBA")
    pairs = page.page.eval_on_selector_all(
        "#t-headline tbody tr", "rows => rows.filter(r => !r.hidden).map(r => r.dataset.pair)")
    assert "numba vs eager" in pairs and all("numba" in p for p in pairs), pairs
    in_grids = page.page.eval_on_selector_all(
        "#answers tbody tr", "rows => rows.filter(r => !r.hidden).map(r => r.dataset.pair)")
    assert in_grids and all("numba" in p for p in in_grids), in_grids
    page.screenshot(tmp_path, "index-filtered.png")
    page.click("#reset")
    assert columns() == everything
    cells = len(json.loads(page.page.inner_text("#cells-data"))["cells"])
    assert page.text("#shown") == f"{cells} of {cells} cells shown"
    assert page.messages == []
