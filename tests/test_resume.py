"""A stopped cell keeps its finished cases; the next run runs only the rest.

The cell process is killed in its third case (``GATE_RESIDUAL_FAULT_KILL_ROWS``: set in the
runner's environment, not in the matrix, so the fingerprint does not change). The runner
keeps a ``partial`` report of the first two cases; the next run of the same cell runs the
other two only and writes an ``ok`` report whose bits equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_residual_matrix.runner.reports.store import read_report, validate

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "tests" / "data" / "resume.yaml"
PINNED = {"GATE_RESIDUAL_COMMIT": "0123456789abcdef0123456789abcdef01234567",
          "GATE_RESIDUAL_FAULTS": "1", "GATE_RESIDUAL_PROGRESS": "plain"}
CELL = "host-plain-cpu"


def _hangup_default() -> None:
    """SIGHUP back to its default in the child: under ``nohup`` the test process ignores it,
    and the runner keeps a signal it was started with ignored (runner/__main__.py), so the
    SIGHUP case would test nohup rather than a closed terminal."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def matrix_cli(reports: Path, *extra: str, env: dict | None = None, wait: bool = True):
    argv = [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(MATRIX),
            "--reports",
            str(reports), "--target", "cpu", "--timeout", "120", *extra]
    full = {**os.environ, **PINNED, **(env or {})}
    if env is None:
        for name in ("GATE_RESIDUAL_FAULT_KILL_ROWS", "GATE_RESIDUAL_FAULT_HANG_ROWS"):
            full.pop(name, None)
    if not wait:  # the runner as a terminal starts it: SIGHUP not inherited as ignored
        return subprocess.Popen(argv, cwd=ROOT, env=full, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_hangup_default)
    return subprocess.run(argv, cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)


def report(reports: Path) -> dict:
    loaded = read_report(reports / f"{CELL}.json")
    assert loaded.ok, loaded.problem
    return loaded.data


