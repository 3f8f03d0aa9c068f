"""The fourth hostile run ("nothing lost, nothing wrong", part 2): each test builds one
attack and checks what docs/reliability.md says it now produces.

1. a report always carries the fingerprint of the matrix it ran (the cells run from the
   validated snapshot; YAML tags of unordered or non-JSON values are refused);
2. two runs writing one reports folder at once lose no case (the folder's lock);
3. path options are checked before anything is written; no read blocks on a special file;
4. names are shown escaped (non-UTF-8 bytes, control characters), one line per bad file;
5. reading reports is bounded by what is shown;
6. consistency checks of what the tables show as fact;
7. ``--cluster``: addresses parsed, the connect bounded, signals give 130/143.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from gate_residual_matrix.runner import pipeline
from gate_residual_matrix.runner.backends.registry import BACKENDS
from gate_residual_matrix.runner.cell.run import skeleton
from gate_residual_matrix.runner.config.matrix import load_matrix, parse_matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.reports.store import read_report, write_report
from tests.committed_reports import REFERENCE

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 1},
    "cases": [{"n": 1}, {"n": 5}, {"n": 7}], "implementations": ["eager", "numba", "fp64"],
    "baseline": "eager", "accuracy_reference": "fp64",
    "modes": {"plain": {}}, "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
}
CELL = "host-plain-cpu"


class CellLike:
    """A host backend that does what a cell process does with the matrix (loads it from
    ``matrix_path``) and writes an ok report of those cases at once. ``during`` (if set) is
    called inside the run, as another user or run would act while a cell runs."""

    name = "host"
    during: ClassVar[list] = []
    seen_problem: ClassVar[list] = []

    def available(self):
        return None

    def prepare(self, matrix, stacks, *, strict):
        return {}

    def fingerprint_extra(self, matrix, cell):
        return {}

    def run(self, matrix, cell, cases, *, matrix_path, reports_dir, run_id, timeout_s):
        while CellLike.during:
            CellLike.during.pop(0)()
        loaded = load_matrix(matrix_path)  # what the cell command (--matrix) does
        CellLike.seen_problem.append(loaded.problem.as_report())
        cases = [c for c in loaded.cases if c.id in {k.id for k in cases}]
        report = skeleton(loaded, cell, cases, backend="host", run_id=run_id, status="ok",
                          env={"python": "3.12", "torch": "2.13.0",
                               "project": {"commit": "ab" * 20, "dirty": False}})
        ids = [str(c) for c in report["cases"]]
        report["inputs"] = {c: {"n": int(c), "specials": False,
                                "sha256": {"residual": "0" * 64}} for c in ids}
        report["results"] = {"eager": {"status": "ok", "reason": None,
                                       "sha256": {c: {"out": run_id * 2} for c in ids},
                                       "mutated_inputs": {c: [] for c in ids}}}
        write_report(report, reports_dir)
        return report


@pytest.fixture
def cell_like(monkeypatch):
    monkeypatch.setattr(pipeline, "project_state", lambda: {"commit": "ab" * 20,
                                                            "dirty": False})
    monkeypatch.setattr(pipeline, "uncommitted_digest", lambda: None)
    monkeypatch.setitem(BACKENDS, "host", CellLike)
    monkeypatch.setattr(CellLike, "during", [])
    monkeypatch.setattr(CellLike, "seen_problem", [])


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _run(matrix: Path, reports: Path, **kw):
    return pipeline.run_matrix(matrix, reports_dir=reports, render=False, backend="host", **kw)


# ----------------------------------------------------- 1. the fingerprint is of what ran

def test_an_edit_during_the_run_cannot_reach_a_report_of_the_old_fingerprint(
        tmp_path: Path, cell_like) -> None:
    """matrix.yaml edited while a cell runs: the cell used to re-read the file, so its
    report held the new G and seed under the original matrix's fingerprint, and the next
    run of the original matrix reused it."""
    original = json.loads(json.dumps(BASE))
    matrix = _write(tmp_path / "matrix.yaml", original)
    edited = {**original, "problem": {**original["problem"], "G": 3, "seed": 99}}
    CellLike.during.append(lambda: _write(matrix, edited))
    [outcome] = _run(matrix, tmp_path / "reports")
    assert outcome.status == "ok"
    report = read_report(tmp_path / "reports" / f"{CELL}.json").data
    assert report["problem"]["G"] == 2 and report["problem"]["seed"] == 1
    assert CellLike.seen_problem == [report["problem"]]
    assert not list(tmp_path.glob("gate-residual-matrix-*"))
    _write(matrix, original)  # the original matrix again: the report is its own
    [again] = _run(matrix, tmp_path / "reports")
    assert again.reused
    _write(matrix, edited)  # the edited one: not the same fingerprint, so it runs
    [other] = _run(matrix, tmp_path / "reports")
    assert not other.reused
    assert read_report(tmp_path / "reports" / f"{CELL}.json").data["problem"]["G"] == 3


def test_the_snapshot_is_removed_after_the_run(tmp_path: Path, cell_like,
                                               monkeypatch) -> None:
    made = []
    real = pipeline.snapshot_matrix

    def spy(request):
        path = real(request)
        made.append(path)
        return path

    monkeypatch.setattr(pipeline, "snapshot_matrix", spy)
    _run(_write(tmp_path / "matrix.yaml", BASE), tmp_path / "reports")
    [path] = made
    assert path.name == "matrix.yaml" and path != tmp_path / "matrix.yaml"
    assert not path.parent.exists()


@pytest.mark.parametrize("tagged, what", [
    ("implementations: !!set {eager, numba, fp64}", "!!set builds an unordered set"),
    ("implementations: !!omap [eager: 1]", "!!omap builds a list of pairs"),
    ("implementations: !!pairs [eager: 1]", "!!pairs builds a list of pairs"),
    ("implementations: !!binary ZWFnZXI=", "!!binary builds bytes"),
])
def test_tags_of_unordered_or_non_json_values_are_refused(tmp_path: Path, tagged: str,
                                                          what: str) -> None:
    text = yaml.safe_dump(BASE, sort_keys=False).replace(
        "implementations:\n- eager\n- numba\n- fp64", tagged)
    assert tagged in text
    (tmp_path / "m.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_matrix(tmp_path / "m.yaml")
    message = str(err.value)
    assert "\n" not in message and what in message and "line " in message


def test_the_fingerprint_does_not_follow_pythonhashseed(tmp_path: Path) -> None:
    """The same file gives the same content hash in every process (a set used to follow
    PYTHONHASHSEED; now every accepted value is ordered)."""
    _write(tmp_path / "m.yaml", BASE)
    code = ("from gate_residual_matrix.runner.config.matrix import load_matrix; "
            f"print(load_matrix({str(tmp_path / 'm.yaml')!r}).content_hash())")
    hashes = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, check=True,
                             capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}
                             ).stdout for seed in ("1", "2", "3")}
    assert len(hashes) == 1 and parse_matrix(BASE).content_hash() + "\n" in hashes


# ------------------------------------------------------ 2. two runs, one reports folder

def test_a_run_that_ends_while_another_runs_loses_no_case(tmp_path: Path, cell_like) -> None:
    """Run A (--case 5) plans from the report (case 1), then run B (--case 7) starts and
    ends while A's cell runs; A used to write case 1 + 5 over B's 1 + 7."""
    matrix = _write(tmp_path / "matrix.yaml", BASE)
    reports = tmp_path / "reports"
    _run(matrix, reports, cases=["1"])
    CellLike.during.append(lambda: _run(matrix, reports, cases=["7"]))
    [outcome] = _run(matrix, reports, cases=["5"])
    assert outcome.status == "ok"
    report = read_report(reports / f"{CELL}.json").data
    assert report["cases"] == [1, 5, 7]
    assert set(report["results"]["eager"]["sha256"]) == {"1", "5", "7"}
    [full] = _run(matrix, reports)  # every case is there, of one fingerprint
    assert full.reused


RACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path[:0] = [{root!r}, {tests!r}]
    import test_hostile_part2 as t
    from gate_residual_matrix.runner import pipeline
    from gate_residual_matrix.runner.backends.registry import BACKENDS

    pipeline.project_state = lambda: {{"commit": "ab" * 20, "dirty": False}}
    pipeline.uncommitted_digest = lambda: None
    BACKENDS["host"] = t.CellLike
    case, other, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def meet():  # both runs have planned from the same report before either writes
        (folder / f"started-{{case}}").touch()
        deadline = time.monotonic() + 60
        while not (folder / f"started-{{other}}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    t.CellLike.during.append(meet)
    [o] = pipeline.run_matrix(folder / "matrix.yaml", reports_dir=folder / "reports",
                              render=False, backend="host", cases=[case])
    print(o.status, pipeline.__file__)
""")


