"""Issue 16: hostile input finds no traceback, no hang and no silently wrong row.

Each test builds its bad input here (a report broken in one way, a matrix with one size too
big, a report string made to break a renderer) and checks the one-line outcome that
docs/reliability.md lists for its class:

1. report files: validated completely and for consistency; a bad file is flagged with one
   line and left out, the tables are written from the rest (ours and foreign reports);
3. sizes: refused at validation with exit 2 and one line naming the key;
4. validation gaps: the key named is the right one;
5. escaping: HTML data block, Markdown cells, CSV formula prefixes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gate_residual_matrix.runner.backends import local
from gate_residual_matrix.runner.reports import json_file as report_json
from gate_residual_matrix.runner.reports import store as report_mod
from gate_residual_matrix.runner.reports.store import read_report, read_reports
from tests.committed_reports import REFERENCE, committed_reports

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
GOOD = DATA / "reports" / "host-plain-cuda.json"


def _good() -> dict[str, Any]:
    return json.loads(GOOD.read_text(encoding="utf-8"))


def _reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


def _cmp(doc: dict[str, Any], impl: str = "numba", other: str = "eager", case: str = "257",
         tensor: str = "gate") -> dict[str, Any]:
    by_case = doc["results"][impl][f"vs {other}"][case]
    return by_case["out"][0] if tensor == "out" else by_case["grads"][tensor]


def _report_cli(reports: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "report",
                           "--reports", str(reports)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


# --------------------------------------------------------------------------- class 1: reports

def _set_vs(key: str, value: Any):
    def change(doc: dict[str, Any]) -> None:
        doc["results"]["numba"][key] = value
    return change


def _set_cmp(**values: Any):
    def change(doc: dict[str, Any]) -> None:
        _cmp(doc).update(values)
    return change


BROKEN_OURS = {
    # any key starting with "vs " is a comparison map, whatever follows
    "vs key with a list": (_set_vs("vs eager!", []), "'vs eager!' does not match"),
    "vs key with a mapping of lists": (_set_vs("vs e ager", {"257": {"out": {"a": []}}}),
                                       "does not match"),
    "vs key strings for numbers": (
        _set_vs("vs eager2", {"257": {"out": [{"equal": "yes", "differ": -5, "numel": -1,
                                               "max_abs": "lots"}]}}),
        'results.numba["vs eager2"]'),
    # counts against each other (the test report: D = 8, G = 3, every comparison equal)
    "equal with differ > 0": (_set_cmp(differ=3), "equal is True but differ is 3"),
    "differ > numel": (_set_cmp(equal=False, differ=100, max_abs=1.0),
                       "differ 100 exceeds numel 24"),
    "nan_differ > differ": (_set_cmp(equal=False, differ=2, nan_differ=5, max_abs=1.0),
                            "nan_differ 5 exceeds differ 2"),
    "numel not G x D": (_set_cmp(numel=5), "numel is 5, not G x D = 24"),
    "equal bits with max_abs": (_set_cmp(max_abs=1.0), "equal bits but max_abs is 1.0"),
    # Python's re.search lets "$" match before a final newline (jsonschema's pattern check)
    "cell id with a trailing newline": (lambda d: d["cell"].update(id="host-plain-cuda\n"),
                                        "cell.id: expected a name matching"),
    # the last gaps of the hostile-input review: the cell id names its stack, mode and target
    "cell id of another cell": (lambda d: d["cell"].update(id="host-plain-cpu"),
                                'cell.id: expected <stack>-<mode>-<target> = '
                                '"host-plain-cuda", got "host-plain-cpu"'),
    # numel against N x D with N from the case id, with or without the case's inputs
    "numel not N x D, no inputs": (
        lambda d: (d["inputs"].pop("257"), _cmp(d, tensor="out").update(numel=5)),
        'results.numba["vs eager"]["257"].out[0]: numel is 5, not N x D = 2056'),
    "n, counts and numel of another N": (
        lambda d: _resize_case(d, "257", 256),
        'inputs["257"].n: the case id says N = 257, the inputs say n = 256'),
    "specials not as the case id says": (
        lambda d: d["inputs"]["257"].update(specials=True),
        'inputs["257"].specials: the case id says False, the inputs say True'),
    # the third hostile run (2026-12-01): text that would be copied into every summary row,
    # and case ids repeated (named, where jsonschema's message was cut before saying why)
    "reason of a megabyte": (lambda d: d.update(reason="x" * (1 << 20)),
                             "reason: 'xxxx"),
    "case id listed twice": (lambda d: d["cases"].append(d["cases"][1]),
                             'cases: each case id once, got "257" again'),
    # the two directions of one pair
    "directions disagree": (
        lambda d: _cmp(d, "eager", "numba").update(equal=False, differ=2, max_abs=0.5),
        'results.eager["vs numba"]["257"].grads.gate: equal is False but '
        'results.numba["vs eager"]["257"].grads.gate says True'),
}


def _resize_case(doc: dict[str, Any], case: str, n: int) -> None:
    """Case ``case`` made consistent for N = ``n`` everywhere but in its id: inputs' n and
    index_counts, and every N x D numel (the old check read N from inputs[case].n alone)."""
    g, d = doc["problem"]["G"], doc["problem"]["D"]
    doc["inputs"][case].update(n=n, index_counts=[n // g + (i < n % g) for i in range(g)])
    for entry in doc["results"].values():
        for key, by_case in entry.items():
            if key.startswith("vs ") and case in by_case:
                for cmp in [*by_case[case]["out"], *(
                        c for name, c in by_case[case]["grads"].items() if name != "gate")]:
                    cmp["numel"] = n * d


def _broken(tmp_path: Path, doc: dict[str, Any], change) -> Any:
    """``doc`` after ``change``, written and read back."""
    change(doc)
    (tmp_path / "x.json").write_text(json.dumps(doc))
    loaded = read_report(tmp_path / "x.json")
    assert loaded.data is None and loaded.problem is not None and "\n" not in loaded.problem
    return loaded


@pytest.mark.parametrize("name", list(BROKEN_OURS))
def test_bad_report_is_flagged_with_one_line(tmp_path: Path, name: str) -> None:
    change, expected = BROKEN_OURS[name]
    assert expected in _broken(tmp_path, _good(), change).problem


def test_every_report_here_passes_the_consistency_checks(tmp_path: Path) -> None:
    """The checks are not stricter than what the runner writes: every committed report and
    every test report meant to be good is still read."""
    paths = [*committed_reports(tmp_path).glob("*.json"), REFERENCE,
             *DATA.glob("tables/reports/*.json"), GOOD, DATA / "reports" / "host-compile-cpu.json"]
    for path in paths:
        if path.name == "summary.json":
            continue
        loaded = read_report(path)
        assert loaded.ok, (path, loaded.problem)


BROKEN_FOREIGN = {
    "differ > numel": (lambda d: _cmp(d, "diffusers", "rl_kernel").update(differ=10**12),
                       "exceeds numel"),
    "equal with differ > 0": (lambda d: _cmp(d, "diffusers", "rl_kernel").update(equal=True),
                              "equal is True but differ is 35402"),
    "vs key with a list": (lambda d: d["results"]["diffusers"].update({"vs x y": [1]}),
                           "does not match"),
    "environment gpu a mapping": (lambda d: d["environment"].update(gpu={"a": []}),
                                  "environment.gpu"),
}


@pytest.mark.parametrize("name", list(BROKEN_FOREIGN))
def test_bad_foreign_report_is_flagged(tmp_path: Path, name: str) -> None:
    change, expected = BROKEN_FOREIGN[name]
    loaded = _broken(tmp_path, _reference(), change)
    assert loaded.origin == "foreign"
    assert loaded.problem.startswith("unreadable foreign report: ") and expected in loaded.problem


def test_foreign_pair_directions_must_agree(tmp_path: Path) -> None:
    doc = _reference()
    mirror = copy.deepcopy(doc["results"]["diffusers"]["vs rl_kernel"])
    mirror["257"]["grads"]["gate"]["differ"] = 1
    doc["results"].setdefault("rl_kernel", {})["vs diffusers"] = mirror
    (tmp_path / "ref.json").write_text(json.dumps(doc))
    problem = read_report(tmp_path / "ref.json").problem
    assert problem is not None and "differ is 35402 but" in problem and "says 1" in problem


def test_duplicate_cell_ids_keep_the_file_named_after_the_cell(tmp_path: Path) -> None:
    text = GOOD.read_text()
    (tmp_path / "host-plain-cuda.json").write_text(text)
    (tmp_path / "a-copy.json").write_text(text)
    for sub in ("sub", "a-archive"):  # a copy in a folder that sorts first loses too
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "host-plain-cuda.json").write_text(text)
    loaded = {r.path.relative_to(tmp_path).as_posix(): r for r in read_reports(tmp_path)}
    assert loaded["host-plain-cuda.json"].ok
    for name in ("a-copy.json", "sub/host-plain-cuda.json", "a-archive/host-plain-cuda.json"):
        assert loaded[name].problem == ('duplicate cell id "host-plain-cuda": host-plain-cuda.json'
                                        " is that cell's report; this one is left out")


def test_duplicate_cell_ids_under_other_names_keep_the_one_fewest_folders_deep(
        tmp_path: Path) -> None:
    """No file is named after the cell: a copy in a folder that sorts first still loses."""
    text = GOOD.read_text()
    (tmp_path / "copy.json").write_text(text)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "copy.json").write_text(text)
    loaded = {r.path.relative_to(tmp_path).as_posix(): r for r in read_reports(tmp_path)}
    assert loaded["copy.json"].ok
    assert loaded["a/copy.json"].problem == ('duplicate cell id "host-plain-cuda": copy.json'
                                             " is that cell's report; this one is left out")


def test_our_report_without_schema_version_is_flagged_not_read_as_foreign(
        tmp_path: Path) -> None:
    """It used to be read as a foreign report: no N x D check, no cell id, a row anyway."""
    for name, change in (("kind", lambda d: None),
                         ("cell and fingerprint", lambda d: d.update(kind="renamed"))):
        doc = _good()
        del doc["schema_version"]
        change(doc)
        loaded = _broken(tmp_path, doc, lambda d: None)
        assert loaded.origin == "ours", name
        assert loaded.problem.startswith("schema_version: missing from a report of this "
                                         "runner"), loaded.problem
        assert name in loaded.problem and "not read as a foreign report" in loaded.problem
    assert _good()["kind"] == report_mod.KIND  # a committed report of ours carries it


def test_duplicate_foreign_reports_keep_the_first_and_flag_the_rest(tmp_path: Path) -> None:
    """Two copies of the reference report used to render as two identical rows."""
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / REFERENCE.name).write_text(REFERENCE.read_text())
    (tmp_path / "zz-copy.json").write_text(REFERENCE.read_text())
    other = _reference()
    other["environment"]["cuda"] = "12.9"  # another run: kept
    (tmp_path / "cu129.json").write_text(json.dumps(other))
    (tmp_path / "host-plain-cuda.json").write_text(GOOD.read_text())
    problems = {r.path.relative_to(tmp_path).as_posix(): r.problem
                for r in read_reports(tmp_path)}
    assert problems == {
        "cu129.json": None, "host-plain-cuda.json": None, "reference/gate_residual_b200.json": None,
        "zz-copy.json": "duplicate foreign report: reference/gate_residual_b200.json is the same "
                        "cell (all but its results equal); this one is left out"}
    done = _report_cli(tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("warning: ")] == [
        f"warning: {tmp_path / 'zz-copy.json'}: {problems['zz-copy.json']}"]
    assert "3 cell reports: 1 ours (1 ok), 2 foreign; 1 unreadable file." in (
        tmp_path / "README.md").read_text()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_symlink_loop_fifo_and_directory_named_json(tmp_path: Path) -> None:
    (tmp_path / "loop.json").symlink_to("loop.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "host-plain-cuda.json").write_text(GOOD.read_text())
    done: list[Any] = []
    reader = threading.Thread(target=lambda: done.append(read_reports(tmp_path)), daemon=True)
    reader.start()
    reader.join(20)
    if not done:  # unblock the reader before failing
        fd = os.open(tmp_path / "fifo.json", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("reading a FIFO named *.json blocked")
    problems = {r.path.name: r.problem for r in done[0]}
    assert problems["host-plain-cuda.json"] is None
    assert problems["fifo.json"] == "not a report: a FIFO, not a regular file"
    assert problems["loop.json"].startswith("cannot read: Too many levels of symbolic links")
    assert problems.get("dir.json") in (None, "not a report: a directory, not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_report_command_writes_tables_beside_every_bad_file(tmp_path: Path) -> None:
    """The issue's examples together: exit 3, one warning line each, tables written."""
    (tmp_path / "host-plain-cuda.json").write_text(GOOD.read_text())
    for name, (change, _) in BROKEN_OURS.items():
        doc = _good()
        change(doc)
        if doc["cell"]["id"] == "host-plain-cuda":  # not a duplicate: its own problem
            stack = "x" + str(abs(hash(name)))
            doc["cell"].update(id=f"{stack}-plain-cuda", stack=stack)
        (tmp_path / f"bad-{len(name)}-{name[:5].replace(' ', '_')}.json").write_text(
            json.dumps(doc))
    (tmp_path / "loop.json").symlink_to("loop.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "copy.json").write_text(GOOD.read_text())
    result = _report_cli(tmp_path)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == len(BROKEN_OURS) + 3
    readme = (tmp_path / "README.md").read_text()
    assert "1 cell reports: 1 ours (1 ok)" in readme
    for name in ("index.html", "summary.csv", "summary.json"):
        assert (tmp_path / name).is_file()


def test_oversized_report_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_json, "MAX_REPORT_BYTES", 1000)
    (tmp_path / "big.json").write_text(GOOD.read_text())
    problem = read_report(tmp_path / "big.json").problem
    assert problem is not None and problem.startswith("not read: ") and "1000" in problem


