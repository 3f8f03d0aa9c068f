"""Tests for runner.tables: the Markdown tables rendered from the reports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.report import read_report, read_reports
from runner.tables import format_cmp, render_markdown, write_tables

DATA = Path(__file__).parent / "data"
REPORTS = DATA / "reports"
EXPECTED = DATA / "expected_tables.md"
REFERENCE = Path(__file__).parent.parent / "reports" / "reference" / "gate_residual_b200.json"
GOLDEN_INPUTS = ["docker-vllm-plain-cuda.json", "host-compile-cpu.json", "corrupt.json"]


def section(text: str, title: str) -> str:
    """The text of section ``## title`` up to the next ``## ``."""
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def rows(text: str) -> list[list[str]]:
    """The body rows of every github table in ``text``, cells stripped."""
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|-"):
            out.append([c.strip() for c in line.strip("|").split(" | ")])
    return out


@pytest.fixture(scope="module")
def rendered() -> str:
    reports = [*read_reports(REPORTS), read_report(REFERENCE)]
    return render_markdown(reports, relative_to=REPORTS)


@pytest.mark.parametrize(
    ("cmp", "expected"),
    [
        (None, "—"),
        ({"equal": True, "differ": 0, "numel": 5, "max_abs": 0.0}, "equal"),
        ({"equal": False, "differ": 46978, "numel": 48384, "max_abs": 32.0}, "46978/48384 (32, -)"),
        (
            {"equal": False, "differ": 3, "numel": 9, "max_abs": 0.375, "max_ulp": 2},
            "3/9 (0.375, 2)",
        ),
        (
            {
                "equal": False,
                "differ": 3,
                "numel": 9,
                "max_abs": "inf",
                "max_ulp": None,
                "nan_differ": 1,
            },
            "3/9 (inf, -, nan 1)",
        ),
        (
            {"equal": False, "differ": 1, "numel": 9, "max_abs": 1.5e-07, "max_ulp": 1},
            "1/9 (1.5e-07, 1)",
        ),
    ],
)
def test_format_cmp(cmp: dict | None, expected: str) -> None:
    assert format_cmp(cmp) == expected


def test_reference_rows(rendered: str) -> None:
    bitwise = rows(section(rendered, "Bitwise comparison"))
    label = "reference:gate_residual_b200 (NVIDIA B200)"
    ref = [r for r in bitwise if r[0] == label]
    assert ref == [
        [label, "—", "diffusers vs rl_kernel", "1", "equal", "equal", "equal", "equal"],
        [
            label,
            "—",
            "diffusers vs rl_kernel",
            "257",
            "equal",
            "equal",
            "equal",
            "35402/48384 (0.375, -)",
        ],
        [
            label,
            "—",
            "diffusers vs rl_kernel",
            "4097",
            "equal",
            "equal",
            "equal",
            "44538/48384 (4.5, -)",
        ],
        [
            label,
            "—",
            "diffusers vs rl_kernel",
            "32768",
            "equal",
            "equal",
            "equal",
            "46978/48384 (32, -)",
        ],
    ]
    assert "rl_kernel vs diffusers" not in rendered  # the mirror is shown once
    cells = {r[0]: r for r in rows(section(rendered, "Cells"))}
    assert cells[label][1:8] == [
        "foreign",
        "—",
        "—",
        "NVIDIA B200",
        "2.13.0+cu130",
        "3.12.14",
        "910d614a6269",
    ]
    assert label not in section(rendered, "Accuracy vs fp64 and repeatability")


def test_pairs_oriented_against_baseline_once(rendered: str) -> None:
    bitwise = rows(section(rendered, "Bitwise comparison"))
    pairs = {(r[0], r[2]) for r in bitwise if r[0].startswith("host-")}
    assert pairs == {
        ("host-plain-cuda", "numba vs eager"),
        ("host-compile-cpu", "numba vs eager"),
        ("host-compile-cpu", "fwdonly vs eager"),
    }
    fwd = [r for r in bitwise if r[2] == "fwdonly vs eager"]
    assert [r[3] for r in fwd] == ["257", "257-specials"]
    assert all(r[4:] == ["equal", "—", "—", "—"] for r in fwd)


def test_non_ok_cells_are_never_dropped(rendered: str) -> None:
    bitwise = {r[0]: r for r in rows(section(rendered, "Bitwise comparison"))}
    assert bitwise["docker-vllm-plain-cuda"][1:4] == ["error", "—", "—"]
    assert bitwise["docker-sglang-plain-cuda"][1:4] == ["skipped", "—", "—"]
    cells = {r[0]: r for r in rows(section(rendered, "Cells"))}
    assert cells["docker-vllm-plain-cuda"][2:4] == [
        "error",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    # A "|" in a reason is escaped so the table keeps its columns.
    assert cells["docker-sglang-plain-cuda"][2:4] == [
        "skipped",
        "no Docker engine answers \\| skipped by --backend host",
    ]


def test_accuracy_section(rendered: str) -> None:
    acc = rows(section(rendered, "Accuracy vs fp64 and repeatability"))
    by_key = {(r[0], r[1], r[2], r[3]): r[4:] for r in acc[1:]}
    assert by_key[("host-plain-cuda", "eager", "257", "gate")] == ["0.25", "2", "0.004", "NO"]
    assert by_key[("host-plain-cuda", "numba", "257", "gate")] == ["0", "0", "0", "yes"]
    assert ("host-compile-cpu", "fwdonly", "257", "gate") not in by_key
    assert not any(k[0].startswith("docker-") for k in by_key)


def test_unreadable_section(rendered: str) -> None:
    unreadable = {r[0]: r[1] for r in rows(section(rendered, "Unreadable files"))[1:]}
    assert set(unreadable) == {
        "corrupt.json",
        "truncated.json",
        "newer.json",
        "invalid-status.json",
    }
    assert unreadable["corrupt.json"].startswith("corrupt JSON: Expecting value at line 1")
    assert "refused" in unreadable["newer.json"]
    assert "bench/timing.json" not in rendered


def test_no_unreadable_section_when_all_read() -> None:
    text = render_markdown([read_report(REFERENCE)])
    assert "## Unreadable files" not in text
    assert "_No accuracy figures._" in text


def test_empty_reports() -> None:
    text = render_markdown([])
    assert "_No reports._" in text and "## Cells" in text


def test_golden_small_synthetic_case() -> None:
    text = render_markdown([read_report(REPORTS / n) for n in GOLDEN_INPUTS], relative_to=REPORTS)
    assert text == EXPECTED.read_text(encoding="utf-8")


def test_write_tables(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    (reports / "reference").mkdir(parents=True)
    shutil.copy(REFERENCE, reports / "reference" / REFERENCE.name)
    for name in ["host-plain-cuda.json", "corrupt.json"]:
        shutil.copy(REPORTS / name, reports / name)
    path = write_tables(reports)
    assert path == reports / "README.md"
    text = path.read_text(encoding="utf-8")
    assert "Generated by `nox -s report`" in text and "do not edit by hand" in text.lower()
    assert "| reference/gate_residual_b200.json" in text
    assert sorted(p.name for p in reports.iterdir()) == [
        "README.md",
        "corrupt.json",
        "host-plain-cuda.json",
        "reference",
    ]
    first = path.read_bytes()
    assert write_tables(reports).read_bytes() == first  # deterministic: no timestamps

    other = tmp_path / "elsewhere" / "TABLES.md"
    other.parent.mkdir()
    assert write_tables(reports, other) == other
    assert f"| {(reports / 'host-plain-cuda.json').as_posix()} " in other.read_text("utf-8")
