"""Tests for runner.tables: the Markdown tables, golden files, filters, A/B and the outputs.

Golden files live in tests/data/tables/expected/; regenerate them after an intended change
with ``UPDATE_GOLDEN=1 pytest tests/test_tables.py`` and read the diff.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.errors import SelectionError
from gate_residual_matrix.runner.reports.store import LoadedReport, read_report, read_reports
from gate_residual_matrix.runner.tables import (
    FORMATS,
    OUTPUTS,
    Filters,
    build_tables,
    format_cmp,
    load_cells,
    markdown,
    render_markdown,
    slug,
    write_tables,
)
from gate_residual_matrix.runner.tables.model.summary_rows import COLUMNS
from tests.committed_reports import REFERENCE

DATA = Path(__file__).parent / "data"
REPORTS = DATA / "reports"
TABLES = DATA / "tables"
H200 = DATA / "h200" / "host-plain-cuda.json"
REF = "reference:gate_residual_b200 (NVIDIA B200)"
HEAD = "0123456789abcdef"  # the "current commit" of the golden files: every report is stale


def section(text: str, title: str) -> str:
    """The text under heading ``title`` (any level) up to the next heading of any level."""
    for level in ("## ", "### "):
        marker = f"\n{level}{title}\n"
        if marker in text:
            start = text.index(marker) + 1
            end = text.find("\n#", start + 1)
            return text[start:] if end < 0 else text[start:end]
    raise AssertionError(f"no section {title!r}")


_RECORD_KEY = re.compile(r"(?:^- | · )\*\*([^*]*)\*\*: ")


def rows(text: str) -> list[list[str]]:
    """The body rows of every github table in ``text``, cells stripped (header rows too); a
    table too wide for a line is a list of records (``- **h**: v · **h**: v``, wrapped), read
    back as a header row and its rows."""
    out: list[list[str]] = []
    records: list[str] = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|-"):
            out.append([c.strip() for c in line.strip("|").split(" | ")])
        elif line.startswith("- **"):
            records.append(line)
        elif records and line.startswith("  "):
            records[-1] += " " + line.strip()
    for n, record in enumerate(records):
        parts = _RECORD_KEY.split(record)
        if n == 0:
            out.append(parts[1::2])
        out.append([v.strip() for v in parts[2::2]])
    return out


def keyed(text: str, width: int = 1) -> dict[tuple[str, ...], list[str]]:
    """Table rows by their first ``width`` values (header row dropped)."""
    return {tuple(r[:width]): r[width:] for r in rows(text)[1:]}


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/tables/reports plus the reference report, rendered by write_tables."""
    reports = tmp_path_factory.mktemp("golden") / "reports"
    shutil.copytree(TABLES / "reports", reports)
    (reports / "reference").mkdir()
    shutil.copy(REFERENCE, reports / "reference" / REFERENCE.name)
    (reports / "corrupt.json").write_text('{"schema_version": 1, "kind": x}\n')
    write_tables(reports, head=HEAD)
    return reports


@pytest.fixture(scope="module")
def md(golden: Path) -> str:
    """Every table of the golden reports in one Markdown document (README.md shows the
    headline; the per-cell tables are on the cell pages)."""
    reports = [r for r in read_reports(golden) if r.path.name != "summary.json"]
    return markdown(build_tables(reports, relative_to=golden, bench_dir=golden / "bench",
                                 head=HEAD))


@pytest.mark.parametrize("name", ["README.md", "summary.csv", "cells/README.md"])
def test_golden(golden: Path, name: str) -> None:
    expected = TABLES / "expected" / name.replace("/", "-")
    text = (golden / name).read_text(encoding="utf-8")
    if os.environ.get("UPDATE_GOLDEN"):
        expected.write_text(text, encoding="utf-8")
    assert text == expected.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("cmp", "expected"),
    [
        (None, "—"),
        ({"equal": True, "differ": 0, "numel": 5, "max_abs": 0.0}, "equal"),
        ({"equal": False, "differ": 46978, "numel": 48384, "max_abs": 32.0}, "46978/48384 (32, -)"),
        ({"equal": False, "differ": 3, "numel": 9, "max_abs": 0.375, "max_ulp": 2},
         "3/9 (0.375, 2)"),
        ({"equal": False, "differ": 3, "numel": 9, "max_abs": "inf", "max_ulp": None,
          "nan_differ": 1}, "3/9 (inf, -, nan 1)"),
    ],
)
def test_format_cmp(cmp: dict | None, expected: str) -> None:
    assert format_cmp(cmp) == expected


