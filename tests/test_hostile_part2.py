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

from runner import pipeline
from runner.backends import BACKENDS
from runner.cell import skeleton
from runner.config import load_matrix, parse_matrix
from runner.errors import ConfigError
from runner.report import read_report, write_report

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
        loaded = load_matrix(matrix_path)  # what `python -m runner cell --matrix` does
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
    real = pipeline._snapshot

    def spy(request):
        path = real(request)
        made.append(path)
        return path

    monkeypatch.setattr(pipeline, "_snapshot", spy)
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
    code = ("from runner.config import load_matrix; "
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
    from runner import pipeline
    from runner.backends import BACKENDS

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
        ["ok", str(ROOT / "runner" / "pipeline.py")]] * 2, outs
    report = read_report(tmp_path / "reports" / f"{CELL}.json").data
    assert report["cases"] == [1, 5, 7]
    assert set(report["results"]["eager"]["sha256"]) == {"1", "5", "7"}