# --------------------------------------------------------------------------- classes 3 and 4

MATRIX = (ROOT / "matrix.yaml").read_text(encoding="utf-8")


def _matrix_error(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str],
                  *extra: str) -> str:
    """Run ``matrix`` on ``text``: exit 2, one line, nothing written; returns the line.
    A matrix that is accepted fails the test without running any cell."""
    from unittest import mock

    from gate_residual_matrix.runner.__main__ import main

    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8")
    reports = tmp_path / "reports"
    with mock.patch("gate_residual_matrix.runner.pipeline.prepare",
                    side_effect=AssertionError("matrix accepted")):
        code = main(["matrix", "--matrix", str(path), "--reports", str(reports), *extra])
    assert code == 2, capsys.readouterr().err
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "matrix.yaml: " in err, err
    assert "Traceback" not in err and not reports.exists()
    return err.strip()


def _replace(old: str, new: str) -> str:
    assert MATRIX.count(old) == 1, old
    return MATRIX.replace(old, new)


SIZES = {
    "repeats": (_replace("repeats: 3 ", "repeats: 3000000000 "),
                "repeats: expected an integer <= 1000, got 3000000000"),
    "timing.iters": (_replace("  iters: 10", "  iters: 10000000000"),
                     "timing.iters: expected an integer <= 100000"),
    "batch_invariance.max_size": (
        _replace("{max_size: 1025}", "{max_size: 100000000000}"),
        "batch_invariance.max_size: expected an integer <= 1048576, got 100000000000"),
    "one env value of 128 KiB": (
        _replace('":4096:8"', '"' + "x" * 131072 + '"'),
        "modes.deterministic.env.CUBLAS_WORKSPACE_CONFIG: expected a value of at most 32768 "
        "bytes, got 131072 bytes"),
    "env entries together": (
        _replace('{CUBLAS_WORKSPACE_CONFIG: ":4096:8"}',
                 "{" + ", ".join(f'A{i}: "{"x" * 30000}"' for i in range(6)) + "}"),
        "modes.deterministic.env: expected NAME=value entries of at most 131072 bytes "
        "together, got 180024 bytes"),
    "YAML 500 deep": ("a: " + "[" * 500 + "]" * 500 + "\n",
                      "line 1, column 35: invalid YAML: nested more than 32 levels deep"),
    "YAML aliases": (
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
            for i in range(9)),
        "invalid YAML: more than 100000 values once aliases are expanded"),
    "file size": (MATRIX + "#" * (2 << 20) + "\n",
                  "expected a matrix file of at most 1048576 bytes, got"),
    # class 4
    "base_image with a trailing newline": (
        _replace('base_image: "gate-residual/base:bookworm-py3.11"',
                 'base_image: "gate-residual/base:bookworm-py3.11\\n"'),
        '.base_image: expected an image "name:tag"'),
    "misspelled required key": (_replace("baseline:", "baselin:"),
                                'got unknown key "baselin" (did you mean baseline?)'),
    # the last gaps of the hostile-input review: libraries.versions keys, a stack's kind misspelled
    "libraries.versions unknown distribution": (
        _replace('  vllm-omni: ["0.28.0"', '  vllm_omni: ["0.28.0"'),
        'libraries.versions.vllm_omni: expected a distribution with versioned library '
        'implementations (one of sglang, vllm-omni, liger-kernel, vllm), got unknown key '
        '"vllm_omni" (did you mean vllm-omni?)'),
    "stack kind key misspelled": (
        _replace("host: {kind: host}", "host: {kid: host}"),
        'stacks.host.kid: expected the key kind (one of host, docker), got unknown key "kid" '
        '(did you mean kind?) = "host"'),
    "stack kind value misspelled": (
        _replace("host: {kind: host}", "host: {kind: hots}"),
        'stacks.host.kind: expected one of host, docker, got "hots" (did you mean host?)'),
    # third hostile run: a version listed twice made its library row twice
    "library version listed twice": (
        _replace('sglang: ["0.5.21", "0.5.22", "0.5.23"]', 'sglang: ["0.5.21", "0.5.21"]'),
        'libraries.versions.sglang: expected each version once, got "0.5.21" more than once'),
}


