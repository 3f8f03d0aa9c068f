"""The matrix pipeline's named steps (runner/pipeline.py, runner/run.py) and this machine as
their site (runner/backends/local.py), each alone.

No cell process runs here: the host backend is a fake that writes a report at once, and no
Docker engine is asked (a docker backend that says it has none). The whole-run behaviour
(reuse, resume, exit codes, messages) is tested through ``run_matrix`` and the command line
in test_rerun.py, test_resume.py, test_cli.py and test_docker_backend.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from gate_residual_matrix.runner import pipeline
from gate_residual_matrix.runner.backends import local
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.local import LocalSite
from gate_residual_matrix.runner.backends.registry import BACKENDS
from gate_residual_matrix.runner.backends.site import Job
from gate_residual_matrix.runner.cell.run import skeleton
from gate_residual_matrix.runner.errors import BackendError, ConfigError
from gate_residual_matrix.runner.outcome import REFUSED, CellOutcome, failed, summary
from gate_residual_matrix.runner.pipeline import Request
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports.store import write_report
from gate_residual_matrix.runner.run import plan_cell, run_cells
from gate_residual_matrix.runner.status import Status

DATA = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 1},
    "cases": [{"n": 1}, {"n": 2}], "implementations": ["eager", "numba", "fp64"],
    "baseline": "eager", "accuracy_reference": "fp64",
    "modes": {"plain": {}, "det": {"torch": {"deterministic": True}}},
    "stacks": {"host": {"kind": "host"},
               "box": {"kind": "docker", "base_image": "gate-residual/base:bookworm-py3.11",
                       "python": "3.11", "torch": "2.13.0"}},
    "targets": ["cuda", "cpu"],
}


def ok_report(matrix, cell: Cell, cases, run_id: str) -> dict:
    """A valid ``ok`` report of ``cell`` (eager's bits only), as a cell process writes it."""
    env = {"python": "3.12", "torch": "2.13.0", "project": {"commit": "ab" * 20,
                                                            "dirty": False}}
    report = skeleton(matrix, cell, cases, backend="host", run_id=run_id, status="ok",
                      env=env)
    ids = [str(c) for c in report["cases"]]
    report["inputs"] = {c: {"n": int(c), "specials": False, "sha256": {"residual": "0" * 64}}
                        for c in ids}
    report["results"] = {"eager": {"status": "ok", "reason": None, "sha256": {
        c: {"out": "1" * 64} for c in ids}, "mutated_inputs": {c: [] for c in ids}}}
    return report


class NoEngine(DockerBackend):
    """A docker backend whose engine never answers (this machine has none)."""

    def available(self) -> str | None:
        return "no Docker engine answers (test)"


class Instant:
    """A host backend that writes an ok report at once and records the cells it ran."""

    name = "host"
    ran: ClassVar[list[str]] = []

    def available(self) -> str | None:
        return None

    def prepare(self, matrix, stacks, *, strict):
        return {}

    def fingerprint_extra(self, matrix, cell):
        return {}

    def run(self, matrix, cell, cases, *, matrix_path, reports_dir, run_id, timeout_s):
        Instant.ran.append(cell.id)
        report = ok_report(matrix, cell, cases, run_id)
        write_report(report, reports_dir)
        return report


@pytest.fixture
def request_(tmp_path: Path) -> Request:
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(DATA, sort_keys=False))
    return Request(path, tmp_path / "reports", backend="host", render=False)


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixed project state, no GPU, the instant host backend."""
    monkeypatch.setattr(pipeline, "project_state", lambda: {"commit": "ab" * 20,
                                                            "dirty": False})
    monkeypatch.setattr(local, "cuda_available", lambda: False)
    monkeypatch.setitem(BACKENDS, "host", Instant)
    monkeypatch.setattr(Instant, "ran", [])


def test_load_resolves_the_paths_and_parses_the_matrix(request_: Request) -> None:
    request, matrix = pipeline.load(request_)
    assert request.matrix_path.is_absolute() and request.reports_dir.is_absolute()
    assert matrix.op == "gate_residual" and list(matrix.stacks) == ["host", "box"]


@pytest.mark.parametrize(("change", "message"), [
    ({"timeout_s": 0.0}, "--timeout: expected a number of seconds > 0, got 0.0"),
    ({"gpus": "0;1"}, '--gpus: expected "all" or device ids like "0,1", got \'0;1\''),
])
def test_load_refuses_bad_options_whatever_the_backend(request_: Request, change: dict,
                                                       message: str) -> None:
    from dataclasses import replace

    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        pipeline.load(replace(request_, **change))


def test_choose_site_asks_the_engine_only_when_containers_may_run(
        request_: Request, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    monkeypatch.setattr(local, "DockerBackend", NoEngine)
    host = pipeline.choose_site(request_)
    assert (host.chosen, host.note, host.docker) == ("host", None, None)
    auto = pipeline.choose_site(replace(request_, backend="auto"))
    assert auto.chosen == "host" and auto.docker is None
    assert auto.note == "--backend auto: host, since no Docker engine answers (test)"
    with pytest.raises(BackendError, match=r"^--backend docker: no Docker engine answers"):
        pipeline.choose_site(replace(request_, backend="docker"))
    with pytest.raises(ConfigError, match=r"^--abba: runs its processes in A-B-B-A order"):
        pipeline.choose_site(replace(request_, cluster="ray://h:1", abba="det"))
    with pytest.raises(ConfigError, match=r"^--gpu-model: places cells on a cluster's nodes"):
        pipeline.choose_site(replace(request_, gpu_model="NVIDIA H200"))


def test_select_names_cells_and_cases(request_: Request) -> None:
    from dataclasses import replace

    request, matrix = pipeline.load(request_)
    every = pipeline.select(matrix, request)
    assert [c.id for c in every.cells] == ["host-plain-cuda", "host-plain-cpu", "host-det-cuda",
                                           "host-det-cpu", "box-plain-cuda", "box-plain-cpu",
                                           "box-det-cuda", "box-det-cpu"]
    assert not every.partial and [c.id for c in every.cases] == ["1", "2"]
    one = pipeline.select(matrix, replace(request, cases=["2"], targets=["cpu"]))
    assert one.partial and [c.id for c in one.cases] == ["2"]
    abba = pipeline.select(matrix, replace(request, abba="det", stacks=["host"]))
    assert [c.id for c in abba.cells] == ["host-plain-cuda", "host-plain-cpu"]
    with pytest.raises(ConfigError, match=r"^--abba: expected one of the modes"):
        pipeline.select(matrix, replace(request, abba="nope"))


def test_check_site_refuses_cuda_without_a_gpu(request_: Request, steady: None) -> None:
    from dataclasses import replace

    request, matrix = pipeline.load(request_)
    site = LocalSite("host")
    pipeline.check_site(matrix, pipeline.select(matrix, request), site, request)
    assert site.has_gpu is False  # the cuda cells are skipped later, not refused
    cuda = replace(request, targets=["cuda"])
    with pytest.raises(ConfigError, match=r"^--target: cuda was requested but torch sees no"):
        pipeline.check_site(matrix, pipeline.select(matrix, cuda), LocalSite("host"), cuda)


def test_prepare_on_the_host_names_each_docker_stack_once(
        request_: Request, capsys: pytest.CaptureFixture[str]) -> None:
    request, matrix = pipeline.load(request_)
    skipped = pipeline.prepare(matrix, pipeline.select(matrix, request),
                               LocalSite("host", has_gpu=False), request)
    assert list(skipped) == ["box"] and skipped["box"].startswith(
        "stack kind docker runs only in a container: this run uses the host backend")
    out = capsys.readouterr().out
    assert out.count("[runner] skipped docker stack(s) box: stack kind docker") == 1


def test_open_reports_cleans_up_and_holds_the_project_state(request_: Request,
                                                           steady: None) -> None:
    request, matrix = pipeline.load(request_)
    ctx = pipeline.open_reports(matrix, pipeline.select(matrix, request), request)
    assert request.reports_dir.is_dir()
    assert ctx.project == {"commit": "ab" * 20, "dirty": False, "diff_sha256": None}
    assert ctx.path(Cell("host", "plain", "cpu")) == request.reports_dir / "host-plain-cpu.json"


def test_plan_cell_runs_reuses_and_forces(request_: Request, steady: None) -> None:
    from dataclasses import replace

    request, matrix = pipeline.load(request_)
    selection = pipeline.select(matrix, request)
    ctx = pipeline.open_reports(matrix, selection, request)
    cell, host = Cell("host", "plain", "cpu"), Instant()
    first = plan_cell(ctx, host, cell, partial=False)
    assert first.action == "run" and [c.id for c in first.cases] == ["1", "2"]
    write_report(ctx.stamp(host, cell, ok_report(matrix, cell, ctx.cases, "r")),
                 ctx.reports_dir)
    again = plan_cell(ctx, host, cell, partial=False)
    assert (again.action, again.note) == ("reuse", "same fingerprint: not run again")
    forced = plan_cell(replace(ctx, force=True), host, cell, partial=False)
    assert forced.action == "run"


def test_run_cells_skips_runs_and_reuses(request_: Request, steady: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    request, matrix = pipeline.load(request_)
    selection = pipeline.select(matrix, request)
    site = LocalSite("host")
    pipeline.check_site(matrix, selection, site, request)
    skipped = pipeline.prepare(matrix, selection, site, request)
    ctx = pipeline.open_reports(matrix, selection, request)
    outcomes = run_cells(ctx, selection.cells, site, skipped, partial=selection.partial)
    assert [(o.cell, o.status) for o in outcomes] == [
        ("host-plain-cuda", Status.SKIPPED), ("host-plain-cpu", Status.OK),
        ("host-det-cuda", Status.SKIPPED), ("host-det-cpu", Status.OK),
        *[(f"box-{m}-{t}", Status.SKIPPED) for m in ("plain", "det") for t in ("cuda", "cpu")]]
    assert Instant.ran == ["host-plain-cpu", "host-det-cpu"]
    assert outcomes[4].reason == pipeline.STACK_SKIPPED  # named once, at the start
    out = capsys.readouterr().out  # one line per reason, not one per cell
    assert ("[runner] skipped 2 cells (host-plain-cuda, host-det-cuda): target cuda: torch "
            "sees no CUDA") in out, out
    assert "[runner] cell host-plain-cuda: skipped" not in out
    saved = json.loads((ctx.reports_dir / "host-plain-cpu.json").read_text())
    assert saved["fingerprint"] == ctx.fingerprint(Instant(), Cell("host", "plain", "cpu"))
    again = run_cells(ctx, selection.cells, site, skipped, partial=selection.partial)
    assert [o.reused for o in again if o.status == Status.OK] == [True, True]
    assert Instant.ran == ["host-plain-cpu", "host-det-cpu"]


def test_outcomes_are_typed_and_refused_is_a_failure(tmp_path: Path) -> None:
    ok = CellOutcome("a", Status.OK, None, tmp_path / "a.json", reused=True)
    refused = CellOutcome("b", REFUSED, "not run: other code", tmp_path / "b.json")
    skipped = CellOutcome("c", Status.SKIPPED, "no GPU", tmp_path / "c.json")
    assert failed([ok, refused, skipped]) == [refused]
    lines = summary([ok, refused, skipped]).splitlines()
    assert lines[0] == "3 cells: 1 ok (1 reused), 1 skipped, 1 refused"
    assert lines[1] == "skipped: 1 cell (c): no GPU"
    assert [line.split()[:2] for line in lines[2:]] == [["cell", "status"], ["------", "--------"],
                                                        ["b", "refused"]]


def test_the_summary_collapses_skipped_cells_and_lists_only_the_failed_ones(
        tmp_path: Path) -> None:
    """46 skipped cells of two reasons are two lines; ok cells are a count, not rows."""
    engine = [CellOutcome(f"s{i}", Status.SKIPPED, "no Docker engine", tmp_path / "s.json")
              for i in range(40)]
    gpu = [CellOutcome(f"g{i}", Status.SKIPPED, "no CUDA device", tmp_path / "g.json")
           for i in range(6)]
    ok = [CellOutcome("a", Status.OK, None, tmp_path / "a.json"),
          CellOutcome("b", Status.OK, None, tmp_path / "b.json", reused=True)]
    oom = CellOutcome("c", Status.OOM, "out of memory", tmp_path / "c.json")
    lines = summary([*engine, ok[0], *gpu, oom, ok[1]]).splitlines()
    assert lines[:3] == ["49 cells: 2 ok (1 reused), 46 skipped, 1 oom",
                         "skipped: 40 cells (s0, s1, s2, +37 more): no Docker engine",
                         "skipped: 6 cells (g0, g1, g2, +3 more): no CUDA device"]
    assert [line.split()[:2] for line in lines[5:]] == [["c", "oom"]] and len(lines) == 6
    assert summary([]) == "0 cells: none selected"


def test_the_local_site_opens_closes_and_runs_each_cell_at_drain(
        request_: Request, steady: None) -> None:
    """Opening and closing this machine's site asks nothing; a submitted cell runs only when
    the site is drained, and its report comes back stamped."""
    request, matrix = pipeline.load(request_)
    ctx = pipeline.open_reports(matrix, pipeline.select(matrix, request), request)
    site = pipeline.choose_site(request)
    site.open()
    cell, host = Cell("host", "plain", "cpu"), Instant()
    site.submit(Job(0, cell, ctx.cases, "r" * 32, "host", ctx.batch(),
                    lambda report: ctx.stamp(host, cell, report)))
    assert Instant.ran == []
    got: list = []
    site.drain(lambda job, report: got.append((job.key, report)))
    site.close()
    assert Instant.ran == ["host-plain-cpu"] and [k for k, _ in got] == [0]
    assert got[0][1]["fingerprint"] == ctx.fingerprint(host, cell)


def test_render_tables_turns_an_os_error_into_a_report_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gate_residual_matrix.runner import tables
    from gate_residual_matrix.runner.errors import ReportError

    def refuse(reports_dir):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tables, "write_tables", refuse)
    with pytest.raises(ReportError, match=r"cannot write the tables: Permission denied$"):
        pipeline.render_tables(tmp_path)


def test_the_cell_process_runs_exactly_one_cell(request_: Request) -> None:
    from gate_residual_matrix.runner.backends.process import run_cell_process

    with pytest.raises(ConfigError, match=r"^cell: the selection matches 2 cells; name one"):
        run_cell_process(request_.matrix_path, request_.reports_dir, stacks=["host"],
                         modes=["plain"], targets=None, cases=["1"])
    assert not request_.reports_dir.exists()  # refused before anything was written


def test_the_cell_process_writes_its_report(request_: Request,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from gate_residual_matrix.runner.backends.process import run_cell_process
    from gate_residual_matrix.runner.reports.store import read_report

    monkeypatch.setenv("GATE_RESIDUAL_PROGRESS", "off")
    cell_id, status, path = run_cell_process(
        request_.matrix_path, request_.reports_dir, stacks=["host"], modes=["plain"],
        targets=["cpu"], cases=["1"], run_id="r1", timings=False)
    report = read_report(path).data
    assert (cell_id, path.name) == ("host-plain-cpu", "host-plain-cpu.json")
    assert report is not None and (report["status"], report["run_id"]) == (status, "r1")
    assert report["environment"]["mode_applied_before_torch_import"] is False  # in pytest


def test_skipped_cells_that_keep_earlier_reports_share_their_reasons_line(
        tmp_path: Path) -> None:
    """A skipped cell whose file holds an earlier run's report says so in its reason (the GPU
    and the date); the summary groups it with the other cells skipped for the same reason
    and counts the kept reports, rather than one line per report."""
    no_gpu = "target cuda: torch sees no CUDA device on this host"
    tails = [f"; kept the existing ok report (NVIDIA H200, 2026-12-0{i + 1}T18:05:30Z)"
             for i in range(5)]
    kept = [CellOutcome(f"k{i}", Status.SKIPPED, no_gpu + tail, tmp_path / "k.json", kept=tail)
            for i, tail in enumerate(tails)]
    bare = CellOutcome("n", Status.SKIPPED, no_gpu, tmp_path / "n.json")
    tail = "; kept the existing partial report (no GPU, 2026-11-30T00:38:52Z)"
    partial = CellOutcome("p", Status.SKIPPED, "no Docker engine" + tail, tmp_path / "p.json",
                          kept=tail)
    assert summary([*kept, bare, partial]).splitlines() == [
        "7 cells: 7 skipped",
        f"skipped: 6 cells (k0, k1, k2, +3 more): {no_gpu} (5 with their earlier reports kept)",
        "skipped: 1 cell (p): no Docker engine (its earlier report kept)"]