def test_reference_report_is_read_and_marked_foreign(md: str) -> None:
    bitwise = [r for r in rows(section(md, "Bitwise comparison per cell")) if r[0] == REF]
    eq = ["equal"] * 3
    assert [r[2:] for r in bitwise] == [
        ["diffusers vs rl_kernel", "1", "—", *eq, "equal", "—", "—"],
        ["diffusers vs rl_kernel", "257", "—", *eq, "35402/48384", "gate 0.375", "gate -"],
        ["diffusers vs rl_kernel", "4097", "—", *eq, "44538/48384", "gate 4.5", "gate -"],
        ["diffusers vs rl_kernel", "32768", "—", *eq, "46978/48384", "gate 32", "gate -"],
    ]
    assert "rl_kernel vs diffusers" not in md  # the mirror is shown once
    cells = keyed(section(md, "Cells"))
    assert cells[(REF,)][:6] == ["foreign", "—", "plain", "cuda", "—", "—"]
    assert cells[(REF,)][7:] == ["—", "910d614a6269", "reference/gate_residual_b200.json"]
    env = keyed(section(md, "Environment"))
    assert env[(REF,)][:7] == ["—", "NVIDIA B200", "10.0", "—", "13.0", "3.12.14", "2.13.0+cu130"]
    assert env[(REF,)][7:10] == ["3.7.1", "0.30.0", "0.5.21"]  # triton, vllm, sglang
    assert f"{REF} (foreign report: the reference layout has no sha256)" in md
    assert REF not in section(md, "Accuracy vs fp64 and determinism")


def test_non_ok_cells_are_never_dropped(md: str) -> None:
    bitwise = keyed(section(md, "Bitwise comparison per cell"))
    assert bitwise[("docker-vllm-plain-cuda",)][:3] == ["error", "—", "—"]
    assert bitwise[("docker-sglang-plain-cuda",)][:3] == ["skipped", "—", "—"]
    cells = keyed(section(md, "Cells"))
    assert cells[("docker-vllm-plain-cuda",)][5:7] == [
        "error", "RuntimeError: CUDA error: an illegal memory access was encountered"]
    # A "|" in a reason is escaped so the table keeps its columns.
    assert cells[("docker-sglang-plain-cuda",)][5:7] == [
        "skipped", "no Docker engine answers \\| skipped by --backend host"]
    env = keyed(section(md, "Environment"))
    assert env[("docker-vllm-plain-cuda",)][0] == "error"
    for title in ("Outputs", "Accuracy vs fp64 and determinism", "Timings"):
        assert "docker-vllm-plain-cuda" in section(md, title), title
        assert "docker-sglang-plain-cuda" in section(md, title), title


def test_unavailable_implementation_is_listed(md: str) -> None:
    impls = keyed(section(md, "Implementations that did not run"), 2)
    assert impls == {("docker-torch213-plain-cuda", "sglang"): [
        "unavailable", "sglang is not installed in this stack"]}


def test_across_cells_groups_by_sha256_and_voids_differing_inputs(md: str) -> None:
    inputs = keyed(section(md, "Inputs"), 2)
    assert inputs[("P1", "1")] == [
        "void: inputs differ",
        "A (1): docker-torch213-plain-cuda · B (1): host-plain-cuda"]
    assert inputs[("P1", "257")] == ["agree", "all"]
    out = keyed(section(md, "Outputs"), 3)
    # host-compile-cpu's eager is torch.compile: other bits; torch 2.13 moved grad_gate.
    assert out[("P1", "eager", "257")] == [
        "2 variants (3 cells)", "2 variants (3 cells)", "2 variants (3 cells)",
        "3 variants (3 cells)",
        "out, res, y: A (2): docker-torch213-plain-cuda, host-plain-cuda · B (1): "
        "host-compile-cpu / gate: A (1): docker-torch213-plain-cuda · B (1): host-compile-cpu "
        "· C (1): host-plain-cuda"]
    assert out[("P1", "numba", "257")] == ["identical (3 cells)"] * 4 + ["—"]
    assert out[("P1", "numba", "1")][:4] == ["void: inputs differ"] * 4
    assert out[("P1", "fwdonly", "257")] == ["1 cell only", "—", "—", "—", "—"]
    assert "P1 = bfloat16, D=8, G=3, index int64, seed 20261129 (3 cells)" in md