@pytest.mark.parametrize("name", list(SIZES))
def test_size_or_gap_refused_with_one_line_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    text, expected = SIZES[name]
    assert expected in _matrix_error(tmp_path, text, capsys)


def test_every_unknown_key_is_named_first(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = _replace("baseline:", "baselin:").replace("repeats:", "repeat:")
    line = _matrix_error(tmp_path, text, capsys)
    assert line.startswith(f"error: {tmp_path / 'matrix.yaml'}: baselin: expected one of the keys")
    assert "unknown too: repeat" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_matrix_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.errors import ConfigError

    os.mkfifo(tmp_path / "matrix.yaml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_matrix(tmp_path / "matrix.yaml")


@pytest.mark.parametrize(("old", "new", "key"), [
    ("G: 9 ", "G: 1000000000000 ", "problem.G: expected a size whose tensors fit in this "
                                   "host's memory, got 1000000000000"),
    ("D: 5376 ", "D: 1000000000000 ", "problem.D: expected a size whose tensors fit in this "
                                      "host's memory, got 1000000000000"),
])
def test_every_tensor_counts_against_host_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        old: str, new: str, key: str) -> None:
    """G used to be left out (G = 10**12 started a cell that grew until killed), and a D too
    big was reported against cases[0].n."""

    monkeypatch.setattr(local, "host_memory_bytes", lambda: 2**40)
    line = _matrix_error(tmp_path, _replace(old, new), capsys, "--target", "cpu", "--case", "1")
    assert key in line and line.endswith("this host has 1 TiB)")


def test_memory_bound_counts_gate_rows() -> None:
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.plan.case_sizes import case_bytes_at_least

    matrix = load_matrix(ROOT / "matrix.yaml")
    case = matrix.cases[0]
    small = case_bytes_at_least(matrix, case)[0]
    bigger_g = matrix.model_copy(update={"problem": matrix.problem.model_copy(
        update={"G": matrix.problem.G + 1000})})
    assert case_bytes_at_least(bigger_g, case)[0] == small + 1000 * matrix.problem.D * 2


# --------------------------------------------------------------------------- class 5: escaping

HOSTILE_TEXT = "<!--<script>x</script> | <img src=x onerror=alert(1)> `code` [a](b) *b*\nrow2"


def _hostile_tables(tmp_path: Path):
    from gate_residual_matrix.runner.tables import build_tables

    doc = _good()
    # free text the schema asks only to be a non-empty string (stack and mode make the
    # cell id, which must be a name: they cannot carry markup)
    doc["environment"]["gpu"] = HOSTILE_TEXT
    doc["op"] = "=HYPERLINK(\"http://x\",\"y\")"
    doc["status"], doc["reason"] = "error", HOSTILE_TEXT
    (tmp_path / "host-plain-cuda.json").write_text(json.dumps(doc))
    reference = _reference()
    reference["environment"]["gpu"] = "B200`<b>|\n"
    (tmp_path / "ref`<x>.json").write_text(json.dumps(reference))
    loaded = read_reports(tmp_path)
    assert all(r.ok for r in loaded), [r.problem for r in loaded]
    return build_tables(loaded, relative_to=tmp_path)


def test_html_data_block_cannot_end_or_comment_out_the_script(tmp_path: Path) -> None:
    """``<!--<script>`` in a report string used to put the HTML parser in its "script data
    escaped" state, so the page's own script never ran and the filters stayed empty."""
    from gate_residual_matrix.runner.tables.render.html import render_html

    page = render_html(_hostile_tables(tmp_path))
    block = re.search(r'<script type="application/json" id="cells-data">(.*?)</script>', page,
                      re.S)
    assert block is not None
    data = block.group(1)
    assert "<" not in data and ">" not in data and "&" not in data
    assert HOSTILE_TEXT in {c["gpu"] for c in json.loads(data)["cells"]}
    assert "<img" not in page and "<!--<script>" not in page


def test_markdown_cells_are_inert(tmp_path: Path) -> None:
    from gate_residual_matrix.runner.tables import markdown, md_text

    text = markdown(_hostile_tables(tmp_path))
    assert not re.search(r"(?<!\\)<", text.split("## Verdicts", 1)[1])  # every < escaped
    assert r"\<img src=x onerror=alert(1)\> \`code\` \[a\](b) \*b\* row2" in text
    assert "reference:ref?" in text  # a label made of a file name and a GPU string
    lines = text.splitlines()
    for i, line in enumerate(lines):  # a row has as many column borders as its header
        if line.startswith("|-"):
            width = line.count("|")
            for row in lines[i + 1:]:
                if not row.startswith("|"):
                    break
                assert len(re.findall(r"(?<!\\)\|", row)) == width, row
    assert md_text("**cell error**: a*b") == r"**cell error**: a\*b"
    assert md_text("grad_y _x_") == r"grad_y \_x\_"


def test_csv_formula_prefixes_are_quoted(tmp_path: Path) -> None:
    import csv
    import io

    from gate_residual_matrix.runner.tables.render.summary import render_csv

    rows = list(csv.DictReader(io.StringIO(render_csv(_hostile_tables(tmp_path)))))
    ops = {r["op"] for r in rows if r["cell"] == "host-plain-cuda"}
    assert ops == {"'=HYPERLINK(\"http://x\",\"y\")"}
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "@", "\t", "\r")), value
            assert not value.startswith("-") or value.lstrip("-").replace(".", "").isdigit()


