"""``gpu-host``: the step runner, the source stamp and the options (no GPU: fake steps)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.gpu_host import ahead, command, modes, procedure, stamp
from gate_residual_matrix.runner.gpu_host.steps import TIMEOUT_RC, HostRun, run_steps

ROOT = Path(__file__).resolve().parents[1]


def _fails(run: HostRun) -> int:
    print("about to fail")
    return 3


def _raises(run: HostRun) -> int:
    raise RuntimeError("a defect in a step")


def _child(run: HostRun) -> int:
    print("from python", flush=True)
    return run.child([sys.executable, "-c", "import sys; print('from the child'); "
                      "print('child stderr', file=sys.stderr)"])


def _record(out: Path) -> dict:
    return json.loads((out / "steps.json").read_text())


def test_a_failing_step_does_not_stop_the_others(tmp_path):
    run = HostRun(out=tmp_path / "out", root=tmp_path)
    results = run_steps(run, {"first": _fails, "second": _raises, "third": _child})

    assert [(r.name, r.status, r.rc) for r in results] == [
        ("first", "failed", 3), ("second", "failed", 1), ("third", "ok", 0)]
    record = _record(run.out)
    assert record["schema_version"] == 1
    assert [(s["name"], s["status"], s["rc"], s["log"]) for s in record["steps"]] == [
        ("first", "failed", 3, "first.log"), ("second", "failed", 1, "second.log"),
        ("third", "ok", 0, "third.log")]
    assert all(isinstance(s["wall_s"], float) and s["wall_s"] >= 0 for s in record["steps"])
    assert (run.out / "first.log").read_text() == "about to fail\n"
    assert "RuntimeError: a defect in a step" in (run.out / "second.log").read_text()
    third = (run.out / "third.log").read_text()
    assert "from python" in third and "from the child" in third and "child stderr" in third


def test_the_deadline_stops_a_child_and_skips_later_steps(tmp_path):
    def slow(run: HostRun) -> int:
        return run.child([sys.executable, "-c", "import time; time.sleep(60)"])

    run = HostRun(out=tmp_path / "out", root=tmp_path, deadline=time.monotonic() + 2)
    started = time.monotonic()
    results = run_steps(run, {"slow": slow, "later": lambda run: 0})

    assert time.monotonic() - started < 30
    assert [(r.status, r.rc) for r in results] == [("timeout", TIMEOUT_RC), ("not run", None)]
    assert [s["status"] for s in _record(run.out)["steps"]] == ["timeout", "not run"]


def test_an_interruption_is_recorded_and_goes_on(tmp_path):
    def interrupted(run: HostRun) -> int:
        raise KeyboardInterrupt

    run = HostRun(out=tmp_path / "out", root=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_steps(run, {"ok": lambda run: 0, "stopped": interrupted, "never": lambda run: 0})
    assert [(s["name"], s["status"], s["rc"]) for s in _record(run.out)["steps"]] == [
        ("ok", "ok", 0), ("stopped", "interrupted", 130)]


@pytest.fixture
def fake_steps(monkeypatch, tmp_path):
    """The command with fake steps, a project root without a stamp, and one matrix file."""
    calls = []

    def ok(run: HostRun) -> int:
        calls.append(("ok", run.modes, run.jobs, run.target))
        return 0

    def bad(run: HostRun) -> int:
        calls.append(("bad",))
        return 1

    monkeypatch.setattr(procedure, "STEPS", {"env": ok, "tests": bad, "modes": ok})
    monkeypatch.setattr(command, "PROJECT_ROOT", tmp_path)
    return calls


def _cli(tmp_path, *args: str) -> int:
    return main(["gpu-host", "--out", str(tmp_path / "out"), "--matrix",
                 str(ROOT / "matrix-rms-norm.yaml"), *args])


def test_exit_code_is_1_when_a_step_failed_and_every_step_ran(tmp_path, fake_steps, capsys):
    code = _cli(tmp_path, "--steps", "env,tests,modes", "--mode", "plain", "--jobs", "2")
    assert code == 1
    assert fake_steps == [("ok", ("plain",), 2, "cuda"), ("bad",), ("ok", ("plain",), 2, "cuda")]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: 1 of 3 steps did not end ok: tests (failed, rc 1); logs in "
                   f"{tmp_path / 'out'}"]
    record = _record(tmp_path / "out")
    assert [s["status"] for s in record["steps"]] == ["ok", "failed", "ok"]
    assert record["options"]["modes"] == ["plain"]
    assert record["source"]["matches"] is None


def test_exit_code_is_0_when_every_step_is_ok(tmp_path, fake_steps):
    assert _cli(tmp_path, "--steps", "modes,env", "--target", "cpu") == 0
    assert [c[0] for c in fake_steps] == ["ok", "ok"]
    every = ("plain", "deterministic", "tf32", "inference", "vllm_batch_invariant",
             "sglang_ieee")
    assert fake_steps[0][1] == every and fake_steps[0][3] == "cpu"


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "env,nope"], "--steps: expected step names from env, tests, modes, got 'nope'"),
    (["--steps", "env,env"], "--steps: a step is named twice"),
    (["--jobs", "0"], "--jobs: expected auto or a whole number >= 1, got '0'"),
    (["--case", "nosuch"], "--case: no matrix file has case 'nosuch'; 1, 255, 256"),
    (["--jobs", "9" * 5000 + "x"], "--jobs: expected auto or a whole number >= 1, got '999"),
    (["--jobs", "two"], "--jobs: expected auto or a whole number >= 1, got 'two'"),
    (["--timeout", "-5"], "--timeout: expected a number of seconds > 0, got -5"),
    (["--target", "gpu"], "--target: expected one of cuda, cpu, got 'gpu'"),
    (["--mode", "nope"], "--mode: expected a mode of the matrix files (plain, deterministic"),
    (["--stamp", "--steps", "env"], "--stamp: records the source and exits"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_option_is_one_line_and_exit_2(tmp_path, fake_steps, capsys, args, message):
    assert _cli(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert fake_steps == [] and not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused(tmp_path, fake_steps, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["gpu-host", "--out", str(tmp_path / "file"), "--steps", "env"]) == 2
    assert "--out: expected a folder" in capsys.readouterr().err


# --- the source stamp --------------------------------------------------------------------

@pytest.fixture
def checkout(tmp_path):
    """A git checkout with a few source files, committed."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    root = tmp_path / "repo"
    (root / "gate_residual_matrix").mkdir(parents=True)
    (root / "gate_residual_matrix" / "a.py").write_text("A = 1\n")
    (root / "gate_residual_matrix" / "__pycache__").mkdir()
    (root / "gate_residual_matrix" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (root / "matrix.yaml").write_text("op: x\n")
    (root / "README.md").write_text("readme\n")
    (root / "reports").mkdir()
    (root / "reports" / "r.json").write_text("{}\n")
    (root / ".gitignore").write_text("__pycache__/\n/.carry/\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, text=True,
                              capture_output=True).stdout

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return root, git("rev-parse", "HEAD").strip()


def test_a_stamp_matches_its_own_files(checkout):
    root, head = checkout
    written = stamp.write_stamp(root)
    assert written["commit"] == head
    assert sorted(written["files"]) == ["README.md", "gate_residual_matrix/a.py", "matrix.yaml"]
    assert json.loads((root / ".carry" / "source.json").read_text()) == written
    environ: dict = {}
    checked = stamp.apply_stamp(root, environ)
    assert checked["matches"] is True
    assert environ == {"GATE_RESIDUAL_COMMIT": head, "GATE_RESIDUAL_DIRTY": "0"}


@pytest.mark.parametrize(("change", "named"), [
    (lambda root: (root / "README.md").write_text("edited\n"), "README.md, changed"),
    (lambda root: (root / "matrix.yaml").unlink(), "matrix.yaml, missing"),
    (lambda root: (root / "gate_residual_matrix" / "b.py").write_text(""),
     "gate_residual_matrix/b.py, extra"),
])
def test_a_copy_that_differs_sets_no_commit(checkout, change, named):
    root, _ = checkout
    stamp.write_stamp(root)
    shutil.rmtree(root / ".git")  # the GPU host's copy: no git
    change(root)
    environ: dict = {}
    checked = stamp.apply_stamp(root, environ)
    assert checked["matches"] is False and named in checked["note"]
    assert environ == {}


def test_a_digest_is_that_of_sha256sum_over_the_sorted_files(checkout):
    root, _ = checkout
    written = stamp.write_stamp(root)
    lines = "".join(f"{written['files'][p]}  {p}\n" for p in
                    ("README.md", "gate_residual_matrix/a.py", "matrix.yaml"))
    import hashlib

    assert written["digest"] == hashlib.sha256(lines.encode()).hexdigest()


def test_stamping_a_dirty_tree_is_one_line_and_exit_2(checkout, monkeypatch, capsys):
    root, _ = checkout
    (root / "gate_residual_matrix" / "a.py").write_text("A = 2\n")
    (root / "reports" / "r.json").write_text('{"new": 1}\n')  # reports do not count
    monkeypatch.setattr(command, "PROJECT_ROOT", root)
    assert main(["gpu-host", "--stamp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --stamp: commit first: 1 tracked file(s) changed "
                   "(first: gate_residual_matrix/a.py)"]
    assert not (root / ".carry").exists()


def test_stamping_without_git_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "PROJECT_ROOT", tmp_path)
    assert main(["gpu-host", "--stamp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stamp: needs git and a checkout" in err[0]


def test_an_unreadable_stamp_is_a_note_not_an_error(tmp_path):
    (tmp_path / ".carry").mkdir()
    (tmp_path / ".carry" / "source.json").write_text("[1, 2]")
    environ: dict = {}
    checked = stamp.apply_stamp(tmp_path, environ)
    assert checked["matches"] is None and "unreadable" in checked["note"] and environ == {}


# --- the steps' helpers ------------------------------------------------------------------

def test_resume_copies_only_the_reports_that_are_missing(tmp_path):
    carried = tmp_path / ".carry" / "resume"
    carried.mkdir(parents=True)
    (carried / "a.json").write_text("carried a")
    (carried / "b.json").write_text("carried b")
    reports = tmp_path / "out" / "reports"
    reports.mkdir(parents=True)
    (reports / "a.json").write_text("this run's a")
    assert modes.resume(HostRun(out=tmp_path / "out", root=tmp_path), reports) == ["b.json"]
    assert (reports / "a.json").read_text() == "this run's a"
    assert (reports / "b.json").read_text() == "carried b"


def test_the_tests_step_takes_every_file_with_gpu_tests():
    files = procedure.gpu_test_files(ROOT)
    assert "tests/test_kernels_gpu.py" in files and "tests/test_op_input.py" in files
    assert "tests/test_gpu_host.py" not in files and "tests/test_config.py" not in files


# --- the modes step's order, deadline and failures (the runner's functions faked) ---------

class _Run(HostRun):
    """A run whose child processes (RL-Kernel's build) are only recorded."""

    started: list

    def start(self, argv, *, env=None):
        self.started = [*getattr(self, "started", []), list(argv)]
        return None

    def finish(self, proc) -> int:
        return 0


def fake_queue(monkeypatch, between=None, seen=None, at_end=None):
    """The compile-ahead with its plans and its queue faked: ``mode_plans`` gives each mode
    one call (recorded in ``seen["plans"]``), ``run_jobs`` hears every first-wave part, calls
    ``between(kw)`` (its keyword arguments), says the first wave is over, then hears the
    later parts, then calls ``at_end()``; ``seen["timeout_s"]`` as given."""
    from gate_residual_matrix.runner.cell import precompile
    from gate_residual_matrix.runner.gpu_host import compile_queue

    seen = {"plans": []} if seen is None else seen

    def mode_plans(path, *, target, modes, cases=None):
        seen["plans"].append((Path(path).name, tuple(modes), target, cases))
        return {}, [precompile.ModePlan(m, [{"impl": "x"}], {}, {}, "k", "op", {})
                    for m in modes]

    def run_jobs(jobs, *, workers, timeout_s, on_part=None, on_first_over=None, say=None):
        seen.update(timeout_s=timeout_s, workers=workers)
        for first in (True, False):
            for job in (j for j in jobs if j.first == first):
                for path, _ in job.parts:
                    on_part(path, job.mode, "compiled")
            if first:
                if between is not None:
                    between(locals() | {"workers": workers})
                on_first_over()
        if at_end is not None:
            at_end()
        return {"workers": workers, "calls": 0, "seconds": 0.0, "failed": []}

    monkeypatch.setattr(precompile, "mode_plans", mode_plans)
    monkeypatch.setattr(compile_queue, "run_jobs", run_jobs)
    return seen


@pytest.fixture
def cells(monkeypatch):
    """run_matrix and the precompile faked: the calls, in order; ``fail`` names the
    (file, mode) whose run raises a ConfigError."""
    from gate_residual_matrix.runner import pipeline
    from gate_residual_matrix.runner.errors import ConfigError
    from gate_residual_matrix.runner.outcome import CellOutcome

    calls: dict = {"cells": [], "plans": [], "fail": set(), "status": "ok"}

    def run_matrix(path, *, reports_dir, modes, targets, cases, timeout_s, **kw):
        calls["cells"].append((Path(path).name, modes[0], targets[0], cases, kw["backend"]))
        if (Path(path).name, modes[0]) in calls["fail"]:
            raise ConfigError("a file that cannot run")
        return [CellOutcome(f"{Path(path).stem}-{modes[0]}", calls["status"], None, reports_dir)]

    monkeypatch.setattr(pipeline, "run_matrix", run_matrix)
    fake_queue(monkeypatch, seen=calls)
    return calls


FILES = (ROOT / "matrix-rms-norm.yaml", ROOT / "matrix-scale-shift.yaml")


def test_modes_run_mode_by_mode_after_one_precompile_per_file(tmp_path, cells):
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("tf32", "plain"))
    assert modes.run_modes(run) == 0
    assert sorted(cells["plans"]) == [
        ("matrix-rms-norm.yaml", ("tf32", "plain"), "cuda", None),
        ("matrix-scale-shift.yaml", ("tf32", "plain"), "cuda", None)]
    assert cells["cells"] == [
        ("matrix-rms-norm.yaml", "tf32", "cuda", None, "host"),
        ("matrix-scale-shift.yaml", "tf32", "cuda", None, "host"),
        ("matrix-rms-norm.yaml", "plain", "cuda", None, "host"),
        ("matrix-scale-shift.yaml", "plain", "cuda", None, "host")]
    assert run.started[0][-1] == "rlbuild"


def test_modes_keep_to_the_target_and_the_cases_each_file_has(tmp_path, cells):
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain", "tf32"),
               target="cpu", cases=("255",))
    assert modes.run_modes(run) == 0
    # tf32 has no cpu cell; case "255" is rms_norm's only
    assert cells["cells"] == [("matrix-rms-norm.yaml", "plain", "cpu", ["255"], "host")]
    assert cells["plans"] == [("matrix-rms-norm.yaml", ("plain",), "cpu", ["255"])]
    assert not getattr(run, "started", [])


def test_a_file_that_cannot_run_fails_the_step_but_not_the_others(tmp_path, cells):
    cells["fail"] = {("matrix-rms-norm.yaml", "plain")}
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain",))
    assert modes.run_modes(run) == 1
    assert [c[0] for c in cells["cells"]] == ["matrix-rms-norm.yaml", "matrix-scale-shift.yaml"]


def test_a_cell_that_did_not_end_ok_fails_the_step(tmp_path, cells):
    cells["status"] = "partial"
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES[:1], modes=("plain",))
    assert modes.run_modes(run) == 1


