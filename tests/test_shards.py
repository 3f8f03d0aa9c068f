"""A cell run as several processes, each with part of its cases (runner/backends/shards.py, issue
11).

The end-to-end tests run tests/data/resume.yaml's four cases (three dtype groups) on the CPU
as three shards and check that the combined report has the bits of an unsharded run, that a
shard killed mid-case costs only its own missing cases (the next run resumes them), and that
a runner killed mid-cell leaves shards the next run combines and resumes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from test_resume import CELL, MATRIX, ROOT, bits, matrix_cli, report

from gate_residual_matrix.runner.backends import shards
from gate_residual_matrix.runner.config.matrix import load_matrix
from gate_residual_matrix.runner.reports.store import validate

SHARDED = ("--shards", "3")


def test_split_keeps_each_dtype_group_in_one_shard():
    m = load_matrix(ROOT / "matrix.yaml")
    for n in (6, 4, 2):
        parts = shards.split(m, m.cases, n)
        assert len(parts) == n
        assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in m.cases)
        for part in parts:
            assert part == sorted(part, key=m.cases.index)  # the matrix's order
        owner = {m.case_dtypes(c): i for i, p in enumerate(parts) for c in p}
        assert all(owner[m.case_dtypes(c)] == i for i, p in enumerate(parts) for c in p)
    six = shards.split(m, m.cases, 6)
    assert all(len({m.case_dtypes(c) for c in p}) == 1 for p in six)


def _resume_matrix(tmp_path):
    """tests/data/resume.yaml's cases, without its `fault` row (registered only in the
    runs that set GATE_RESIDUAL_FAULTS)."""
    path = tmp_path / "four.yaml"
    path.write_text(MATRIX.read_text().replace(", fault]", "]"))
    return load_matrix(path)


def test_more_shards_than_dtype_groups_halve_the_heaviest_group(tmp_path):
    m = _resume_matrix(tmp_path)
    assert len(shards.groups(m, m.cases)) == 3
    parts = shards.split(m, m.cases, 4)
    assert sorted(len(p) for p in parts) == [1, 1, 1, 1]
    assert len(shards.split(m, m.cases, 9)) == 4  # never more shards than cases


@pytest.mark.parametrize(("env", "target", "cpus", "want"), [
    (None, "cpu", 64, 1), (None, "cuda", 16, 6), (None, "cuda", 4, 2), (None, "cuda", 1, 1),
    ("auto", "cuda", 64, 6), ("3", "cpu", 2, 3), ("99", "cuda", 16, 30)])
def test_how_many_shards(monkeypatch, env, target, cpus, want):
    m = load_matrix(ROOT / "matrix.yaml")
    if env is None:
        monkeypatch.delenv(shards.ENV, raising=False)
    else:
        monkeypatch.setenv(shards.ENV, env)
    assert shards.count(m, m.cases, target, cpus) == want


WHY = "expected a positive integer (at most 6 digits) or 'auto'"


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "", " 2", "\u00b2", "1234567"])
def test_a_bad_shard_count_is_one_line_and_exit_2(tmp_path, bad):
    got = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix",
                          str(MATRIX),
                          "--reports", str(tmp_path / "r"), "--shards", bad],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        f"error: --shards: GATE_RESIDUAL_SHARDS={bad!r}: {WHY}"]
    assert list(tmp_path.iterdir()) == []


def test_a_bad_shard_count_in_the_environment_names_the_variable(tmp_path):
    got = subprocess.run([sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix",
                          str(MATRIX),
                          "--reports", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, shards.ENV: "abc"})
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [f"error: GATE_RESIDUAL_SHARDS='abc': {WHY}"]
    assert list(tmp_path.iterdir()) == []


def _part(status, cases, reason=None):
    return {"status": status, "reason": reason, "cases": cases, "inputs": {}}


def test_shards_that_ran_no_case_give_the_first_failure_with_every_reason(tmp_path):
    m = _resume_matrix(tmp_path)
    failed = shards.combine([_part("timeout", [], "ran out"), _part("oom", [], "killed")],
                            [["5"], ["6-float16-int64"]], m, wall_s=3.0)
    assert failed["status"] == "timeout" and failed["duration_s"] == 3.0
    assert failed["reason"] == "shard 1: timeout: ran out; shard 2: oom: killed"
    assert [p["status"] for p in failed["environment"]["shards"]["parts"]] == ["timeout", "oom"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(sharded run, its report, an unsharded run's report)."""
    one, many = (tmp_path_factory.mktemp(n) for n in ("unsharded", "sharded"))
    run = matrix_cli(many, *SHARDED)
    plain = matrix_cli(one)
    assert plain.returncode == 0, plain.stderr
    return run, report(many), report(one)