# ------------------------------------------------------- the second hostile run (2026-12-01)

@pytest.mark.parametrize(("old", "new", "fragment"), [
    ("  seed: 20261129", "  seed: " + "1" * 5000, "invalid YAML: Exceeds the limit"),
    ("  seed: 20261129", "  seed: 0x" + "f" * 4000, "problem.seed: expected a number of at "
     "most 128 bits"),
    ("repeats: 3 ", "repeats: 0x" + "f" * 4000 + " ", "repeats: expected a number of at most"),
    ("  D: 5376", "  D: 0x" + "f" * 4000, "problem.D: expected a number of at most 128 bits"),
])
def test_integers_too_wide_to_print_are_refused(tmp_path: Path, capsys, old: str, new: str,
                                                fragment: str) -> None:
    assert fragment in _matrix_error(tmp_path, _replace(old, new), capsys)


def test_a_lone_surrogate_in_a_mode_environment_is_refused(tmp_path: Path, capsys) -> None:
    text = _replace("  plain: {}", '  plain: {env: {PROBE: "\\uD800"}}')
    assert "no lone surrogate" in _matrix_error(tmp_path, text, capsys)


@pytest.mark.parametrize("name", ["huge_integer", "lone_surrogate", "vs_itself", "vs_ghost"])
def test_second_run_bad_reports_are_flagged_not_crashed(tmp_path: Path, name: str) -> None:
    """Each is one ``warning:`` line and exit 3, and the tables are written from the rest."""
    text = json.dumps(_good())
    doc = _good()
    if name == "huge_integer":
        text = re.sub(r'"differ": [0-9]+', '"differ": ' + "1" * 5000, text, count=1)
    elif name == "lone_surrogate":
        doc["environment"]["gpu"] = "\ud800"
        text = json.dumps(doc)
    elif name == "vs_itself":
        doc["results"]["numba"]["vs numba"] = doc["results"]["numba"]["vs eager"]
        text = json.dumps(doc)
    else:
        doc["results"]["numba"]["vs ghost"] = doc["results"]["numba"]["vs eager"]
        text = json.dumps(doc)
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "bad.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    (reports / "good.json").write_text(json.dumps(_good()), encoding="utf-8")
    loaded = read_report(reports / "bad.json")
    assert not loaded.ok and "\n" not in loaded.problem, loaded.problem
    done = _report_cli(reports)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert (reports / "README.md").exists()