def test_no_cell_starts_without_the_time_for_one(tmp_path, cells, capsys):
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain",),
               deadline=time.monotonic() + modes.MIN_CELL_S / 2)
    assert modes.run_modes(run) == 1
    assert cells["cells"] == []
    assert "matrix-rms-norm.yaml plain: not started" in capsys.readouterr().out
    assert cells["timeout_s"] <= modes.MIN_CELL_S / 2 * ahead.PRECOMPILE_SHARE


def test_jobs_auto_is_zero_and_the_default(tmp_path, fake_steps):
    assert _cli(tmp_path, "--steps", "modes", "--mode", "plain") == 0
    assert fake_steps == [("ok", ("plain",), 0, "cuda")]
    assert _cli(tmp_path, "--steps", "modes", "--mode", "plain", "--jobs", "auto") == 0
    assert fake_steps[-1] == ("ok", ("plain",), 0, "cuda")


def test_auto_jobs_is_the_cpus_on_cuda_and_one_on_cpu(monkeypatch):
    from gate_residual_matrix.runner.cell import environment

    monkeypatch.setattr(environment, "available_cpus", lambda: 16)
    assert modes.jobs_for(HostRun(out=Path("x"), jobs=0)) == 16
    assert modes.jobs_for(HostRun(out=Path("x"), jobs=0, target="cpu")) == 1
    assert modes.jobs_for(HostRun(out=Path("x"), jobs=3)) == 3


