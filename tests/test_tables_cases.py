"""The tables with per-case dtypes (runner.tables.model.cases), rows per gate row and the verdicts.

Two real cells are run here (tiny, on the CPU, fresh seed): A with the problem bf16/int64 and
cases in bf16/int64, fp16/int32 and fp32/int64; B with the problem fp16/int32 and one case,
which is A's fp16/int32 case under another id. Old reports (without per-case dtypes) come from
tests/data; the verdict sentences also from hand-made reports.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import random
import secrets
from pathlib import Path

import pytest

from gate_residual_matrix.runner.cell.run import run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.errors import SelectionError
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports.store import (
    LoadedReport,
    read_report,
    read_reports,
    validate,
    write_report,
)
from gate_residual_matrix.runner.tables import (
    Filters,
    build_tables,
    load_cells,
    markdown,
    render_markdown,
)
from gate_residual_matrix.runner.tables.model.cases import base_case, case_dtypes, index_rows
from gate_residual_matrix.runner.tables.model.verdicts import describe_dtypes, verdict_table
from gate_residual_matrix.runner.tables.render.html import render_html
from gate_residual_matrix.runner.tables.render.summary import render_csv
from tests.committed_reports import REFERENCE
from tests.test_tables import rows as table_rows

DATA = Path(__file__).parent / "data"
H200 = DATA / "h200" / "host-plain-cuda.json"


def section(text: str, title: str) -> str:
    marker = f"\n## {title}\n" if f"\n## {title}\n" in text else f"\n### {title}\n"
    start = text.index(marker) + 1
    end = text.find("\n#", start + 1)
    return text[start:] if end < 0 else text[start:end]


def rows(text: str) -> list[list[str]]:
    """Body rows of the tables in ``text`` (a table too wide for a line is read from its
    records: :func:`tests.test_tables.rows`), header dropped."""
    return table_rows(text)[1:]


def tiny(seed: int, problem: tuple[str, str], cases: list[dict]):
    return parse_matrix({
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 32, "G": 4, "dtype": problem[0], "index_dtype": problem[1],
                    "seed": seed},
        "cases": cases, "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
        "accuracy_reference": "fp64", "repeats": 2, "timing": {"warmup": 0, "iters": 1},
        "modes": {"plain": {}, "other": {}}, "stacks": {"host": {"kind": "host"}},
        "targets": ["cpu"]})


@pytest.fixture(scope="module")
def two_cells(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """reports/ with cells A (host-plain-cpu) and B (host-other-cpu); and (seed, n)."""
    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(32)))
    print(f"seed={seed}")
    n = random.Random(seed).randrange(3, 200)
    out = tmp_path_factory.mktemp("reports")
    a = tiny(seed, ("bfloat16", "int64"), [
        {"n": n}, {"n": n, "dtype": "float16", "index_dtype": "int32"},
        {"n": n, "specials": True, "dtype": "float32"}])
    b = tiny(seed, ("float16", "int32"), [{"n": n}])
    for m, mode in ((a, "plain"), (b, "other")):
        write_report(run_cell(m, Cell("host", mode, "cpu"), m.cases, timings=False), out)
    return out, seed, n


def test_case_dtypes_from_inputs_id_or_problem(two_cells) -> None:
    reports, _, n = two_cells
    b, a = load_cells(read_reports(reports))  # file order: host-other-cpu first
    assert [case_dtypes(a, c) for c in a.cases] == [
        ("bfloat16", "int64"), ("float16", "int32"), ("float32", "int64")]
    assert case_dtypes(b, str(n)) == ("float16", "int32")
    assert base_case(f"{n}-specials-float32-int64") == f"{n}-specials"
    counts = a.data["inputs"][str(n)]["index_counts"]
    assert index_rows(a, str(n)) == (min(counts), max(counts))


def test_tables_show_each_case_in_its_dtype(two_cells) -> None:
    reports, seed, n = two_cells
    md = render_markdown(read_reports(reports))
    bitwise = {(r[0], r[3]): r[4] for r in rows(section(md, "Bitwise comparison per cell"))}
    assert bitwise == {("host-other-cpu", str(n)): "float16/int32",
                       ("host-plain-cpu", str(n)): "bfloat16/int64",
                       ("host-plain-cpu", f"{n}-float16-int32"): "float16/int32",
                       ("host-plain-cpu", f"{n}-specials-float32-int64"): "float32/int64"}
    cells = {r[0]: r[5] for r in rows(section(md, "Cells"))}
    assert cells == {"host-other-cpu": "float16", "host-plain-cpu": "bfloat16, float16, float32"}
    # Across cells: A's fp16/int32 case and B's case "n" are one problem and one case.
    fp16 = f"float16, D=32, G=4, index int32, seed {seed} (2 cells)"
    assert fp16 in section(md, "Identical bits across cells")
    label = next(p for p in ("P1", "P2", "P3")
                 if f"{p} = {fp16}" in section(md, "Identical bits across cells"))
    inputs = {(r[0], r[1]): r[2:] for r in rows(section(md, "Inputs"))}
    assert inputs[(label, str(n))] == ["agree", "all"]
    outputs = {(r[0], r[1], r[2]): r[3:7] for r in rows(section(md, "Outputs"))}
    assert outputs[(label, "numba", str(n))] == ["identical (2 cells)"] * 4


def test_dtype_filter_selects_cases(two_cells) -> None:
    reports, _, n = two_cells
    loaded = read_reports(reports)
    md = markdown(build_tables(loaded, filters=Filters(dtype=("float16",))))
    assert {r[4] for r in rows(section(md, "Bitwise comparison per cell"))} == {"float16/int32"}
    assert {r[3] for r in rows(section(md, "Accuracy vs fp64 and determinism"))} == {
        "float16/int32"}
    assert {r[2] for r in rows(section(md, "Verdicts"))} == {"fp16 × int32"}
    tables = build_tables(loaded, filters=Filters(dtype=("float32",)))
    assert [c.label for c in tables.cells] == ["host-plain-cpu"]  # B has no float32 case
    assert "Filtered by `--dtype float32`: 1 of 2 readable reports shown." in \
        tables.summary_line()
    found = list(csv.DictReader(io.StringIO(render_csv(tables))))
    assert {r["case"] for r in found} == {f"{n}-specials-float32-int64"}
    with pytest.raises(SelectionError, match=r'^--dtype: no report has dtype "float64"; '
                                             r"choose from bfloat16, float16, float32$"):
        build_tables(loaded, filters=Filters(dtype=("float64",)))
    # the short names the tables print select the same rows
    short = markdown(build_tables(loaded, filters=Filters(dtype=("fp16",))))
    assert short.replace("`--dtype fp16`", "`--dtype float16`") == md


def test_summary_rows_carry_the_case_dtypes_and_gate_rows(two_cells) -> None:
    reports, _, _ = two_cells
    tables = build_tables(read_reports(reports))
    found = list(csv.DictReader(io.StringIO(render_csv(tables))))
    a = json.loads((reports / "host-plain-cpu.json").read_text())
    for row in found:
        data = a if row["cell"] == "host-plain-cpu" else json.loads(
            (reports / "host-other-cpu.json").read_text())
        given = data["inputs"][row["case"]]
        assert (row["dtype"], row["index_dtype"]) == (given["dtype"], given["index_dtype"])
        counts = given["index_counts"]
        assert (int(row["index_rows_min"]), int(row["index_rows_max"])) == (min(counts),
                                                                         max(counts))
    assert {r["dtype"] for r in found if r["cell"] == "host-plain-cpu"} == {
        "bfloat16", "float16", "float32"}


def test_html_embeds_each_cells_case_dtypes(two_cells) -> None:
    reports, _, _ = two_cells
    page = render_html(build_tables(read_reports(reports)))
    facets = json.loads(page.split('id="cells-data">')[1].split("</script>")[0])["cells"]
    assert [f["dtype"] for f in facets] == [["float16"], ["bfloat16", "float16", "float32"]]


def test_old_reports_fall_back_to_the_problem_dtype(tmp_path: Path) -> None:
    data = json.loads(H200.read_text())
    assert all("dtype" not in given for given in data["inputs"].values())  # an old report
    data["problem"]["dtype"] = "float32"
    validate(data)
    path = tmp_path / "host-plain-cuda.json"
    path.write_text(json.dumps(data))
    md = render_markdown([read_report(path), read_report(REFERENCE)], tmp_path)
    bitwise = rows(section(md, "Bitwise comparison per cell"))
    assert {r[4] for r in bitwise if r[0] == "host-plain-cuda"} == {"float32/int64"}
    assert {r[4] for r in bitwise if r[0].startswith("reference:")} == {"—"}
    timings = {(r[1], r[2]): r for r in rows(section(md, "Timings"))}
    # 4 bytes per element now: twice the bf16 report's 1791 GB/s for the same time
    assert timings[("eager", "32768")][3:7] == ["float32/int64", "32768", "0.5901", "3582"]
    accuracy = {(r[1], r[2], r[4]): r for r in rows(section(md, "Accuracy vs fp64 and "
                                                                "determinism"))}
    assert accuracy[("numba", "32768", "gate")][8] == "3511–3754"
    assert accuracy[("numba", "32768", "out")][8] == "—"


def test_verdict_of_the_h200_report() -> None:
    md = render_markdown([read_report(H200), read_report(REFERENCE)])
    verdicts = {(r[0], r[3]): r[1:3] + r[4:] for r in rows(section(md, "Verdicts"))}
    assert verdicts[("host-plain-cuda", "numba vs eager")] == [
        "NVIDIA H200", "bf16 × int64",
        "out, grad_res, grad_y bitwise equal in all 5 cases; grad_gate differs in 4 of 5 cases "
        "(numba repeatable, eager not repeatable)"]
    assert verdicts[("reference:gate_residual_b200 (NVIDIA B200)", "diffusers vs rl_kernel")] \
        == ["NVIDIA B200", "—", "out, grad_res, grad_y bitwise equal in all 4 cases; grad_gate "
                                "differs in 3 of 4 cases"]
    assert md.index("## Verdicts") < md.index("## Bitwise comparison per cell")


def cmp(differ: int, numel: int = 8, nan: int = 0, payload: int = 0) -> dict:
    return {"equal": differ == 0, "differ": differ, "numel": numel,
            "max_abs": 0.0 if differ == nan else 0.5, "max_ulp": None if differ == nan else 2,
            "nan_differ": nan, "nan_payload_differ": payload, "first_differ": 0 if differ else None}


def synthetic(cases: dict[str, dict], repeatable: dict[str, dict[str, dict]]) -> LoadedReport:
    """A report of one cell, numba vs eager, with these CMPs (tensor -> CMP per case)."""
    data = json.loads(H200.read_text())
    data = copy.deepcopy(data)
    data["cases"] = [int(c) if c.isdigit() else c for c in cases]
    # D = 8 and one gate row: gate's numel is 8, the others' N x 8 with N from the case id
    # (validate checks N x D and G x D)
    data["problem"].update(D=8, G=1)
    one_row = {k: v for k, v in data["inputs"]["257"].items() if k != "index_counts"}
    rows = {c: int(c.split("-")[0]) for c in cases}
    data["inputs"] = {c: {**one_row, "n": rows[c], "specials": "specials" in c} for c in cases}
    for impl in ("numba", "eager"):
        entry = data["results"][impl]
        for key in ("sha256", "accuracy", "timings", "mutated_inputs"):
            entry.pop(key, None)
        entry["repeatable"] = repeatable[impl]
    sized = {c: {k: v if k == "gate" else {**v, "numel": rows[c] * 8} for k, v in t.items()}
             for c, t in cases.items()}
    layout = {c: {"out": [t["out"]], **({"grads": {k: v for k, v in t.items() if k != "out"}}
                                        if len(t) > 1 else {})} for c, t in sized.items()}
    data["results"]["numba"]["vs eager"] = layout
    data["results"]["eager"]["vs numba"] = layout
    del data["results"]["fp64"]
    validate(data)
    return LoadedReport(Path("host-plain-cuda.json"), data, "ours")


def verdict_of(report: LoadedReport) -> str:
    return verdict_table(load_cells([report])).rows[0].values[-1]


def test_verdict_sentences_name_counts_nan_payloads_and_repeatability(fresh_seed: int) -> None:
    rng = random.Random(fresh_seed)
    total = rng.randrange(3, 8)
    failing = rng.randrange(1, total)  # eager's grad_gate not repeatable in these cases
    ids = [str(2 * i + 1) for i in range(total - 1)] + ["7-specials"]
    cases = {c: {"out": cmp(0), "res": cmp(0), "y": cmp(0), "gate": cmp(5)} for c in ids}
    cases["7-specials"]["y"] = cmp(3, nan=3, payload=3)  # NaN payloads only
    reps = {impl: {c: {t: True for t in ("out", "res", "y", "gate")} for c in ids}
            for impl in ("numba", "eager")}
    for c in ids[:failing]:
        reps["eager"][c]["gate"] = False
    got = verdict_of(synthetic(cases, reps))
    assert got == (f"out, grad_res bitwise equal in all {total} cases; grad_y bitwise equal in "
                   f"{total - 1} of {total} cases, NaN payloads apart in 7-specials; grad_gate "
                   f"differs in all {total} cases (numba repeatable, eager not repeatable in "
                   f"{failing} of {total})")
    reps["eager"] = {c: {t: True for t in ("out", "res", "y", "gate")} for c in ids}
    cases[ids[0]]["gate"] = cmp(0)
    assert verdict_of(synthetic(cases, reps)).endswith(
        f"grad_gate differs in {total - 1} of {total} cases (both repeatable)")
    # a case whose only differences are NaN payloads is named apart from the real ones
    cases["7-specials"]["gate"] = cmp(3, nan=3, payload=3)
    assert verdict_of(synthetic(cases, reps)).endswith(
        f"grad_gate differs in {total - 2} of {total} cases (both repeatable), and in NaN "
        "payloads only in 7-specials")


def test_verdict_of_a_forward_only_pair() -> None:
    cases = {"5": {"out": cmp(0)}, "9": {"out": cmp(2)}}
    reps = {impl: {c: {"out": True} for c in cases} for impl in ("numba", "eager")}
    assert verdict_of(synthetic(cases, reps)) == (
        "out differs in 1 of 2 cases (both repeatable); no grad_res, grad_y, grad_gate "
        "(no backward)")


@pytest.mark.parametrize(("pairs", "expected"), [
    ([("bfloat16", "int64")], "bf16 × int64"),
    ([(d, i) for d in ("bfloat16", "float16", "float32") for i in ("int64", "int32")],
     "bf16, fp16, fp32 × int64, int32"),
    ([("bfloat16", "int64"), ("float16", "int32")], "bf16/int64, fp16/int32"),
    ([(None, None)], "—"),
])
def test_describe_dtypes(pairs: list, expected: str) -> None:
    assert describe_dtypes(pairs) == expected


def test_a_failed_cell_says_so_at_the_top(tmp_path) -> None:
    """A cell whose status is not ok must not read as a clean verdict."""
    data = json.loads(H200.read_text())
    data["status"], data["reason"] = "oom", "cell killed: out of memory\nsecond line"
    path = tmp_path / "host-plain-cuda.json"
    path.write_text(json.dumps(data))
    md = render_markdown([read_report(path)], tmp_path)
    verdicts = {(r[0], r[3]): r[4] for r in rows(section(md, "Verdicts"))}
    assert verdicts[("host-plain-cuda", "numba vs eager")].startswith(
        "**cell oom**: cell killed: out of memory; out, grad_res, grad_y bitwise equal")