def test_a_sharded_cell_has_the_bits_of_an_unsharded_one(sharded):
    run, data, plain = sharded
    assert run.returncode == 0, run.stderr
    validate(data)
    assert data["status"] == "ok" and "cases_missing" not in data
    assert data["cases"] == plain["cases"] == [5, "6-float16-int64", "7-specials",
                                                "8-float32-int32"]
    assert bits(data) == bits(plain)
    assert data["fingerprint"] == plain["fingerprint"]
    parts = data["environment"]["shards"]["parts"]
    assert sorted(map(tuple, (p["cases"] for p in parts))) == [
        ("5", "7-specials"), ("6-float16-int64",), ("8-float32-int32",)]
    assert data["environment"]["gpu_lock"] is True
    assert list(data["phases"]["cases"]) == [str(c) for c in data["cases"]]
    assert "[runner] host-plain-cpu: case 4/4" in run.stdout


def test_a_killed_shard_costs_only_its_missing_cases(tmp_path, sharded):
    *_, plain = sharded
    stopped = matrix_cli(tmp_path, *SHARDED, env={"GATE_RESIDUAL_FAULT_KILL_ROWS": "7"})
    assert stopped.returncode == 5, stopped.stderr
    partial = report(tmp_path)
    validate(partial)
    assert partial["status"] == "partial"
    # 7 rows: case 7-specials, and case 8's batch invariance (its size sweep): two shards
    assert partial["cases"] == [5, "6-float16-int64"]
    assert partial["cases_missing"] == ["7-specials", "8-float32-int32"]
    assert partial["reason"].startswith("2 of 4 cases done; shard 1 stopped: partial: ")
    assert "shard 2 stopped: error: " in partial["reason"] and "SIGKILL" in partial["reason"]
    assert partial["reason"].count("the next run of this cell runs only the missing") == 1
    assert partial["exit_code"] == -9  # the killed shards' (SIGKILL), not 0
    parts = partial["environment"]["shards"]["parts"]
    assert [p["done"] for p in parts] == [["5"], [], ["6-float16-int64"]]
    resumed = matrix_cli(tmp_path, *SHARDED)
    assert resumed.returncode == 0, resumed.stderr
    assert "running the 2 missing" in resumed.stdout
    final = report(tmp_path)
    assert final["status"] == "ok" and bits(final) == bits(plain)
    assert not list(tmp_path.glob(".run-*"))
    # the first run's shards describe only its own cases: not kept beside another run's
    assert "shards" not in final["environment"]
    assert set(final["environment"]["case_runs"]) == {str(c) for c in final["cases"]}


def test_a_dead_runners_shards_are_combined_and_resumed(tmp_path, monkeypatch):
    """The runner is killed while one shard hangs in case 7-specials (under the shared GPU
    lock, so the others wait at their timing loops: a hung shard holds them up until the
    cell's timeout). The next run combines what the shards wrote and resumes the rest."""
    import test_resume

    # batch invariance up to 6 rows: only case 7-specials calls with 7 rows
    variant = tmp_path / "matrix.yaml"
    variant.write_text(MATRIX.read_text().replace("max_size: 8", "max_size: 6"))
    monkeypatch.setattr(test_resume, "MATRIX", variant)
    reports = tmp_path / "reports"
    reports.mkdir()
    proc = matrix_cli(reports, *SHARDED, env={"GATE_RESIDUAL_FAULT_HANG_ROWS": "7"},
                      wait=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the shard of 5 and 7-specials is in case 7
        found = list(reports.glob(f".run-*/shard-*/{CELL}.json"))
        if any(json.loads(p.read_text()).get("cases") == [5] for p in found
               if p.stat().st_size):
            break
        time.sleep(0.2)
    else:
        pytest.fail("no shard wrote its first case")
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(3)
    again = matrix_cli(reports, *SHARDED)
    assert again.returncode == 0, again.stderr
    assert "left by a run that died; kept partial report(s) of host-plain-cpu" in again.stdout
    assert "resuming: " in again.stdout
    final = report(reports)
    assert final["status"] == "ok" and not list(reports.glob(".run-*"))
    assert final["environment"]["case_runs"]["5"]["run_id"] != final["run_id"]