def test_cells_of_every_file_and_mode_queue_longest_first(tmp_path, cells, monkeypatch):
    from gate_residual_matrix.runner.cell import environment

    monkeypatch.setattr(environment, "available_cpus", lambda: 16)
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain", "tf32"))
    queue = modes.units(run, modes.load(FILES), tmp_path / "reports")
    # indexed_scale_shift: 6 dtype groups, one shard each; rms_norm: 3, its bfloat16 shard of
    # seven cases (32768 among them) the heaviest of all: longest first
    per = modes.CPUS_PER_SHARD
    assert [(u.name, u.cpus) for u in queue] == [
        ("matrix-rms-norm.yaml plain", 3 * per), ("matrix-rms-norm.yaml tf32", 3 * per),
        ("matrix-scale-shift.yaml plain", 6 * per), ("matrix-scale-shift.yaml tf32", 6 * per)]


@pytest.fixture
def spawned(monkeypatch):
    """The queue's cell processes faked: each call recorded (argv, env) and answered with
    an ``ok`` report of its cell (a committed H200 report under the cell's id), exit 0."""
    from gate_residual_matrix.runner.gpu_host import cell_queue

    calls: list = []
    sample = json.loads((ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json").read_text())

    def spawn(run, command, env, running):
        calls.append((command, env))
        path = Path(command[command.index("--matrix") + 1])
        mode = command[command.index("--mode") + 1]
        reports = Path(command[command.index("--reports") + 1])
        cell = modes._cell_id(modes.load([path])[path], mode, run.target)
        reports.mkdir(parents=True, exist_ok=True)
        (reports / f"{cell}.json").write_text(json.dumps(
            {**sample, "cell": {**sample["cell"], "id": cell, "mode": mode}}))
        return 0

    monkeypatch.setattr(cell_queue, "spawn", spawn)
    return calls


def test_cells_at_once_run_as_processes_and_write_a_timeline(tmp_path, cells, spawned,
                                                             monkeypatch):
    from gate_residual_matrix.contract import gpu_lock

    monkeypatch.delenv(gpu_lock.ENV, raising=False)
    before = dict(os.environ)
    gate_residual = (ROOT / "matrix.yaml",)  # the sample report is one of its cells
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=gate_residual,
               modes=("plain", "tf32", "inference", "deterministic"), jobs=4)
    assert modes.run_modes(run) == 0
    assert cells["cells"] == []  # nothing ran in this process
    commands = [c for c, _ in spawned]
    assert sorted(c[c.index("--mode") + 1] for c in commands) == [
        "deterministic", "inference", "plain", "tf32"]
    assert all("--no-tables" in c and c[c.index("--backend") + 1] == "host" for c in commands)
    for _, env in spawned:  # one lock for every cell, two threads each, in their env only
        assert env[gpu_lock.ENV] == str(tmp_path / "build" / "gpu.lock")
        assert env["OMP_NUM_THREADS"] == env["NUMBA_NUM_THREADS"] == "2"
    assert dict(os.environ) == before
    timeline = json.loads((tmp_path / "out" / modes.TIMELINE).read_text())
    assert len(timeline["cells"]) == 4
    assert all(c["start_s"] <= c["end_s"] <= timeline["wall_s"] for c in timeline["cells"])
    assert all(c["status"] == ["ok"] for c in timeline["cells"])
    assert timeline["jobs"] == 4 and "precompile_s" in timeline
    assert 1 <= timeline["most_at_once"] <= 4


def test_one_at_a_time_has_a_timeline_too(tmp_path, cells):
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain",))
    assert modes.run_modes(run) == 0
    timeline = json.loads((tmp_path / "out" / modes.TIMELINE).read_text())
    assert [c["cell"] for c in timeline["cells"]] == ["matrix-rms-norm.yaml plain",
                                                      "matrix-scale-shift.yaml plain"]
    assert timeline["most_at_once"] == 1


def test_cells_not_started_have_no_times(tmp_path, cells, spawned):
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=FILES, modes=("plain",), jobs=2,
               deadline=time.monotonic() + modes.MIN_CELL_S / 2)
    assert modes.run_modes(run) == 1
    timeline = json.loads((tmp_path / "out" / modes.TIMELINE).read_text())
    assert {(c["start_s"], c["end_s"]) for c in timeline["cells"]} == {(None, None)}
    assert {tuple(c["status"]) for c in timeline["cells"]} == {("not started",)}
    assert timeline["most_at_once"] == 0 and spawned == []