def test_default_ab_is_the_first_pair_with_results_differing_in_one_facet(md: str) -> None:
    # docker-torch213-plain-cuda and host-compile-cpu (the first two with results) differ in
    # stack, mode and target at once; with host-plain-cuda only the stack differs
    assert "## A/B: docker-torch213-plain-cuda vs host-plain-cuda" in md
    config = keyed(section(md, "A/B: docker-torch213-plain-cuda vs host-plain-cuda"))
    assert config[("stack",)] == ["docker-torch213", "host"]
    assert config[("torch",)] == ["2.13.0+cu130", "2.11.0+cu130"]
    assert ("mode",) not in config and ("target",) not in config and ("python",) not in config
    bits = keyed(section(md, "Bits and accuracy"), 4)
    bf16 = "bfloat16/int64"
    assert bits[("eager", "257", bf16, "gate")] == ["CHANGED", "0.5", "0.25", "4", "2", "NO",
                                                   "NO"]
    assert bits[("eager", "257", bf16, "out")][0] == "same"
    assert bits[("numba", "257", bf16, "gate")][0] == "same"
    assert bits[("numba", "1", bf16, "out")][0] == "void: inputs differ"
    assert "Bits: 7 tensors the same, 1 changed" in md


def test_default_ab_needs_two_cells_with_results() -> None:
    """A skipped or failed cell has nothing to compare: with one cell of results, no A/B."""
    reports = [read_report(TABLES / "reports" / f"{name}.json")
               for name in ("docker-sglang-plain-cuda", "docker-vllm-plain-cuda",
                            "host-plain-cuda")]
    assert [s.key for s in build_tables(reports).sections if s.key.startswith("ab")] == []


def test_ab_names_what_only_one_side_has() -> None:
    reports = [*read_reports(TABLES / "reports")]
    md = markdown(build_tables(reports, ab=[("docker-torch213-plain-cuda", "host-compile-cpu")]))
    assert "(1 only in A; 257-specials only in B; fp64, sglang only in A; fwdonly only in B)" in md
    assert "chosen with `--ab`" in md


def test_ab_from_the_command_line(golden: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # exit 3: the golden directory holds unreadable files on purpose; the tables are written
    assert main(["report", "--reports", str(golden), "--out", str(out),
                 "--ab", "host-plain-cuda", "docker-torch213-plain-cuda",
                 "--ab", "host-plain-cuda", "gate_residual_b200"]) == 3
    assert "[ab.md](ab.md)" in (out / "README.md").read_text(encoding="utf-8")
    text = (out / "ab.md").read_text(encoding="utf-8")
    assert "## A/B: host-plain-cuda vs docker-torch213-plain-cuda" in text
    assert f"## A/B: host-plain-cuda vs {REF}" in text
    assert "## A/B: docker-torch213-plain-cuda vs host-compile-cpu" not in text
    bits = keyed(section(text, "Bits and accuracy"), 4)
    assert bits[("eager", "257", "bfloat16/int64", "gate")][0] == "CHANGED"
    assert bits[("eager", "1", "bfloat16/int64", "gate")][0] == "void: inputs differ"
    times = keyed(section(text, "Time (median ms)"), 3)
    assert times[("eager", "257", "bfloat16/int64")] == ["0.01", "0.02", "2.00x", "0.03", "0.09",
                                                         "3.00x"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, "ab.md", "cells",
                                                            "plots"])


