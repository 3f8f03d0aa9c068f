"""The job's time left (runner/cell/job_clock.py): the previous reports' times, scaled by how this
run's finished cells compared with theirs; cells that will not run leave the count, and a
report that cannot give a time gives none."""

from __future__ import annotations

import json
from pathlib import Path

from gate_residual_matrix.runner.cell import job_clock
from gate_residual_matrix.runner.cell.job_clock import JobClock, previous_seconds


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_estimate_scales_the_previous_times_by_this_runs_pace():
    now = Clock()
    clock = JobClock({"a": 40.0, "b": 20.0, "c": 60.0}, now=now)
    assert clock.starting("a") == "job: 0 of 3 cells done, elapsed 0 s, about 2 min 00 s left"
    now.t += 20.0  # a took half its previous time: the rest should too
    assert clock.starting("b") == "job: 1 of 3 cells done, elapsed 20 s, about 40 s left"
    now.t += 10.0
    assert clock.starting("c") == "job: 2 of 3 cells done, elapsed 30 s, about 30 s left"


def test_cells_that_will_not_run_leave_the_count_and_new_ones_join_it():
    now = Clock()
    clock = JobClock({"a": 30.0, "reused": 500.0}, now=now)
    clock.drop("reused")
    clock.expect("late", None)
    assert clock.starting("a") == ("job: 0 of 2 cells done, elapsed 0 s, about 30 s left "
                                   "(+1 cell without a previous report's time)")
    now.t += 60.0
    clock.drop("a")  # a started cell stays counted
    assert clock.starting("late") == ("job: 1 of 2 cells done, elapsed 1 min 00 s (+1 cell "
                                      "without a previous report's time)")


def test_no_clock_no_words():
    assert job_clock.starting("a") == ""
    with job_clock.start({"a": 5.0}):
        assert job_clock.starting("a").startswith("; job: 0 of 1 cells done")
    assert job_clock.starting("a") == ""


def test_a_report_gives_its_time_only_when_it_ran_cases(tmp_path: Path):
    def write(name: str, text: str) -> None:
        (tmp_path / f"{name}.json").write_text(text)

    write("ok", json.dumps({"status": "ok", "duration_s": 42.5}))
    write("skipped", json.dumps({"status": "skipped", "duration_s": 0.1}))
    write("list", "[1, 2]")
    write("broken", "{not json")
    write("bool", json.dumps({"status": "ok", "duration_s": True}))
    write("negative", json.dumps({"status": "partial", "duration_s": -3}))
    (tmp_path / "dir.json").mkdir()
    assert previous_seconds(tmp_path, "ok") == 42.5
    for name in ("skipped", "list", "broken", "bool", "negative", "dir", "missing"):
        assert previous_seconds(tmp_path, name) is None, name


def test_the_accuracy_script_reads_the_job_lines(tmp_path: Path, capsys):
    """scripts/eta_accuracy.py compares each job estimate with the time to the last cell's
    "done" (its start plus its own elapsed time)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "eta_accuracy.py"
    spec = importlib.util.spec_from_file_location("eta_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    log = tmp_path / "job.log"
    log.write_text("\n".join([
        "12:00:00 [runner] cell a: running 3 case(s) on host; job: 0 of 2 cells done, "
        "elapsed 0 s, about 2 min 00 s left",
        "[runner] a: case 3/3 (x) 1.0 s; elapsed 58 s, done",
        "[runner] cell b: running 3 case(s) on host; job: 1 of 2 cells done, elapsed "
        "1 min 00 s, about 1 min 00 s left (+1 cell without a previous report's time)",
        "[runner] b: case 3/3 (x) 11.0 s; elapsed 1 min 40 s, done"]) + "\n")
    jobs = module.job_estimates(log.read_text().splitlines())
    assert [(j["eta_s"], j["actual_s"]) for j in jobs] == [(120.0, 160.0), (60.0, 100.0)]
    assert module.main([str(log)]) == 0
    assert "1 of 2 estimates with >= 10 s left were within 25%" in capsys.readouterr().out
