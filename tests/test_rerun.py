"""Re-runs: a cell whose report is current (same fingerprint, status ok) is not run again.

``run_matrix`` runs here with a fake host backend (no cell process), so each test sees
exactly which cells ran. The fingerprint covers the matrix content all cells share, the
cell's own stack (pins) and mode, its target, the selected cases, the project's commit,
dirty flag and uncommitted diff, and the backend's extras (a docker image id); a change to
another stack or mode leaves a cell alone. ``--force`` re-runs; failed cells always re-run.
A partial run (``--case``) merges its cases into the existing report, or refuses to when
that report holds cases of other code or another machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import yaml

from gate_residual_matrix.runner import pipeline as run_mod
from gate_residual_matrix.runner.backends.registry import BACKENDS
from gate_residual_matrix.runner.cell.run import fingerprint, skeleton
from gate_residual_matrix.runner.config.matrix import DockerStack, parse_matrix
from gate_residual_matrix.runner.outcome import CellOutcome, failed
from gate_residual_matrix.runner.plan.cells import Cell, select_cases
from gate_residual_matrix.runner.reports.store import read_report, write_report
from tests.committed_reports import COMMITTED

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "matrix.yaml"
BASE = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 1},
    "cases": [{"n": 1}, {"n": 2}], "implementations": ["eager", "numba", "fp64"],
    "baseline": "eager", "accuracy_reference": "fp64",
    "modes": {"plain": {}, "det": {"torch": {"deterministic": True}}},
    "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
}
CELLS = ["host-plain-cpu", "host-det-cpu"]


def digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


class FakeBackend:
    """Writes an ok (or, for ids in ``fail``, error) report at once; records each call.

    Like a real cell process it computes its own fingerprint (``skeleton``), which the
    runner must replace with its own. Per case it writes ``inputs`` and eager's ``sha256``,
    the latter a digest of (run id, case), so a test can tell which run made which case."""

    name = "host"
    calls: ClassVar[list[str]] = []
    fail: ClassVar[set[str]] = set()
    extra: ClassVar[dict] = {}
    torch: ClassVar[str] = "2.13.0"

    def available(self):
        return None

    def prepare(self, matrix, stacks, *, strict):
        return {}

    def fingerprint_extra(self, matrix, cell):
        return dict(FakeBackend.extra)

    def run(self, matrix, cell, cases, *, matrix_path, reports_dir, run_id, timeout_s):
        FakeBackend.calls.append(cell.id)
        status = "error" if cell.id in FakeBackend.fail else "ok"
        env = {"python": "3.12", "torch": FakeBackend.torch,
               "project": run_mod.project_state()}  # the checkout, as a cell process sees it
        report = skeleton(matrix, cell, cases, backend="host", run_id=run_id, status=status,
                          reason="failed on purpose" if status == "error" else None, env=env)
        if status == "ok":
            ids = [str(c) for c in report["cases"]]
            report["inputs"] = {c: {"n": int(c), "specials": False,
                                    "sha256": {"residual": digest(c)}} for c in ids}
            report["results"] = {"eager": {"status": "ok", "reason": None, "sha256": {
                c: {"out": digest(run_id, c)} for c in ids}, "mutated_inputs": {
                c: [] for c in ids}}}
        write_report(report, reports_dir)
        return report


class Project:
    """What ``project_state`` and ``uncommitted_digest`` say in this test."""

    def __init__(self) -> None:
        self.commit, self.dirty, self.diff = "ab" * 20, False, None

    def state(self):
        return {"commit": self.commit, "dirty": self.dirty}


@pytest.fixture
def project(monkeypatch) -> Project:
    p = Project()
    monkeypatch.setattr(run_mod, "project_state", p.state)
    monkeypatch.setattr(run_mod, "uncommitted_digest", lambda: p.diff)
    monkeypatch.setitem(BACKENDS, "host", FakeBackend)
    monkeypatch.setattr(FakeBackend, "calls", [])
    monkeypatch.setattr(FakeBackend, "fail", set())
    monkeypatch.setattr(FakeBackend, "extra", {})
    monkeypatch.setattr(FakeBackend, "torch", "2.13.0")
    return p


def run(tmp_path: Path, data: dict, **kw) -> list[CellOutcome]:
    matrix_path = tmp_path / "matrix.yaml"
    matrix_path.write_text(yaml.safe_dump(data, sort_keys=False))
    FakeBackend.calls = []
    return run_mod.run_matrix(matrix_path, reports_dir=tmp_path / "reports", render=False,
                              backend="host", **kw)


def fresh() -> dict:
    return json.loads(json.dumps(BASE))


def test_second_run_reuses_ok_cells_and_leaves_their_files(tmp_path, project):
    run(tmp_path, fresh())
    assert FakeBackend.calls == CELLS
    before = {c: (tmp_path / "reports" / f"{c}.json").read_bytes() for c in CELLS}
    outcomes = run(tmp_path, fresh())
    assert FakeBackend.calls == []
    assert [(o.cell, o.status, o.reused) for o in outcomes] == [(c, "ok", True) for c in CELLS]
    assert {c: (tmp_path / "reports" / f"{c}.json").read_bytes() for c in CELLS} == before


def test_force_reruns_current_cells(tmp_path, project):
    run(tmp_path, fresh())
    run(tmp_path, fresh(), force=True)
    assert FakeBackend.calls == CELLS


def test_failed_cells_rerun_by_default(tmp_path, project):
    FakeBackend.fail = {"host-det-cpu"}
    run(tmp_path, fresh())
    run(tmp_path, fresh())
    assert FakeBackend.calls == ["host-det-cpu"]
    FakeBackend.fail = set()
    run(tmp_path, fresh())
    assert FakeBackend.calls == ["host-det-cpu"]
    run(tmp_path, fresh())
    assert FakeBackend.calls == []


@pytest.mark.parametrize("status", ["mismatch", "timeout", "oom", "error", "skipped"])
def test_a_current_report_that_is_not_ok_is_rerun(tmp_path, project, status):
    run(tmp_path, fresh())
    path = tmp_path / "reports" / "host-det-cpu.json"
    data = read_report(path).data
    data.update(status=status, reason="as found")
    write_report(data, path.parent)
    run(tmp_path, fresh())
    assert FakeBackend.calls == ["host-det-cpu"]


@pytest.mark.parametrize("damage", [
    lambda t: t[: len(t) // 2], lambda t: "", lambda t: "[]",
    lambda t: t.replace('"schema_version": 2', '"schema_version": 9'),
], ids=["truncated", "empty", "not an object", "newer schema"])
def test_an_unreadable_report_is_rerun_not_fatal(tmp_path, project, damage):
    run(tmp_path, fresh())
    path = tmp_path / "reports" / "host-plain-cpu.json"
    path.write_text(damage(path.read_text()))
    run(tmp_path, fresh())
    assert FakeBackend.calls == ["host-plain-cpu"]
    assert read_report(path).ok


def test_the_runner_stamps_its_own_fingerprint(tmp_path, project):
    project.dirty, project.diff = True, "d1" * 32
    FakeBackend.extra = {"image_id": "sha256:" + "1" * 64}
    run(tmp_path, fresh())
    m = parse_matrix(fresh())
    identity = {"commit": project.commit, "dirty": True, "diff_sha256": "d1" * 32}
    for cell_id, mode in zip(CELLS, ("plain", "det"), strict=True):
        stored = read_report(tmp_path / "reports" / f"{cell_id}.json").data["fingerprint"]
        cell = Cell("host", mode, "cpu")
        assert stored == fingerprint(m, cell, m.cases, identity, FakeBackend.extra)
        child = skeleton(m, cell, m.cases, backend="host", run_id="x", status="ok",
                         env={"project": {"commit": None, "dirty": None}})["fingerprint"]
        assert stored != child  # what the (fake) cell process wrote was replaced


def _edit(path: list, value):
    def change(data, project):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _project(**kw):
    def change(data, project):
        for key, value in kw.items():
            setattr(project, key, value)
    return change


def _extra(value):
    def change(data, project):
        FakeBackend.extra = value
    return change


# (test id, change to the matrix data or the project, cells expected to run again)
CHANGES = [
    ("nothing", lambda d, p: None, []),
    ("problem seed", _edit(["problem", "seed"], 2), CELLS),
    ("dtype", _edit(["problem", "dtype"], "float16"), CELLS),
    ("a case more", _edit(["cases"], [{"n": 1}, {"n": 2}, {"n": 3}]), CELLS),
    ("implementations", _edit(["implementations"], ["eager", "fp64"]), CELLS),
    ("repeats", _edit(["repeats"], 5), CELLS),
    ("timing iters", _edit(["timing"], {"iters": 7}), CELLS),
    ("mode det's torch settings", _edit(["modes", "det", "torch"], {"tf32": False}),
     ["host-det-cpu"]),
    ("mode plain's env", _edit(["modes", "plain", "env"], {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
     ["host-plain-cpu"]),
    ("another mode added", _edit(["modes", "new"], {}), ["host-new-cpu"]),
    ("another stack added", _edit(["stacks", "host2"], {"kind": "host"}),
     ["host2-plain-cpu", "host2-det-cpu"]),
    ("project commit", _project(commit="cd" * 20), CELLS),
    ("dirty flag", _project(dirty=True, diff="d1" * 32), CELLS),
    ("backend extra (image id)", _extra({"image_id": "sha256:" + "2" * 64}), CELLS),
]


@pytest.mark.parametrize(("change", "expected"), [c[1:] for c in CHANGES],
                         ids=[c[0] for c in CHANGES])
def test_what_makes_a_cell_run_again(tmp_path, project, change, expected):
    data = fresh()
    run(tmp_path, data)
    change(data, project)
    run(tmp_path, data)
    assert FakeBackend.calls == expected


def test_a_different_uncommitted_diff_reruns_but_the_same_does_not(tmp_path, project):
    project.dirty, project.diff = True, "d1" * 32
    run(tmp_path, fresh())
    run(tmp_path, fresh())
    assert FakeBackend.calls == []
    project.diff = "d2" * 32
    run(tmp_path, fresh())
    assert FakeBackend.calls == CELLS


def report_of(tmp_path: Path, cell_id: str = "host-plain-cpu") -> dict:
    loaded = read_report(tmp_path / "reports" / f"{cell_id}.json")
    assert loaded.ok, loaded.problem
    return loaded.data


def by_case(tmp_path: Path, cell_id: str = "host-plain-cpu") -> dict:
    """{case: run id} of eager's ``out`` digests in a cell's report."""
    data = report_of(tmp_path, cell_id)
    runs = {r["run_id"] for r in data["environment"].get("case_runs", {}).values()}
    runs.add(data["run_id"])
    return {case: next(r for r in runs if digest(r, case) == sha["out"])
            for case, sha in data["results"]["eager"]["sha256"].items()}


def test_a_partial_run_of_current_cases_is_not_run_again(tmp_path, project):
    run(tmp_path, fresh())
    before = (tmp_path / "reports" / "host-plain-cpu.json").read_bytes()
    outcomes = run(tmp_path, fresh(), cases=["1"])
    assert FakeBackend.calls == []
    assert [(o.status, o.reused) for o in outcomes] == [("ok", True), ("ok", True)]
    assert (tmp_path / "reports" / "host-plain-cpu.json").read_bytes() == before


def test_a_partial_run_merges_its_case_into_the_report(tmp_path, project):
    """The regression: ``--case 2`` used to replace the whole report, dropping case 1."""
    run(tmp_path, fresh())
    first = report_of(tmp_path)["run_id"]
    outcomes = run(tmp_path, fresh(), cases=["2"], force=True)
    assert FakeBackend.calls == CELLS and {o.status for o in outcomes} == {"ok"}
    data = report_of(tmp_path)
    second = data["run_id"]
    assert data["cases"] == [1, 2] and list(data["inputs"]) == ["1", "2"]
    assert by_case(tmp_path) == {"1": first, "2": second}
    assert {c: r["run_id"] for c, r in data["environment"]["case_runs"].items()} == {
        "1": first, "2": second}
    m = parse_matrix(fresh())
    identity = {"commit": project.commit, "dirty": False, "diff_sha256": None}
    assert data["fingerprint"] == fingerprint(m, Cell("host", "plain", "cpu"), m.cases,
                                              identity, {})
    run(tmp_path, fresh())  # the merged report is current for a full run
    assert FakeBackend.calls == []
    assert not [p.name for p in (tmp_path / "reports").iterdir() if p.name.startswith(".")]


def test_partial_runs_build_a_report_case_by_case(tmp_path, project):
    run(tmp_path, fresh(), cases=["2"])
    run(tmp_path, fresh(), cases=["1"])
    assert FakeBackend.calls == CELLS
    assert report_of(tmp_path)["cases"] == [1, 2]
    run(tmp_path, fresh())
    assert FakeBackend.calls == []


def test_a_partial_run_over_a_report_of_other_code_is_refused(tmp_path, project):
    run(tmp_path, fresh())
    before = (tmp_path / "reports" / "host-plain-cpu.json").read_bytes()
    project.commit = "cd" * 20
    outcomes = run(tmp_path, fresh(), cases=["1"])
    assert FakeBackend.calls == []
    assert {o.status for o in outcomes} == {"refused"}
    assert failed(outcomes) == outcomes  # exit 5
    reason = outcomes[0].reason
    assert reason.startswith("not run: host-plain-cpu.json holds cases 1, 2 of another "
                             "fingerprint (made at commit abababababab, this checkout is at "
                             "cdcdcdcdcdcd)"), reason
    assert "add --force to replace it with these cases only" in reason
    assert (tmp_path / "reports" / "host-plain-cpu.json").read_bytes() == before
    outcomes = run(tmp_path, fresh(), cases=["1"], force=True)
    assert FakeBackend.calls == CELLS and {o.status for o in outcomes} == {"ok"}
    assert "replaced (--force)" in outcomes[0].reason
    assert report_of(tmp_path)["cases"] == [1]


def test_a_partial_run_on_another_machine_is_not_merged(tmp_path, project):
    run(tmp_path, fresh(), cases=["1"])
    before = (tmp_path / "reports" / "host-plain-cpu.json").read_bytes()
    FakeBackend.torch = "2.14.0"
    outcomes = run(tmp_path, fresh(), cases=["2"])
    assert FakeBackend.calls == CELLS  # ran: the environment is known only afterwards
    assert {o.status for o in outcomes} == {"refused"}
    assert "torch '2.13.0' -> '2.14.0'" in outcomes[0].reason
    assert (tmp_path / "reports" / "host-plain-cpu.json").read_bytes() == before


def test_a_failed_report_is_replaced_not_merged_into(tmp_path, project):
    FakeBackend.fail = {"host-plain-cpu"}
    run(tmp_path, fresh())
    FakeBackend.fail = set()
    outcomes = run(tmp_path, fresh(), cases=["1"])
    assert outcomes[0].status == "ok"
    assert outcomes[0].reason == ("replaced the existing error report (a failed report is not "
                                  "merged into)")
    assert report_of(tmp_path)["cases"] == [1]


def test_a_failing_partial_run_keeps_the_other_cases(tmp_path, project):
    run(tmp_path, fresh())
    first = report_of(tmp_path)["run_id"]
    FakeBackend.fail = {"host-plain-cpu"}
    outcomes = run(tmp_path, fresh(), cases=["2"], force=True)
    assert [o.status for o in outcomes] == ["error", "ok"]
    data = report_of(tmp_path)
    assert (data["status"], data["reason"]) == ("error", "failed on purpose")
    assert data["cases"] == [1, 2] and by_case(tmp_path) == {"1": first}
    assert list(data["inputs"]) == ["1"]
    run(tmp_path, fresh(), cases=["2"])  # not ok: runs again, and merges
    assert FakeBackend.calls == ["host-plain-cpu"]


def test_docker_stack_pins_move_only_their_own_cells():
    data = yaml.safe_load(MATRIX.read_text())
    m = parse_matrix(data)
    docker = [name for name, s in m.stacks.items() if isinstance(s, DockerStack)][:2]
    assert len(docker) == 2, "matrix.yaml has fewer than two docker stacks"
    changed = json.loads(json.dumps(data))
    changed["stacks"][docker[0]]["numpy"] = "2.4.5"
    m2 = parse_matrix(changed)
    project = {"commit": None, "dirty": None}
    cases = select_cases(m)
    for stack, moves in ((docker[0], True), (docker[1], False), ("host", False)):
        cell = Cell(stack, "plain", "cpu")
        same = fingerprint(m, cell, cases, project) == fingerprint(m2, cell, cases, project)
        assert same is not moves, stack


def test_target_and_extra_and_project_are_in_the_fingerprint():
    m = parse_matrix(fresh())
    cases, project = select_cases(m), {"commit": "ab" * 20, "dirty": False}
    base = fingerprint(m, Cell("host", "plain", "cpu"), cases, project)
    assert fingerprint(m, Cell("host", "plain", "cuda"), cases, project) != base
    assert fingerprint(m, Cell("host", "det", "cpu"), cases, project) != base
    assert fingerprint(m, Cell("host", "plain", "cpu"), cases, project, {"image_id": "x"}) != base
    assert fingerprint(m, Cell("host", "plain", "cpu"), cases, {**project, "dirty": True}) != base
    assert fingerprint(m, Cell("host", "plain", "cpu"), cases, project, {}) == base


def test_what_the_run_made_counts_in_the_fingerprint(tmp_path, project, monkeypatch):
    """A docker image built by the first run: its id is unknown before that run and known
    after it; the report must carry the latter, so that the next run reuses the cell."""
    FakeBackend.extra = {"image_id": None}
    build_and_run = FakeBackend.run

    def building(self, *args, **kw):
        FakeBackend.extra = {"image_id": "sha256:" + "3" * 64}
        return build_and_run(self, *args, **kw)

    monkeypatch.setattr(FakeBackend, "run", building)
    run(tmp_path, fresh())
    assert FakeBackend.calls == CELLS
    run(tmp_path, fresh())
    assert FakeBackend.calls == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host that cannot run cuda cells")
def test_a_cell_this_host_cannot_run_keeps_an_existing_report(tmp_path):
    """A CPU-only host must not replace the committed H200 report with a 'skipped' one."""
    import shutil

    from gate_residual_matrix.runner.pipeline import run_matrix

    committed = COMMITTED / "host-plain-cuda.json"
    shutil.copy(committed, tmp_path / committed.name)
    before = (tmp_path / committed.name).read_bytes()
    outcomes = run_matrix(Path("matrix.yaml"), reports_dir=tmp_path, stacks=["host"],
                          cases=["1"], backend="host", render=False)
    cuda = next(o for o in outcomes if o.cell == "host-plain-cuda")
    assert cuda.status == "skipped" and "kept the existing ok report" in cuda.reason
    assert (tmp_path / committed.name).read_bytes() == before