def test_accuracy_and_determinism(md: str) -> None:
    acc = keyed(section(md, "Accuracy vs fp64 and determinism"), 5)
    bf16 = "bfloat16/int64"
    # rows per gate row: the fewest and most of inputs["257"].index_counts, on grad_gate only
    assert acc[("host-plain-cuda", "eager", "257", bf16, "gate")] == [
        "0.25", "0.25", "2", "37–120", "NO", "—", "—"]
    assert acc[("host-plain-cuda", "eager", "257", bf16, "out")][3] == "—"
    assert acc[("docker-torch213-plain-cuda", "eager", "257", bf16, "gate")] == [
        "0.5", "0.5", "4", "85–86", "NO", "NO",
        "NO (sub_batches, size_sweep; first failing size 9)"]
    assert acc[("docker-torch213-plain-cuda", "numba", "1", bf16, "gate")][4:] == [
        "yes", "yes", "yes"]
    assert ("host-compile-cpu", "fwdonly", "257", bf16, "gate") not in acc
    assert acc[("host-compile-cpu", "fwdonly", "257", bf16, "out")][:3] == [
        "0.0078125", "0.0078125", "0.5"]


def test_timings_and_bandwidth() -> None:
    text = render_markdown([read_report(H200)])
    t = keyed(section(text, "Timings"), 3)
    # eager forward N=32768, D=5376, bf16: 3*N*D*2 B / 0.5901 ms.
    assert t[("host-plain-cuda", "eager", "32768")] == ["bfloat16/int64", "32768", "0.5901",
                                                        "1791", "2.58", "819"]
    assert t[("host-plain-cuda", "numba", "1")][2:4] == ["0.8404", "0.0384"]
    assert "3·N·D·s" in section(text, "Timings") and "2·G·D·s" in section(text, "Timings")
    bits = keyed(section(text, "Bitwise comparison per cell"), 4)
    # the distance between the pair, named as such; not an error against fp64
    assert bits[("host-plain-cuda", "ok", "numba vs eager", "257")][4:] == [
        "35095/48384", "gate 0.375", "gate 31258"]
    assert rows(section(text, "Bitwise comparison per cell"))[0][-2:] == ["max abs(a−b)",
                                                                         "max ULP apart"]


def test_timings_on_shared_cores_are_flagged(tmp_path: Path) -> None:
    """A cell whose load average exceeded its CPUs is named under the timings, with both
    figures; one within its CPUs, and one without the fields (older reports), is not."""
    data = json.loads(H200.read_text())
    paths = []
    for name, cpus, load in (("busy", 2, {"start": 0.4, "end": 2.73}),
                             ("quiet", 16, {"start": 1.0, "end": 0.5}), ("old", None, None)):
        report = json.loads(json.dumps(data))
        report["cell"]["id"] = f"host-{name}-cuda"
        report["cell"]["mode"] = name
        if cpus:
            report["environment"].update(cpus_available=cpus, load_average=load)
        paths.append(tmp_path / f"host-{name}-cuda.json")
        paths[-1].write_text(json.dumps(report))
    timings = section(render_markdown([read_report(p) for p in paths]), "Timings")
    assert ("Timed on shared cores (1-minute load average above the CPUs the cell could "
            "use), so their times are not comparable: host-busy-cuda (load 2.73 on 2 CPUs)."
            in timings)
    assert "host-quiet-cuda (" not in timings and "host-old-cuda (" not in timings


def test_bench_json_is_shown_and_bad_bench_files_listed(md: str) -> None:
    bench = rows(section(md, "Forward, N=32768, bf16 (synthetic)"))
    assert bench == [["impl", "ms", "GB/s", "of copy", "note"],
                     ["eager", "0.61", "1733", "0.41", "—"],
                     ["numba", "0.298", "3547", "0.84", "2D grid"]]
    unreadable = keyed(section(md, "Unreadable files"))
    assert unreadable[("bench/broken.json",)] == [  # report text is escaped Markdown
        'not a benchmark: expected {"rows": \\[{...}, ...\\]}']
    assert unreadable[("corrupt.json",)][0].startswith("corrupt JSON: Expecting value")
    assert ("summary.json",) not in unreadable  # our own output is not read as a report


