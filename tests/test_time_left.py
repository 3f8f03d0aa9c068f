"""The cell's time-left estimate: from the cell's previous report where it has every case
left (scaled to this run's speed), else from this run's own rate."""

from __future__ import annotations

import json

from gate_residual_matrix.runner.backends.process import _case_seconds
from gate_residual_matrix.runner.cell.run import _progress
from tests.committed_reports import HOST_PLAIN_CPU


def test_after_the_first_case_the_previous_run_times_the_rest():
    """The first case paid for compiling: its own rate would say 3 x 20 s; the previous
    run's times of the cases left say 5 + 1 s."""
    per_case = {"1": 20.0}
    p = _progress(1, "1", per_case, [1.0, 1.0, 1.0], 20.0, left=["257", "257-specials"],
                  expected={"1": 18.0, "257": 5.0, "257-specials": 1.0})
    assert p["eta_s"] == 6.0
    own = _progress(1, "1", per_case, [1.0, 1.0, 1.0], 20.0)  # no previous run: own rate
    assert own["eta_s"] == 40.0


def test_a_slower_run_scales_the_previous_times():
    per_case = {"1": 20.0, "257": 10.0}  # twice as slow as before on the case after the first
    p = _progress(2, "257", per_case, [1.0, 1.0, 1.0], 30.0, left=["257-specials"],
                  expected={"1": 18.0, "257": 5.0, "257-specials": 1.5})
    assert p["eta_s"] == 3.0


def test_a_case_the_previous_run_lacks_falls_back_to_the_own_rate():
    per_case = {"1": 20.0, "257": 10.0}
    p = _progress(2, "257", per_case, [1.0, 1.0, 1.0], 30.0, left=["4097"],
                  expected={"1": 18.0, "257": 5.0})
    assert p["eta_s"] == 10.0


def test_previous_case_seconds_come_from_a_report_that_ran(tmp_path):
    assert _case_seconds(tmp_path, "host-plain-cpu") is None  # no report
    (tmp_path / "host-plain-cpu.json").write_text("{not json")
    assert _case_seconds(tmp_path, "host-plain-cpu") is None  # unreadable: no guide
    data = json.loads(HOST_PLAIN_CPU.read_text())
    data["phases"] = {**(data.get("phases") or {}), "cases": {"1": 7.5, "257": 4.25}}
    (tmp_path / "host-plain-cpu.json").write_text(json.dumps(data))
    got = _case_seconds(tmp_path, "host-plain-cpu")
    assert got == {str(k): float(v) for k, v in data["phases"]["cases"].items()}
    stage = tmp_path / ".run-0123" / "shard-1"  # where a backend runs the cell
    stage.mkdir(parents=True)
    assert _case_seconds(stage, "host-plain-cpu") == got
    data["status"] = "skipped"
    (tmp_path / "host-plain-cpu.json").write_text(json.dumps(data))
    assert _case_seconds(tmp_path, "host-plain-cpu") is None