def bits(data: dict) -> dict:
    """Everything a cell says about bits: inputs' and outputs' sha256, comparisons."""
    out = {"inputs": {k: v["sha256"] for k, v in data["inputs"].items()}}
    for impl, entry in data["results"].items():
        out[impl] = {k: entry.get(k) for k in ("sha256", "repeatable", "vs eager",
                                                "batch_invariant", "status")}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(stopped run, its partial report, resumed run, final report, uninterrupted report)."""
    stopped_dir, fresh_dir = (tmp_path_factory.mktemp(n) for n in ("stopped", "fresh"))
    stopped = matrix_cli(stopped_dir, env={"GATE_RESIDUAL_FAULT_KILL_ROWS": "7"})
    partial = report(stopped_dir)
    resumed = matrix_cli(stopped_dir)
    fresh = matrix_cli(fresh_dir)
    assert fresh.returncode == 0, fresh.stderr
    return stopped, partial, resumed, report(stopped_dir), report(fresh_dir)


def test_a_stopped_cell_keeps_its_finished_cases_as_a_partial_report(runs):
    stopped, partial, *_ = runs
    assert stopped.returncode == 5, stopped.stderr
    validate(partial)
    assert partial["status"] == "partial"
    assert partial["cases"] == [5, "6-float16-int64"]
    assert partial["cases_missing"] == ["7-specials", "8-float32-int32"]
    assert "SIGKILL" in partial["reason"] and "stopped after 2 of 4 cases" in partial["reason"]
    assert set(partial["inputs"]) == {"5", "6-float16-int64"}
    assert set(partial["results"]["numba"]["sha256"]) == {"5", "6-float16-int64"}
    assert "[runner] host-plain-cpu: case 2/4 (6-float16-int64)" in stopped.stdout


def test_the_next_run_runs_only_the_missing_cases(runs):
    _, partial, resumed, final, _ = runs
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming: 2 case(s) done, running the 2 missing" in resumed.stdout
    assert "case 1/2 (7-specials)" in resumed.stdout and "case 3/" not in resumed.stdout
    assert final["status"] == "ok" and "cases_missing" not in final
    assert final["cases"] == [5, "6-float16-int64", "7-specials", "8-float32-int32"]
    runs_of = final["environment"]["case_runs"]
    assert runs_of["5"]["run_id"] == runs_of["6-float16-int64"]["run_id"] == partial["run_id"]
    assert runs_of["7-specials"]["run_id"] == runs_of["8-float32-int32"]["run_id"] != partial[
        "run_id"]
    assert set(final["phases"]["cases"]) == {str(c) for c in final["cases"]}


def test_the_resumed_report_has_the_bits_of_an_uninterrupted_run(runs):
    *_, final, fresh = runs
    validate(final)
    assert fresh["status"] == "ok"
    assert bits(final) == bits(fresh)
    assert final["fingerprint"] == fresh["fingerprint"]


def test_phase_times_are_in_the_report_and_add_up(runs):
    *_, fresh = runs
    phases = fresh["phases"]
    assert set(phases) >= {"setup", "inputs", "runs", "hashing", "comparisons", "accuracy",
                           "batch_invariance", "timings", "compilation", "other", "cases"}
    assert set(phases["runs"]) == set(fresh["results"])
    assert set(phases["gpu_lock_wait"]) == {"shared", "exclusive", "drain", "long"}
    spent = sum(v for k, v in phases.items() if isinstance(v, float)
                and k not in ("compilation", "gpu_exclusive"))  # parts of the others
    spent += sum(phases["runs"].values())
    assert spent == pytest.approx(fresh["duration_s"], abs=0.05)


def _cell_pids(reports: Path) -> list[str]:
    # the cells read the run's snapshot of MATRIX (a copy of the same name) into a stage
    return subprocess.run(["pgrep", "-f", f"runner cell --matrix .*/{MATRIX.name} .*"
                           f"--reports {reports}/"],
                          capture_output=True, text=True).stdout.split()


def _gone(pid: str) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return True


def _hung_in_third_case(reports: Path):
    """Start the runner on a cell that hangs in its third case; return (runner process, cell
    pids) once the cell's first partial report is in its stage."""
    proc = matrix_cli(reports, env={"GATE_RESIDUAL_FAULT_HANG_ROWS": "7"}, wait=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stages = list(reports.glob(f".run-*/{CELL}.json"))
        if stages and "partial" in stages[0].read_text(errors="replace"):
            break
        time.sleep(0.2)
    cells = _cell_pids(reports)
    assert cells, "no cell process found"
    return proc, cells


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_keeps_the_finished_cases_and_ends_the_cell(tmp_path, signum, code):
    """SIGTERM or SIGHUP (a closed terminal) to the runner mid-cell: partial report kept,
    stage removed, the cell process gone within seconds, exit 128 + the signal."""
    path = tmp_path / f"{CELL}.json"
    proc, cells = _hung_in_third_case(tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    time.sleep(2)
    assert all(_gone(pid) for pid in cells), "a cell outlived its runner"
    data = json.loads(path.read_text())
    assert data["status"] == "partial" and data["cases"] and data["cases_missing"]
    assert not list(tmp_path.glob(".run-*"))


def test_a_dead_runners_stage_is_salvaged_by_the_next_run(tmp_path):
    """SIGKILL to the runner: its cell dies with it (parent-death signal), and the next run
    keeps the partial report it left and resumes it."""
    proc, cells = _hung_in_third_case(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(3)
    assert all(_gone(pid) for pid in cells), "a cell outlived its runner"
    assert list(tmp_path.glob(".run-*"))
    again = matrix_cli(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "left by a run that died; kept partial report(s) of host-plain-cpu" in again.stdout
    assert "resuming:" in again.stdout
    assert report(tmp_path)["status"] == "ok" and not list(tmp_path.glob(".run-*"))


def test_a_finished_report_in_the_stage_survives_a_stopped_runner(tmp_path):
    """The cell ended and wrote its final report into the stage, then the runner was stopped
    (SIGTERM at a deadline, seen on the H200) before putting it in place: the report is
    kept, stamped, not thrown away with the stage."""
    from gate_residual_matrix.runner.backends.staging import run_staged
    from gate_residual_matrix.runner.reports import store as report_io

    data = json.loads((ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").read_text())
    assert data["status"] == "ok" and data["cases"]
    cell_id = data["cell"]["id"]

    class EndsThenStopped:
        def run(self, matrix, cell, cases, *, matrix_path, reports_dir, run_id, timeout_s):
            report_io.write_report(data, reports_dir)
            raise KeyboardInterrupt

    class Cell:
        id = cell_id

    def stamp(report: dict) -> dict:
        return {**report, "fingerprint": "f" * 64}

    with pytest.raises(KeyboardInterrupt):
        run_staged(EndsThenStopped(), None, Cell(), [], None, matrix_path=MATRIX,
                   reports_dir=tmp_path, run_id="r1", timeout_s=10, stamp=stamp)
    kept = report(tmp_path) if cell_id == CELL else read_report(tmp_path / f"{cell_id}.json").data
    assert kept["status"] == "ok" and kept["cases"] == data["cases"]
    assert kept["fingerprint"] == "f" * 64
    assert not list(tmp_path.glob(".run-*"))


def test_phases_add_keeps_the_lock_waits_of_both_and_survives_an_older_format():
    from gate_residual_matrix.runner.cell import phases as ph

    a = {"timings": 1.0, "gpu_lock_wait": {"shared": 2.0, "exclusive": 0.5}, "gpu_exclusive": 1.0}
    b = {"timings": 2.0, "gpu_lock_wait": {"shared": 1.0, "exclusive": 0.25}}
    got = ph.add(a, b)
    assert got["gpu_lock_wait"] == {"shared": 3.0, "exclusive": 0.75}
    assert got["timings"] == 3.0 and got["gpu_exclusive"] == 1.0
    older = {"timings": 1.0, "gpu_lock_wait": 4.0}  # one number, as one commit wrote it
    assert ph.add(older, b)["gpu_lock_wait"] == {"shared": 1.0, "exclusive": 0.25}


def test_setup_parts_name_what_took_the_setup_and_stay_inside_it():
    import time

    from gate_residual_matrix.runner.cell import phases as ph

    clock = ph.PhaseClock(sync=False)
    with clock("setup"):
        with clock.part("environment"):
            pass  # under PART_MIN_S: not named
        with clock.part("slow_row"):
            time.sleep(ph.PART_MIN_S * 2)
    got = clock.as_report(total_s=clock.seconds["setup"])
    assert list(got["setup_parts"]) == ["slow_row"]
    assert ph.PART_MIN_S * 2 <= got["setup_parts"]["slow_row"] <= got["setup"]
    assert got["other"] == pytest.approx(0.0, abs=1e-3)  # a part is not a phase of its own
    shard = {"setup": 1.0, "setup_parts": {"slow_row": 0.5, "environment": 0.1}}
    summed = ph.add(shard, {"setup": 1.0, "setup_parts": {"environment": 0.6, "row": 0.2}})
    assert list(summed["setup_parts"].items()) == [  # longest first once summed
        ("environment", 0.7), ("slow_row", 0.5), ("row", 0.2)]