def test_a_cell_outcome_comes_from_its_report(tmp_path):
    from gate_residual_matrix.runner.gpu_host import cell_queue

    none = cell_queue.outcome(tmp_path, "rms_norm-host-plain-cuda", 1)
    assert none.status == "error" and "exited 1" in none.reason
    assert "none was written" in none.reason
    cut = cell_queue.outcome(tmp_path, "rms_norm-host-plain-cuda", 124)
    assert cut.status == "error" and "deadline before its first case" in cut.reason
    (tmp_path / "rms_norm-host-plain-cuda.json").write_text("{not json")
    bad = cell_queue.outcome(tmp_path, "rms_norm-host-plain-cuda", 0)
    assert bad.status == "error" and "its report" in bad.reason
    sample = (ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json").read_text()
    (tmp_path / "host-plain-cuda.json").write_text(sample)
    assert cell_queue.outcome(tmp_path, "host-plain-cuda", 0).status == "ok"
    assert cell_queue.outcome(tmp_path, "host-plain-cuda", 5).status == "ok"
    stale = cell_queue.outcome(tmp_path, "host-plain-cuda", 2)
    assert stale.status == "error" and "earlier run's" in stale.reason
    # written by this runner (at or after its start), which the deadline then stopped: the
    # cell had ended ok; the same report from before the runner started is an earlier run's
    written = (tmp_path / "host-plain-cuda.json").stat().st_mtime
    assert cell_queue.outcome(tmp_path, "host-plain-cuda", 124, since=written).status == "ok"
    late = cell_queue.outcome(tmp_path, "host-plain-cuda", 124, since=written + 60)
    assert late.status == "error" and "earlier run's" in late.reason
    failed = cell_queue.outcome(tmp_path, "host-plain-cuda", 1, since=written)
    assert failed.status == "error" and "after writing this report" in failed.reason


def test_an_interruption_lets_running_cells_write_their_reports(tmp_path, monkeypatch):
    """A cell runner that catches SIGTERM, writes a file and exits: interrupt() waits for it."""
    from gate_residual_matrix.runner.gpu_host import cell_queue

    marker = tmp_path / "wrote"
    code = ("import signal, sys, time, pathlib\n"
            "def stop(*_):\n"
            f"    pathlib.Path({str(marker)!r}).write_text('partial')\n"
            "    sys.exit(130)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    running = cell_queue.Running()
    run = HostRun(out=tmp_path)
    proc = run.start([sys.executable, "-c", code], env={})
    running.add(proc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # until its handler is in place
        if proc.poll() is not None or _handler_set(proc.pid):
            break
        time.sleep(0.05)
    monkeypatch.setattr(cell_queue, "GRACE_S", 10.0)
    running.interrupt()
    assert proc.returncode == 130 and marker.read_text() == "partial"


def _handler_set(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM (its SigCgt mask in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (15 - 1)))
    except OSError:
        pass
    return False


def test_env_step_names_only_declared_settings():
    """The env step prints each of its variables through settings.raw, which refuses an
    undeclared name: every name it lists must be declared."""
    from gate_residual_matrix import settings
    from gate_residual_matrix.runner.gpu_host import procedure

    for name in procedure.CACHES:
        settings.raw(name, env={})  # KeyError for an undeclared name


def test_matrix_no_tables_writes_reports_only(tmp_path, monkeypatch, capsys):
    """The queue's cell processes run ``matrix --no-tables``: no tables rendered, the summary
    still printed."""
    from gate_residual_matrix.runner import pipeline
    from gate_residual_matrix.runner.outcome import CellOutcome

    rendered = []
    monkeypatch.setattr(pipeline, "render_tables", lambda reports: rendered.append(reports))
    monkeypatch.setattr(pipeline, "run_matrix", lambda path, **kw: [
        CellOutcome("rms_norm-host-plain-cpu", "ok", None, tmp_path / "r.json")])
    args = ["matrix", "--matrix", str(ROOT / "matrix-rms-norm.yaml"), "--reports",
            str(tmp_path), "--stack", "host", "--mode", "plain", "--target", "cpu",
            "--backend", "host", "--case", "1"]
    assert main([*args, "--no-tables"]) == 0
    assert rendered == [] and "1 cell: 1 ok" in capsys.readouterr().out
    assert main(args) == 0
    assert rendered == [tmp_path]


def test_an_out_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, fake_steps, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["gpu-host", "--out", str(blocker / "out"), "--steps", "env"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --out: "), err


def test_a_bad_shard_count_is_one_line_and_exit_2(tmp_path, fake_steps, capsys, monkeypatch):
    monkeypatch.setenv("GATE_RESIDUAL_SHARDS", "bogus")
    assert _cli(tmp_path, "--steps", "modes") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "GATE_RESIDUAL_SHARDS" in err[0], err
    assert fake_steps == []



def test_a_cell_starts_once_its_mode_is_compiled_and_none_times_meanwhile(
        tmp_path, cells, spawned, monkeypatch):
    """The compile-ahead runs beside the queue: the first mode's cells start when its wave
    has ended, while the next mode still compiles, and the compile gate of the cells' GPU
    lock is held meanwhile (no cell may take its timings while anything compiles)."""
    import fcntl
    import threading

    from gate_residual_matrix.contract import gpu_lock

    monkeypatch.delenv(gpu_lock.ENV, raising=False)
    plain_started = threading.Event()
    order: list = []
    gate_held: list = []

    def between(kw):
        order.append(("compiled", "plain"))
        assert plain_started.wait(20), "the first mode's cell never started"
        fd = os.open(str(tmp_path / "build" / "gpu.lock.compiling"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            gate_held.append(False)
        except BlockingIOError:
            gate_held.append(True)
        finally:
            os.close(fd)
        order.append(("compiled", "tf32"))

    fake_queue(monkeypatch, between)
    from gate_residual_matrix.runner.gpu_host import cell_queue

    real_spawn = cell_queue.spawn

    def spawn(run, command, env, running):
        mode = command[command.index("--mode") + 1]
        order.append(("cell", mode))
        if mode == "plain":
            plain_started.set()
        return real_spawn(run, command, env, running)

    monkeypatch.setattr(cell_queue, "spawn", spawn)
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=(ROOT / "matrix.yaml",),
               modes=("plain", "tf32"), jobs=4)
    assert modes.run_modes(run) == 0
    assert order == [("compiled", "plain"), ("cell", "plain"), ("compiled", "tf32"),
                     ("cell", "tf32")]
    assert gate_held == [True]
    timeline = json.loads((tmp_path / "out" / modes.TIMELINE).read_text())
    assert set(timeline["ready_s"]) == {"matrix.yaml plain", "matrix.yaml tf32"}
    assert "precompile_s" in timeline and "rlbuild_s" in timeline and "gate_s" in timeline


def test_a_unit_not_ready_is_skipped_not_passed_over():
    """A unit whose mode still compiles does not start, nor count as passed over (which
    would stop every later unit behind it); it starts once it is ready."""
    import threading

    from gate_residual_matrix.runner.gpu_host.schedule import Unit, run_queue

    go = threading.Event()
    order: list = []

    def first():
        order.append("first")
        go.set()

    units = [Unit("waits", 1, lambda: order.append("waits"), ready=go.is_set),
             Unit("first", 1, first), Unit("second", 1, lambda: order.append("second"))]
    done = run_queue(units, jobs=1, cpus=1)
    assert order[0] == "first" and sorted(order) == ["first", "second", "waits"]
    assert all(u.error is None and u.started_s is not None for u in done)


def test_cells_get_the_gpu_memory_budget_only_where_it_is_known(tmp_path):
    from gate_residual_matrix.contract import gpu_budget
    from gate_residual_matrix.runner.gpu_host import cell_queue

    run = HostRun(out=tmp_path, root=tmp_path)
    assert cell_queue.environment(run, 130000)[gpu_budget.ENV] == "130000"
    assert gpu_budget.ENV not in cell_queue.environment(run)


def test_the_compile_ahead_holds_its_workers_share_of_the_gpu_memory(tmp_path, monkeypatch):
    """While its workers run, the compile-ahead holds PRECOMPILE_WORKER_MIB per worker in the
    cells' memory ledger, and the compile gate; neither once it has ended."""
    from gate_residual_matrix.contract import gpu_budget
    from gate_residual_matrix.runner.cell import environment
    from gate_residual_matrix.runner.gpu_host.footprint import PRECOMPILE_WORKER_MIB

    monkeypatch.setattr(environment, "available_cpus", lambda: 6)
    lock = str(tmp_path / "gpu.lock")
    seen = []

    def between(kw):
        with gpu_budget._book(lock + ".budget") as book:
            seen.append(sorted((k.split(":")[1], v) for k, v in book["held"].items()))

    fake_queue(monkeypatch, between)
    run = _Run(out=tmp_path / "out", root=tmp_path, target="cpu")
    path = ROOT / "matrix.yaml"
    compiling = ahead.Ahead(run, todo={path: ["plain"]}, cases={path: None},
                            lock=lock, budget=100000).start()
    compiling.wait()
    assert seen == [[("precompile", 4 * PRECOMPILE_WORKER_MIB)]]
    assert compiling.ready(path, "plain") and "precompile_s" in compiling.times
    with gpu_budget._book(lock + ".budget") as book:
        assert book["held"] == {}


def test_the_files_with_the_longest_cells_compile_first(tmp_path, monkeypatch):
    """The compile-ahead gets the files in order of their cells' expected work (the
    heaviest shard's case weights times the implementation rows)."""
    from gate_residual_matrix.runner.cell import environment

    monkeypatch.setattr(environment, "available_cpus", lambda: 16)
    seen = fake_queue(monkeypatch)
    names = ("matrix-add-rms-norm.yaml", "matrix.yaml", "matrix-rms-norm-scale-shift.yaml")
    run = _Run(out=tmp_path / "out", root=tmp_path, matrices=tuple(ROOT / n for n in names),
               modes=("plain",))
    loaded = modes.load(run.matrices)
    modes.compile_ahead(run, loaded, tmp_path / "reports", None).wait()
    assert [p[0] for p in seen["plans"]] == [
        "matrix.yaml", "matrix-rms-norm-scale-shift.yaml", "matrix-add-rms-norm.yaml"]
    work = {p.name: modes.expected_work(m, modes._selected(m, run), "cuda", 16)
            for p, m in loaded.items()}
    assert work["matrix.yaml"] > work["matrix-rms-norm-scale-shift.yaml"] > \
        work["matrix-add-rms-norm.yaml"] > 0
    units = modes.units(run, loaded, tmp_path / "reports")
    assert [u.name for u in units] == [f"{n} plain" for n in (
        "matrix.yaml", "matrix-rms-norm-scale-shift.yaml", "matrix-add-rms-norm.yaml")]


def test_only_the_files_with_rl_kernels_rows_wait_for_its_build(tmp_path):
    build_started = []

    class SlowBuild(_Run):
        def start(self, argv, *, env=None):
            build_started.append(argv)
            return None

        def finish(self, proc) -> int:
            time.sleep(1.0)
            return 0

    run = SlowBuild(out=tmp_path / "out", root=tmp_path)
    a, b = ROOT / "matrix.yaml", ROOT / "matrix-rms-norm.yaml"
    compiling = ahead.Ahead(run, todo={}, cases={}, needs_build={a}).start()
    time.sleep(0.3)
    assert compiling.ready(b, "plain") and not compiling.ready(a, "plain")
    compiling.wait()
    assert compiling.ready(a, "plain") and build_started


def test_the_compile_gate_stays_closed_until_every_worker_is_done(tmp_path, monkeypatch):
    """No cell times while any compile worker runs, the later modes' included (they take no
    lock): the gate is held after the first wave and after the last part, and open once the
    queue has returned; ``first_wave_s`` is recorded for the timeline."""
    import fcntl

    from gate_residual_matrix.runner.cell import environment

    monkeypatch.setattr(environment, "available_cpus", lambda: 6)
    lock = str(tmp_path / "gpu.lock")

    def gate_held() -> bool:
        fd = os.open(lock + ".compiling", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    held: list = []
    fake_queue(monkeypatch, lambda kw: held.append(gate_held()),
               at_end=lambda: held.append(gate_held()))
    run = _Run(out=tmp_path / "out", root=tmp_path, target="cpu")
    a, b = ROOT / "matrix.yaml", ROOT / "matrix-rms-norm.yaml"
    compiling = ahead.Ahead(run, todo={a: ["plain", "tf32"], b: ["plain", "tf32"]},
                            cases={a: None, b: None}, lock=lock).start()
    compiling.wait()
    assert held == [True, True] and not gate_held()
    times = compiling.times
    assert times["first_wave_s"] <= times["gate_s"] and times["gate_s"] >= 0
    assert "precompile_s" in times


def test_compile_workers_take_no_gpu_lock_even_where_their_environment_names_one(
        tmp_path, monkeypatch):
    """A worker started by a cell's own precompile inherits the cell's lock file, which the
    cell holds for it: waiting for it would deadlock. A worker of the GPU host's queue runs
    under the compile gate instead. Neither takes the lock."""
    from gate_residual_matrix.contract import gpu_lock
    from gate_residual_matrix.runner.cell import compile_pool

    call = {"impl": "eager", "dtype": "float32", "index_dtype": "int64", "rows": 2,
            "grad": "train"}
    plan = {"torch": {}, "op": "gate_residual", "sizes": {"D": 8, "G": 3}, "target": "cpu",
            "calls": [call]}
    taken = []
    real_shared = gpu_lock.shared

    def shared():
        taken.append(gpu_lock.path())
        return real_shared()

    monkeypatch.setattr(gpu_lock, "shared", shared)
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "cells.lock"))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert compile_pool.main([str(path)]) == 0
    assert (tmp_path / "plan.json.done").read_text() == "0\n"
    assert all(lock is None for lock in taken) and not (tmp_path / "cells.lock").exists()


def test_the_compile_gate_waits_for_rl_kernels_build_and_the_share_is_at_most_half(
        tmp_path, monkeypatch):
    """A build still running keeps the gate closed after the compile waves (it loads the
    CPUs); the workers' memory share is capped at half the budget."""
    import fcntl

    from gate_residual_matrix.contract import gpu_budget
    from gate_residual_matrix.runner.cell import environment

    monkeypatch.setattr(environment, "available_cpus", lambda: 16)
    lock = str(tmp_path / "gpu.lock")
    shares = []

    def between(kw):
        with gpu_budget._book(lock + ".budget") as book:
            shares.append(sorted(book["held"].values()))

    fake_queue(monkeypatch, between)

    class SlowBuild(_Run):
        def start(self, argv, *, env=None):
            return None

        def finish(self, proc) -> int:
            time.sleep(1.5)
            return 0

    run = SlowBuild(out=tmp_path / "out", root=tmp_path)
    path = ROOT / "matrix.yaml"
    compiling = ahead.Ahead(run, todo={path: ["plain"]}, cases={path: None},
                            lock=lock, budget=10000).start()
    compiling._threads[1].join(20)  # the precompile is done, the build is not
    fd = os.open(lock + ".compiling", os.O_RDWR)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    compiling.wait()
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    os.close(fd)
    assert shares == [[5000]] and compiling.times["gate_s"] >= compiling.times["precompile_s"]



def test_the_wrapper_caches_bytecode_where_the_image_forbids_it(tmp_path):
    """An image that sets PYTHONDONTWRITEBYTECODE (the GPU image does, and ships no bytecode)
    would have every process compile torch's modules from source again: the wrapper lifts it
    and puts the bytecode under the copy's build/, which the env step shows."""
    copy = tmp_path / "copy"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_host.sh", copy / "scripts" / "gpu_host.sh")
    (copy / "gate_residual_matrix").symlink_to(ROOT / "gate_residual_matrix")
    for matrix in ROOT.glob("matrix*.yaml"):
        shutil.copy(matrix, copy / matrix.name)
    prefix = copy / "build" / "pycache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONDONTWRITEBYTECODE="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(copy / "scripts" / "gpu_host.sh"), "--out",
                           str(tmp_path / "out"), "--steps", "env", "--target", "cpu"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"PYTHONPYCACHEPREFIX={prefix}" in (tmp_path / "out" / "env.log").read_text()
    assert list(prefix.rglob("*.pyc"))  # written, despite PYTHONDONTWRITEBYTECODE