def test_filters_select_cells_and_implementations() -> None:
    reports = [*read_reports(TABLES / "reports"), read_report(REFERENCE)]
    t = build_tables(reports, filters=Filters(stack=("host",), impl=("numba",)))
    assert [c.label for c in t.cells] == ["host-compile-cpu", "host-plain-cuda"]
    text = render_markdown(reports, filters=Filters(stack=("host",), impl=("numba",)))
    assert "Filtered by `--stack host --impl numba`: 2 of 6 readable reports shown." in text
    pairs = {r[2] for r in rows(section(text, "Bitwise comparison per cell"))[1:]}
    assert pairs == {"numba vs eager"}  # fwdonly vs eager dropped: neither side is numba
    assert {r[1] for r in rows(section(text, "Accuracy vs fp64 and determinism"))[1:]} == {
        "numba"}
    assert REF not in text
    by_mode = render_markdown(reports, filters=Filters(mode=("plain",), target=("cuda",)))
    assert REF in by_mode and "host-compile-cpu" not in by_mode


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (Filters(stack=("hots",)), '--stack: no report has stack "hots"; choose from '
                                   "docker-sglang, docker-torch213, docker-vllm, host"),
        (Filters(dtype=("float8",)), '--dtype: no report has dtype "float8"; choose from '
                                     "bfloat16"),
        (Filters(impl=("triton",)), '--impl: no report has impl "triton"; choose from'),
    ],
)
def test_unknown_filter_values_are_errors(filters: Filters, message: str) -> None:
    reports = [*read_reports(TABLES / "reports"), read_report(REFERENCE)]
    with pytest.raises(SelectionError) as info:
        build_tables(reports, filters=filters)
    assert str(info.value).startswith(message)


def test_cli_filter_error_exit_code_and_nothing_written(golden: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    assert main(["report", "--reports", str(golden), "--out", str(tmp_path / "o"),
                 "--stack", "nope"]) == 2
    assert 'no report has stack "nope"' in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["report", "--reports", str(golden), "--out", str(tmp_path / "o"),
                 "--ab", "host-plain-cuda", "nope"]) == 2


def test_summary_csv_and_json(golden: Path) -> None:
    table = list(csv.DictReader(io.StringIO((golden / "summary.csv").read_text("utf-8"))))
    assert tuple(table[0]) == COLUMNS
    row = next(r for r in table if r["cell"] == "docker-torch213-plain-cuda"
               and r["impl"] == "eager" and r["case"] == "257" and r["tensor"] == "gate")
    assert row["vs"] == "numba" and row["equal"] == "true" and row["repeatable"] == "false"
    assert row["max_abs_ulps"] == "4.0" and row["forward_ms"] == "0.02"
    skipped = [r for r in table if r["cell"] == "docker-sglang-plain-cuda"]
    assert len(skipped) == 1 and skipped[0]["status"] == "skipped" and skipped[0]["impl"] == ""
    ref = [r for r in table if r["cell"] == REF]
    assert {r["vs"] for r in ref} == {"rl_kernel", "diffusers"} and ref[0]["origin"] == "foreign"
    doc = json.loads((golden / "summary.json").read_text("utf-8"))
    assert doc["schema"] == "gate_residual_tables/2"
    assert len(doc["rows"]) == len(table)
    assert doc["rows"][0] == {k: doc["rows"][0][k] for k in COLUMNS}
    outputs = doc["across"]["outputs"]
    gate = next(o for o in outputs if (o["impl"], o["case"], o["tensor"]) == ("eager", "257",
                                                                              "gate"))
    assert [g["cells"] for g in gate["groups"]] == [["docker-torch213-plain-cuda"],
                                                    ["host-compile-cpu"], ["host-plain-cuda"]]
    assert {u["file"] for u in doc["unreadable"]} == {"corrupt.json", "bench/broken.json"}