def test_two_case_runs_at_once_keep_every_case(tmp_path: Path, cell_like) -> None:
    """Two processes, ``--case 5`` and ``--case 7``, into one folder at once: the final
    report holds 1, 5 and 7 (case 5 used to be lost)."""
    matrix = _write(tmp_path / "matrix.yaml", BASE)
    _run(matrix, tmp_path / "reports", cases=["1"])
    script = tmp_path / "racer.py"
    script.write_text(RACER.format(root=str(ROOT), tests=str(Path(__file__).parent)),
                      encoding="utf-8")
    procs = [subprocess.Popen([sys.executable, str(script), case, other, str(tmp_path)],
                              cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for case, other in (("5", "7"), ("7", "5"))]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o[0].split()[-2:] for o in outs] == [
        ["ok", str(ROOT / "gate_residual_matrix" / "runner" / "pipeline.py")]] * 2, outs
    report = read_report(tmp_path / "reports" / f"{CELL}.json").data
    assert report["cases"] == [1, 5, 7]
    assert set(report["results"]["eager"]["sha256"]) == {"1", "5", "7"}


# ------------------------------------------------- 3. path options, special files, no hang

def _snapshot_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("argv", [["report", "--reports", ""],
                                  ["report", "--reports", "reports", "--out", ""],
                                  ["matrix", "--reports", "", "--target", "cpu"],
                                  ["matrix", "--matrix", ""]])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(
        tmp_path: Path, monkeypatch, capsys, argv: list[str]) -> None:
    """``--reports ""`` was the current folder: ``report`` in the project's root overwrote
    its README.md."""
    from gate_residual_matrix.runner.__main__ import main

    (tmp_path / "README.md").write_text("# mine\n", encoding="utf-8")
    (tmp_path / "reports").mkdir()
    before = _snapshot_of(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a path, got an empty string" in err
    assert _snapshot_of(tmp_path) == before and not (tmp_path / "cells").exists()


def test_the_projects_root_is_never_a_reports_folder(tmp_path: Path, capsys) -> None:
    from gate_residual_matrix.runner.__main__ import main
    from gate_residual_matrix.runner.config.paths import PROJECT_ROOT, output_folder

    for folder in (PROJECT_ROOT, PROJECT_ROOT.parent, Path("/")):
        with pytest.raises(ConfigError, match="the project's own folder"):
            output_folder(folder, "--reports")
    other = tmp_path / "someone-elses-project"
    other.mkdir()
    (other / "pyproject.toml").write_text("[project]\n", encoding="utf-8")
    (other / "README.md").write_text("# theirs\n", encoding="utf-8")
    before = _snapshot_of(other)
    reports = tmp_path / "reports"
    reports.mkdir()
    for argv in (["report", "--reports", str(other)],
                 ["report", "--reports", str(reports), "--out", str(other)],
                 ["matrix", "--reports", str(other), "--target", "cpu"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "holds pyproject.toml" in err, err
    assert _snapshot_of(other) == before and not (other / "cells").exists()


def test_a_file_or_fifo_as_reports_folder_is_exit_2_before_anything(tmp_path: Path,
                                                                     capsys) -> None:
    from gate_residual_matrix.runner.__main__ import main

    (tmp_path / "file").write_text("x", encoding="utf-8")
    os.mkfifo(tmp_path / "fifo")
    for name in ("file", "fifo"):
        assert main(["matrix", "--reports", str(tmp_path / name), "--target", "cpu"]) == 2
        err = capsys.readouterr().err
        assert "expected a folder for reports and tables" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "file"]


KERNEL_FILES = [p for p in ("/proc/kmsg", "/proc/self/status", "/sys/kernel/uevent_seqnum")
                if os.path.exists(p)]


@pytest.mark.parametrize("target", KERNEL_FILES)
def test_a_symlink_to_a_kernel_file_is_refused_without_a_read(tmp_path: Path, target: str,
                                                              capsys) -> None:
    """``x.json`` or ``--matrix`` a symlink to /proc/kmsg: the read blocked until killed
    (and, as root, consumed the kernel log). Files of /proc and /sys are refused from
    their device, before any read; one line each."""
    from gate_residual_matrix.runner.__main__ import main

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "x.json").symlink_to(target)
    (tmp_path / "m.yaml").symlink_to(target)
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml"),
                 "--reports", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("kernel interface" in err or "Permission" in err)
    assert not (tmp_path / "out").exists()
    assert main(["report", "--reports", str(tmp_path / "reports")]) == 3
    err = capsys.readouterr().err
    assert "warning: " + str(tmp_path / "reports" / "x.json") + ": " in err
    assert "kernel interface" in err or "Permission" in err


def test_a_file_that_would_block_is_refused_not_waited_on(tmp_path: Path,
                                                          monkeypatch) -> None:
    """A file that says it is regular but whose read would block (as /proc/kmsg does) is
    refused at once: it is read non-blocking to the end."""
    import stat as stat_mod
    import time

    from gate_residual_matrix.runner.untrusted import files

    fifo = tmp_path / "looks-regular.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)  # a writer that never writes: a read would block
    real_fstat = os.fstat

    def regular(fd):
        info = real_fstat(fd)
        fields = list(info)
        fields[0] = stat_mod.S_IFREG | 0o644
        fields[6] = 0  # st_size
        return os.stat_result(fields)

    monkeypatch.setattr(files.os, "fstat", regular)
    try:
        start = time.monotonic()
        with pytest.raises(files.NotRegular, match="would block"):
            files.read_bounded(fifo, 1 << 20)
        assert time.monotonic() - start < 5
    finally:
        os.close(writer)
        os.close(reader)


def test_reading_is_bounded_in_time(tmp_path: Path, monkeypatch) -> None:
    from gate_residual_matrix.runner.untrusted import files

    big = tmp_path / "big.json"
    big.write_bytes(b" " * (3 << 20))
    clock = iter(range(0, 1000, 100))
    monkeypatch.setattr(files.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(TimeoutError, match="more than 60 s"):
        files.read_bounded(big, 8 << 20)


# -------------------------------------------------------------- 4. names shown escaped

BAD_NAMES = [os.fsdecode(b"notes-\xff\xfe.json"), "a\nwarning: forged.json",
             "b\x1b]0;title\x07\x1b[31mred.json", "c\u202egnp.json"]


def test_bad_file_names_are_one_escaped_line_each_and_escaped_in_every_table(
        tmp_path: Path, capsys) -> None:
    """A name that is not UTF-8 crashed ``report`` (UnicodeEncodeError) with only cells/*.md
    written; a newline in a name forged a second warning line; ESC and OSC bytes reached the
    terminal and README.md raw."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "host-plain-cuda.json").write_bytes(
        (ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").read_bytes())
    for name in BAD_NAMES:
        (reports / name).write_text("{}", encoding="utf-8")
    assert main(["report", "--reports", str(reports)]) == 3
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == len(BAD_NAMES) == err.count("\n") - 1
    shown_names = ["notes-\\xff\\xfe.json", "a\\nwarning: forged.json",
                   "b\\x1b]0;title\\x07\\x1b[31mred.json", "c\\u202egnp.json"]
    for name in shown_names:
        assert sum(name in w for w in warnings) == 1, (name, warnings)
    for text in [out, err] + [p.read_text(encoding="utf-8") for p in reports.rglob("*")
                              if p.suffix in (".md", ".html", ".csv", ".json")
                              and p.name != "host-plain-cuda.json" and p.stat().st_size > 2]:
        assert not any(ch in text for ch in "\x1b\x07\u202e")
        assert "\udcff" not in text
    listed = json.loads((reports / "summary.json").read_text(encoding="utf-8"))
    assert sorted(u["file"] for u in listed["unreadable"]) == sorted(shown_names)
    readme = (reports / "README.md").read_text(encoding="utf-8")
    assert "notes-\\\\xff\\\\xfe.json" in readme  # escaped, then Markdown-escaped


def test_an_error_line_naming_a_bad_path_is_one_escaped_line(tmp_path: Path,
                                                             capsys) -> None:
    from gate_residual_matrix.runner.__main__ import main

    bad = tmp_path / "m\n\x1b[2Jx.yaml"
    assert main(["matrix", "--matrix", str(bad), "--reports", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\\x1b[2Jx.yaml" in err


# --------------------------------------------- 6. what the tables show as fact is checked

GOOD = ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json"


def _doc(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _problem(tmp_path: Path, doc: dict, name: str = "host-plain-cuda.json") -> str | None:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return read_report(path).problem


def test_listed_cases_without_data_are_flagged(tmp_path: Path) -> None:
    """A report listing 10^6 case ids with data for 2 rendered as ok (a 47 MB ab.md)."""
    import time

    doc = _doc(GOOD)
    doc["cases"] += [f"{n}-specials" for n in range(1, 19_001)]
    start = time.monotonic()
    problem = _problem(tmp_path, doc)
    assert time.monotonic() - start < 30
    assert problem is not None and "19000 of 19002 listed case(s) have no inputs or no " \
        'result ("1-specials", "2-specials" (and 18998 more))' in problem
    doc["cases"] += [f"{n}-specials" for n in range(19_001, 1_000_001)]  # the attack's size
    assert "cases: 1000002 case ids, more than the 20000" in (_problem(tmp_path, doc) or "")
    doc = _doc(GOOD)
    doc["cases"].append(4097)  # one case, no data
    assert "1 of 3 listed case(s)" in (_problem(tmp_path, doc) or "")
    doc["status"] = "error"  # a failed report may list cases it did not reach
    doc["reason"] = "failed"
    assert _problem(tmp_path, doc) is None


@pytest.mark.parametrize("record, expected", [
    ({"size_sweep": 0, "first_failing_size": 2}, "size_sweep: expected true or false, got 0"),
    ({"size_sweep": True, "first_failing_size": 2},
     "size_sweep is true but first_failing_size is 2"),
    ({"size_sweep": False, "first_failing_size": None},
     "size_sweep is false but first_failing_size is null"),
    ({"size_sweep": False, "first_failing_size": 300},
     "first_failing_size: expected a size 1..max_size, got 300"),
    ({"row_alone": 1}, "row_alone: expected true or false, got 1"),
])
def test_batch_invariance_fields_must_agree(tmp_path: Path, record: dict,
                                            expected: str) -> None:
    """``size_sweep: 0, first_failing_size: 2`` passed validation and the table said
    batch-invariant ``yes``."""
    base = {"row_alone": True, "sub_batches": True, "size_sweep": True,
            "first_failing_size": None, "max_size": 257}
    for doc in (_doc(GOOD), _doc(REFERENCE)):
        impl = next(iter(doc["results"]))
        doc["results"][impl]["batch_invariant"] = {"257": {**base, **record}}
        problem = _problem(tmp_path, doc, "x.json")
        assert problem is not None and expected in problem, problem
        doc["results"][impl]["batch_invariant"] = {"257": base}
        assert _problem(tmp_path, doc, "x.json") is None


def _foreign_missing_case() -> dict:
    doc = _doc(REFERENCE)
    for impl, other in (("diffusers", "rl_kernel"), ("rl_kernel", "diffusers")):
        del doc["results"][impl][f"vs {other}"]["4097"]
    return doc


def _foreign_extra_impl() -> dict:
    doc = _doc(REFERENCE)
    doc["results"]["liger"] = {"source": "liger-kernel"}
    return doc


def _foreign_case_twice() -> dict:
    doc = _doc(REFERENCE)
    doc["cases"].append(257)
    return doc


def _ours_one_direction() -> dict:
    doc = _doc(GOOD)
    del doc["results"]["eager"]["vs numba"]["257"]
    return doc


@pytest.mark.parametrize("make, expected", [
    (_foreign_missing_case, 'results.diffusers["vs rl_kernel"]: no comparison for listed '
                            'case(s) "4097"'),
    (_foreign_extra_impl, "results.liger: compared with no other implementation"),
    (_foreign_case_twice, 'cases: each case id once, got "257" again'),
    (_ours_one_direction, 'results.eager["vs numba"]: case(s) "257" compared in one '
                          "direction only"),
])
def test_an_incomplete_report_is_flagged_alone_in_its_folder(tmp_path: Path, capsys,
                                                             make, expected: str) -> None:
    """A foreign report missing a case, or with an extra implementation, rendered with exit 0
    and no warning when alone in its folder; a case id listed twice became an extra row."""
    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "x.json").write_text(json.dumps(make()), encoding="utf-8")
    assert main(["report", "--reports", str(reports)]) == 3
    err = capsys.readouterr().err
    [warning] = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert expected in warning, warning


# ------------------------------------------------------------------------ 7. --cluster

@pytest.mark.parametrize("address", ["ray://[::1", "ray://[::1]", "::1:10001", "ray://a_b:1",
                                     "ray://host:0", "ray://host:65536", "ray://h/x:1",
                                     "ray://host:1 ", "ray://[zz::1]:1", "http://host:1"])
def test_a_malformed_cluster_address_is_refused_in_one_line(address: str) -> None:
    """``ray://[::1`` was tried (Ray's retries) rather than refused."""
    from gate_residual_matrix.runner.backends.ray.connect import parse_address

    with pytest.raises(ConfigError, match="expected ray://HOST:PORT") as err:
        parse_address(address)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("address", ["ray://[::1]:10001", "ray://10.0.0.1:10001",
                                     "node-1.example.org:6379", "ray://localhost:1"])
def test_well_formed_cluster_addresses_pass(address: str) -> None:
    from gate_residual_matrix.runner.backends.ray.connect import parse_address

    assert parse_address(address) == address


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_cli(tmp_path: Path, address: str, env: dict | None = None) -> subprocess.Popen:
    matrix = _write(tmp_path / "m.yaml", BASE)
    return subprocess.Popen([sys.executable, "-m", "gate_residual_matrix.runner", "matrix",
                             "--matrix", str(matrix),
                             "--reports", str(tmp_path / "r"), "--cluster", address],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env=None if env is None else {**os.environ, **env},
                            preexec_fn=_interactive_sigint)


def _interactive_sigint() -> None:
    """In the child before exec: SIGINT as an interactive shell leaves it (a test run started
    in the background inherits SIGINT ignored, which the command rightly keeps)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("scheme", ["ray://", ""])
def test_a_dead_cluster_address_is_one_line_in_seconds(tmp_path: Path, scheme: str) -> None:
    """``--cluster ray://127.0.0.1:1`` took about 97 s and printed Ray's warnings;
    ``127.0.0.1:1`` hung past 150 s."""
    import time

    pytest.importorskip("ray")
    start = time.monotonic()
    proc = _cluster_cli(tmp_path, f"{scheme}127.0.0.1:{_free_port()}")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert err.count("\n") == 1 and "cannot connect: Connection refused" in err, err
    assert time.monotonic() - start < 30
    assert not (tmp_path / "r").exists()


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never says anything (no Ray there)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(50)
    held: list = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], held
    server.close()
    for conn in held:
        conn.close()


def test_a_port_without_ray_is_one_line_within_the_stated_bound(tmp_path: Path,
                                                                 silent_port) -> None:
    import time

    pytest.importorskip("ray")
    from gate_residual_matrix.runner.backends.ray.connect import PROBE_TIMEOUT_S

    port, _ = silent_port
    start = time.monotonic()
    proc = _cluster_cli(tmp_path, f"127.0.0.1:{port}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 4 and err.count("\n") == 1, err
    assert "no gRPC server (Ray's GCS) answers" in err
    assert time.monotonic() - start < PROBE_TIMEOUT_S + 20


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 130)])
def test_a_signal_during_the_connect_is_one_line_and_128_plus_it(tmp_path: Path, silent_port,
                                                                 signum: int,
                                                                 code: int) -> None:
    """SIGTERM while connecting gave exit 15 after 23 s with no line (Ray's own handler)."""
    import time

    pytest.importorskip("ray")
    port, held = silent_port
    proc = _cluster_cli(tmp_path, f"ray://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while len(held) < 2 and time.monotonic() < deadline:  # the probe, then Ray Client
        time.sleep(0.05)
    assert len(held) >= 2, "Ray Client never connected"
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - sent < 10
    assert err.count("\n") == 1 and err.startswith("error: interrupted by SIG"), err


# ------------------------------------------------- 5. reading is bounded by what is shown

def _huge_foreign() -> dict:
    """The reference report listing 200,000 cases (the attack's 114 MB file also compared
    each; the count alone decides, so the file here stays small)."""
    doc = _doc(REFERENCE)
    doc["cases"] = list(range(1, 200_001))
    return doc


def _our_libraries() -> dict:
    doc = _doc(GOOD)
    doc["environment"]["libraries"] = {f"lib{i}": "1.0" for i in range(100_000)}
    return doc


def _our_implementations() -> dict:
    doc = _doc(GOOD)
    for i in range(1_001):
        doc["results"][f"impl{i}"] = {"status": "unavailable", "reason": "none"}
    return doc


@pytest.mark.parametrize("make, expected", [
    (_huge_foreign, "cases: 200000 case ids, more than the 20000 a report may have"),
    (_our_libraries, "environment.libraries: 100000 entries, more than the 1000"),
    (_our_implementations, "results: 1004 implementations, more than the 1000"),
])
def test_a_huge_report_is_flagged_not_expanded(tmp_path: Path, capsys, make,
                                               expected: str) -> None:
    """A foreign report of 200,000 cases took 270 s, 7.6 GB and wrote a 1.06 GB
    summary.json; 10^6 library entries made 1.8 GB of tables."""
    import time

    from gate_residual_matrix.runner.__main__ import main

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "host-plain-cuda.json").write_bytes(GOOD.read_bytes())
    (reports / "big.json").write_text(json.dumps(make()), encoding="utf-8")
    start = time.monotonic()
    assert main(["report", "--reports", str(reports)]) == 3
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    [warning] = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert "big.json: " + expected in warning, warning
    written = sum(p.stat().st_size for p in reports.rglob("*") if p.is_file()
                  and p.name not in ("big.json", "host-plain-cuda.json"))
    assert written < 2 << 20  # the tables of the one good report, and one line for big.json