def test_a_symlink_loop_as_matrix_is_one_line(tmp_path: Path, capsys) -> None:
    from gate_residual_matrix.runner.__main__ import main

    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    code = main(["matrix", "--matrix", str(loop), "--reports", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_hundred_thousand_bad_case_ids_are_flagged_in_seconds(tmp_path: Path) -> None:
    """Third hostile run: 100,000 ids (mixed ints and strings, repeated) hung `report` for
    minutes in jsonschema's uniqueItems fallback, which is quadratic; now one line, fast."""
    doc = _good()
    doc["cases"] = [*doc["cases"], *([str(i) for i in range(50_000)] + list(range(50_000)))]
    (tmp_path / f"{doc['cell']['id']}.json").write_text(json.dumps(doc))
    started = time.monotonic()
    done = _report_cli(tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "cases" in warnings[0], done.stderr
    assert elapsed < 60, f"{elapsed:.0f} s for one bad file"


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux's /proc")
def test_a_reports_folder_that_takes_no_files_is_one_line_exit_3() -> None:
    """Third hostile run: --reports /proc/1 (it exists; nothing can be made in it) gave
    'internal error (FileNotFoundError ...)' from the staging folder."""
    done = subprocess.run(
        [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--target", "cpu", "--mode",
         "plain",
         "--stack", "host", "--case", "1", "--reports", "/proc/1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert "cannot create a staging folder" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
