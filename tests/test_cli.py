"""Command-line options are validated before anything runs: exit 2, one line, nothing written.

Each bad option or matrix is given to ``python -m gate_residual_matrix`` (``runner.__main__.main``,
in this process) with a reports directory that already holds a report and a stray file; after the
error the directory must be exactly as it was (names, bytes, modification times), and a reports
directory that did not exist must still not exist.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from gate_residual_matrix.runner import pipeline as run_mod
from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.backends import local
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.config.matrix import load_matrix

# the registered implementations after the first three, as messages list them (the registry
# run_matrix validates against)
KNOWN_REST = "".join(f"{n}, " for n in implementations.known("gate_residual")[3:])

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "matrix.yaml"
FAULTS = ROOT / "tests" / "data" / "faults.yaml"
REPORT = ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json"


def snapshot(directory: Path) -> dict | None:
    if not directory.exists():
        return None
    return {p.relative_to(directory).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def reports(tmp_path) -> Path:
    d = tmp_path / "reports"
    d.mkdir()
    shutil.copy(REPORT, d / "host-plain-cuda.json")
    (d / "notes.txt").write_text("keep me\n")
    return d


def bad_matrix(tmp_path: Path, old: str, new: str) -> str:
    text = MATRIX.read_text()
    assert old in text, old
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


# (test id, argv after "matrix --reports <dir>", a fragment of the one-line error)
BAD_OPTIONS = [
    ("unknown stack", ["--stack", "nohost"], '--stack: unknown stack "nohost"; choose from host'),
    ("stack with shell metacharacters", ["--stack", "host;rm -rf /"], 'unknown stack "host;rm'),
    ("stack with path traversal", ["--stack", "../../etc"], 'unknown stack "../../etc"'),
    ("stack with a newline", ["--stack", "host\nx"], 'unknown stack "host\\nx"'),
    ("unknown mode", ["--mode", "det"], '--mode: unknown mode "det"; choose from plain'),
    ("mode with $()", ["--mode", "$(id)"], 'unknown mode "$(id)"'),
    ("unknown target", ["--target", "gpu"], '--target: unknown target "gpu"; choose from cuda'),
    ("target with a backtick", ["--target", "cpu`id`"], 'unknown target "cpu`id`"'),
    ("unknown case", ["--case", "999"], '--case: unknown case "999"; choose from 1, 257'),
    ("case with path traversal", ["--case", "../257"], 'unknown case "../257"'),
    ("case with a NUL", ["--case", "257\0"], 'unknown case "257\\x00"'),
    ("unknown case, long list", ["--case", "nope"], " more; see matrix.yaml's cases)\n"),
    ("unknown backend", ["--backend", "podman"], "--backend: unknown backend 'podman'"),
    ("backend with a semicolon", ["--backend", "host;id"], "unknown backend 'host;id'"),
    ("timeout zero", ["--timeout", "0"], "--timeout: expected a number of seconds > 0, got 0.0"),
    ("timeout negative", ["--timeout", "-5"], "got -5.0"),
    ("timeout nan", ["--timeout", "nan"], "got nan"),
    ("timeout inf", ["--timeout", "inf"], "got inf"),
    ("timeout not a number", ["--timeout", "soon"], "argument --timeout: invalid float value"),
    ("unknown option", ["--targets", "cpu"], "unrecognized arguments: --targets cpu"),
    ("missing matrix", ["--matrix", "/nonexistent/m.yaml"], "cannot read the matrix file"),
    ("gpus with a semicolon", ["--gpus", "0;rm"],
     '--gpus: expected "all" or device ids like "0,1", got \'0;rm\''),
    ("gpus empty", ["--gpus", ""], "--gpus: expected"),
    ("rules without --expect", ["--allow", "error:grew"],
     "--allow: compares with a baseline; add --expect BASELINE_DIR"),
    ("expect missing", ["--expect", "/nonexistent/known-good"],
     "--expect: expected a directory of reports, got /nonexistent/known-good"),
]


@pytest.mark.parametrize(("argv", "fragment"), [b[1:] for b in BAD_OPTIONS],
                         ids=[b[0] for b in BAD_OPTIONS])
def test_bad_option_exits_2_and_writes_nothing(reports, capsys, argv, fragment):
    before = snapshot(reports)
    code = main(["matrix", "--reports", str(reports), *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert snapshot(reports) == before


@pytest.mark.parametrize(("old", "new", "fragment"), [
    ("  D: 5376", "  D: 0", "problem.D: expected an integer >= 1, got 0"),
    ("  - {n: 4097, targets: [cuda]}", "  - {n: 4097, specail: true}", 'got unknown key "specail"'),
    ("implementations: [eager, numba, fp64", "implementations: [eager, numba, fp64, fault",
     'implementations[3]: expected one of eager, numba, fp64, ' + KNOWN_REST + 'got "fault"'),
    ("  torch: 2.13.0\n", '  torch: "2.13.0; rm -rf /"\n', "torch: expected a version like"),
    ("op: gate_residual", "op: !!python/object/apply:os.system [id]", "invalid YAML"),
    ("  plain: {}", "  ../plain: {}", 'modes["../plain"]: expected a name'),
    ("  - {n: 4097, targets: [cuda]}", "  - {n: 100000000000}",
     "bad.yaml: cases[2].n: expected a size whose tensors fit in this host's memory, got "
     "100000000000 (case 100000000000: N = "
     "100000000000, D = 5376, G = 9, bfloat16/int64: at least 6.69 PiB for the inputs, the "
     "upstream gradient and the reference's output; this host has "),
])
def test_bad_matrix_exits_2_and_writes_nothing(reports, tmp_path, capsys, old, new, fragment):
    before = snapshot(reports)
    code = main(["matrix", "--matrix", bad_matrix(tmp_path, old, new), "--reports",
                 str(reports)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1, err
    assert snapshot(reports) == before


def test_a_missing_reports_directory_is_not_created_on_error(tmp_path, capsys):
    target = tmp_path / "new" / "reports"
    assert main(["matrix", "--reports", str(target), "--stack", "nope"]) == 2
    assert not (tmp_path / "new").exists()


def test_cuda_requested_without_a_gpu_exits_2_and_writes_nothing(reports, capsys, monkeypatch):
    monkeypatch.setattr(local, "cuda_available", lambda: False)
    before = snapshot(reports)
    for argv in (["--target", "cuda"], ["--target", "cpu", "--target", "cuda"]):
        assert main(["matrix", "--reports", str(reports), *argv]) == 2
        err = capsys.readouterr().err
        assert err == ("error: --target: cuda was requested but torch sees no CUDA device "
                       "here\n"), err
    assert snapshot(reports) == before


def test_cell_command_refuses_cuda_without_a_gpu(reports, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = snapshot(reports)
    code = main(["cell", "--reports", str(reports), "--stack", "host", "--mode", "plain",
                 "--target", "cuda"])
    assert code == 2 and "cuda was requested" in capsys.readouterr().err
    assert snapshot(reports) == before


def test_fault_implementation_is_unknown_without_the_switch(reports, capsys, monkeypatch):
    from gate_residual_matrix.runner.cell import catalog as implementations

    monkeypatch.setattr(implementations, "known", lambda op: ("eager", "numba", "fp64"))
    before = snapshot(reports)
    assert main(["matrix", "--matrix", str(FAULTS), "--reports", str(reports)]) == 2
    assert 'implementations[2]: expected one of eager, numba, fp64, got "fault"' in (
        capsys.readouterr().err)
    assert snapshot(reports) == before


def test_a_case_too_big_for_any_host_is_refused_before_anything_runs(reports, capsys,
                                                                     monkeypatch, tmp_path):
    """N = 10**11 used to fail inside the cell (exit 5); the bound is this host's memory."""
    path = bad_matrix(tmp_path, "  - {n: 4097, targets: [cuda]}", "  - {n: 100000000000}")
    monkeypatch.setattr(local, "host_memory_bytes", lambda: 2**40)
    before = snapshot(reports)
    assert main(["matrix", "--matrix", path, "--reports", str(reports), "--case",
                 "100000000000"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("this host has 1 TiB)\n") and err.count("\n") == 1, err
    assert snapshot(reports) == before
    # not selected: not checked (the other cases run as before)
    monkeypatch.setattr(local, "host_memory_bytes", lambda: None)
    run_mod.check_case_sizes(load_matrix(Path(path)), (), Path(path), None)


def test_report_on_a_missing_directory_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert main(["report", "--reports", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --reports: expected a directory of reports, got {missing} "
                   "(no such directory)\n")
    assert not missing.exists()
    a_file = tmp_path / "file.json"
    a_file.write_text("{}")
    assert main(["report", "--reports", str(a_file)]) == 2
    assert "(not a directory)" in capsys.readouterr().err
    # --out names a directory too: a file there is a bad option (2), left as it was
    assert main(["report", "--reports", str(tmp_path), "--out", str(a_file)]) == 2
    assert capsys.readouterr().err == (f"error: --out: expected a directory for the tables, "
                                       f"got {a_file} (not a directory)\n")
    assert a_file.read_text() == "{}"


def test_report_warns_per_unreadable_file_writes_the_tables_and_exits_3(reports, capsys):
    (reports / "broken.json").write_text('{"schema_version": 1, "cell": ')
    (reports / "latin1.json").write_bytes(b'{"caf\xe9": 1}')
    code = main(["report", "--reports", str(reports)])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 3, err
    assert lines[:2] == [f"warning: {reports / 'broken.json'}: truncated JSON: Expecting value "
                         "at line 1 column 31",
                         f"warning: {reports / 'latin1.json'}: corrupt: not UTF-8 text (invalid "
                         "continuation byte)"], err
    assert lines[2:] == [f"error: 2 file(s) under {reports} could not be read (see the "
                         "warnings); the tables were written from the others"]
    assert "host-plain-cuda" in (reports / "README.md").read_text()
    assert "[runner] tables:" in out


def test_report_exits_0_when_every_file_reads(reports, capsys):
    assert main(["report", "--reports", str(reports)]) == 0
    assert capsys.readouterr().err == ""