def test_write_tables_is_deterministic_and_atomic(golden: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(golden, reports)

    def outputs() -> dict[str, bytes]:
        return {p.relative_to(reports).as_posix(): p.read_bytes() for p in reports.rglob("*")
                if (p.is_file() and p.suffix != ".json") or p.name == "summary.json"}

    first = outputs()
    assert "cells/host-plain-cuda.md" in first and "plots/bits-differ.svg" in first
    assert write_tables(reports, head=HEAD) == reports / "README.md"
    assert outputs() == first  # no timestamps, no random ids in the SVG
    assert not [p for p in reports.rglob(".*")]  # no temp files left
    (reports / "cells" / "gone-plain-cpu.md").write_text("an old page")
    write_tables(reports, head=HEAD)
    assert not (reports / "cells" / "gone-plain-cpu.md").exists()  # pages of gone cells


def test_write_tables_elsewhere(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    shutil.copytree(TABLES / "reports", reports)
    other = tmp_path / "elsewhere" / "TABLES.md"
    assert write_tables(reports, other) == other
    index = (other.parent / "cells" / "README.md").read_text("utf-8")
    assert (reports / 'host-plain-cuda.json').as_posix() in index
    assert sorted(p.name for p in other.parent.iterdir()) == sorted(
        ["TABLES.md", *OUTPUTS[1:], "ab.md", "cells", "plots"])
    assert not (reports / "README.md").exists()


def test_write_tables_writes_the_formats_named(golden: Path, tmp_path: Path) -> None:
    """Formats are chosen by name; each writes the files of the full run, byte for byte, and
    leaves the other formats' files alone."""
    reports = tmp_path / "reports"
    shutil.copytree(TABLES / "reports", reports)
    (reports / "reference").mkdir()
    shutil.copy(REFERENCE, reports / "reference" / REFERENCE.name)
    (reports / "corrupt.json").write_text('{"schema_version": 1, "kind": x}\n')
    assert list(FORMATS) == ["markdown", "html", "csv", "json", "plots"]
    write_tables(reports, head=HEAD, formats=["csv", "html"])
    made = sorted(p.relative_to(reports).as_posix() for p in reports.rglob("*")
                  if p.is_file() and p.suffix in (".csv", ".html", ".md", ".svg"))
    assert made == ["index.html", "summary.csv"]
    for name in made:
        assert (reports / name).read_bytes() == (golden / name).read_bytes(), name
    with pytest.raises(SelectionError, match="'pdf': expected one of markdown, html, csv"):
        write_tables(reports, head=HEAD, formats=["pdf"])


def test_empty_and_unreadable_only() -> None:
    text = render_markdown([])
    assert "_No reports._" in text and "## Cells" in text and "## A/B" not in text
    text = render_markdown([read_report(REPORTS / "corrupt.json")], relative_to=REPORTS)
    assert "0 cell reports: 0 ours; 1 unreadable file." in text
    assert keyed(section(text, "Unreadable files"))[("corrupt.json",)]


def test_image_tag_and_digest_are_read_from_the_report() -> None:
    loaded = read_report(TABLES / "reports" / "host-plain-cuda.json")
    image = {"tag": "gate-residual-matrix:t213-3f2a", "id": "sha256:" + "ab" * 32,
             "digest": None, "base_image": "local/bookworm:1", "pins": {"torch": "2.13.0"}}
    text = render_markdown([LoadedReport(loaded.path, {**loaded.data, "image": image}, "ours")])
    env = keyed(section(text, "Environment"))
    assert env[("host-plain-cuda",)][-2:] == ["gate-residual-matrix:t213-3f2a",
                                              "sha256:abababababab"]


def test_slug_matches_github_anchors() -> None:
    assert slug("A/B: host-plain-cuda vs docker-x") == "ab-host-plain-cuda-vs-docker-x"
    assert slug("Accuracy vs fp64 and determinism") == "accuracy-vs-fp64-and-determinism"


def test_cells_keep_order_ours_then_foreign() -> None:
    cells = load_cells([read_report(REFERENCE), *read_reports(TABLES / "reports")])
    assert [c.label for c in cells][-1] == REF
    assert [c.index for c in cells] == list(range(len(cells)))


def test_filters_take_what_people_type() -> None:
    """``--gpu H200`` selects "NVIDIA H200"; a value equal to one present selects it alone."""
    reports = [*read_reports(TABLES / "reports"), read_report(REFERENCE)]
    t = build_tables(reports, filters=Filters(gpu=("h200",)))
    assert {c.gpu for c in t.cells} == {"NVIDIA H200"} and t.filters.gpu == ("NVIDIA H200",)
    assert "Filtered by `--gpu NVIDIA H200`" in t.summary_line()
    assert {c.label for c in build_tables(reports, filters=Filters(stack=("DOCKER",))).cells} == {
        "docker-sglang-plain-cuda", "docker-torch213-plain-cuda", "docker-vllm-plain-cuda"}
    assert [c.label for c in build_tables(reports, filters=Filters(stack=("host",))).cells] == [
        "host-compile-cpu", "host-plain-cuda"]  # "host" whole, not every stack holding it
    with pytest.raises(SelectionError, match='--gpu: no report has gpu "a100"'):
        build_tables(reports, filters=Filters(gpu=("a100",)))
