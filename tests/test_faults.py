"""Failing cells cost that cell only: fault injection through the real command line.

``tests/data/faults.yaml`` arms the test-only implementation ``fault``
(ops/gate_residual/faulty.py) per mode: raise, hang, oom, kill; ``plain`` leaves it off and
runs after the failing cells. One ``python -m gate_residual_matrix matrix`` run over them (CPU) must
write one report per cell with the right status, reason, exit code and log tail, and exit 5 with a
summary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from gate_residual_matrix.ops.gate_residual import faulty
from gate_residual_matrix.runner.backends.failure import Ending, classify, explain, oom_kill_count
from gate_residual_matrix.runner.cell import catalog as implementations
from gate_residual_matrix.runner.cell.run import out_of_memory, run_cell
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.plan.cells import Cell, select_cases
from gate_residual_matrix.runner.reports.store import read_report

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "data" / "faults.yaml"
TIMEOUT_S = 15  # the hang cell costs this much; other cells take ~3 s
# A fixed project state, so that edits to the checkout while the tests run do not change the
# fingerprints (tests/test_rerun.py covers the project state's part in them).
PINNED_PROJECT = {"GATE_RESIDUAL_COMMIT": "0123456789abcdef0123456789abcdef01234567"}


def runner_cli(*args: str, env: dict | None = None, wait: bool = True):
    """``python -m gate_residual_matrix ARGS`` from the project root with fault injection
    enabled; the CompletedProcess, or with ``wait=False`` the Popen."""
    full_env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1", **PINNED_PROJECT, **(env or {})}
    argv = [sys.executable, "-m", "gate_residual_matrix.runner", *args]
    if not wait:
        return subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=300)


def modes(*names: str) -> list[str]:
    return [a for m in names for a in ("--mode", m)]


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    """The CPU fault cells, run by the command line: (completed process, reports directory).

    The hang cell only sleeps until its timeout, so it runs in a second matrix run at the
    same time (its own reports directory, copied in afterwards): the main run goes raise,
    oom, kill, plain; each run goes on past its failing cells."""
    reports, hang_reports = (tmp_path_factory.mktemp(n) for n in ("faults", "hang"))
    common = ["--matrix", str(FAULTS), "--target", "cpu", "--timeout", str(TIMEOUT_S)]
    hang = runner_cli("matrix", "--reports", str(hang_reports), *common, *modes("hang"),
                      wait=False)
    done = runner_cli("matrix", "--reports", str(reports), *common,
                      *modes("raise", "oom", "kill", "plain"))
    _, hang_err = hang.communicate(timeout=300)
    assert hang.returncode == 5, hang_err
    assert hang_err.strip().splitlines()[-1] == (
        "error: 1 of 1 cells did not end ok: host-hang-cpu (timeout)")
    (reports / "host-hang-cpu.json").write_bytes((hang_reports / "host-hang-cpu.json").read_bytes())
    return done, reports


def report_of(reports: Path, cell_id: str) -> dict:
    loaded = read_report(reports / f"{cell_id}.json")
    assert loaded.ok, f"{cell_id}: {loaded.problem}"
    return loaded.data


def test_run_goes_to_the_end_and_exits_5_with_a_summary(fault_run):
    done, reports = fault_run
    assert done.returncode == 5, done.stderr
    err = done.stderr.strip().splitlines()[-1]
    assert err == ("error: 3 of 4 cells did not end ok: host-raise-cpu (error), host-oom-cpu "
                   "(oom), host-kill-cpu (error)"), done.stderr
    summary = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
               if line.startswith("host-")}
    # the counts line, then only the cells that are neither ok nor skipped
    assert summary == {"host-raise-cpu": "error", "host-oom-cpu": "oom",
                       "host-kill-cpu": "error"}, done.stdout
    assert "\n4 cells: 1 ok, 2 error, 1 oom\n" in done.stdout, done.stdout
    assert sorted(p.name for p in reports.glob("host-*.json")) == sorted(
        f"host-{m}-cpu.json" for m in ("raise", "hang", "oom", "kill", "plain"))
    assert not [p.name for p in reports.iterdir() if p.name.startswith(".")]  # no temp files
    assert report_of(reports, "host-plain-cpu")["status"] == "ok"  # ran after four failures


def test_raise_is_error_with_traceback_and_others_still_ran(fault_run):
    r = report_of(fault_run[1], "host-raise-cpu")
    assert (r["status"], r["exit_code"]) == ("error", 0)
    assert r["reason"] == "fault: case 5: InjectedFault: injected by GATE_RESIDUAL_FAULT=raise"
    assert "faulty.py" in r["log_tail"] and "InjectedFault" in r["log_tail"]
    assert r["results"]["fault"]["status"] == "error"
    assert "Traceback" in r["results"]["fault"]["traceback"]
    assert r["results"]["eager"]["status"] == "ok" and r["results"]["eager"]["accuracy"]["5"]


def test_hang_is_timeout_with_the_log_tail(fault_run):
    r = report_of(fault_run[1], "host-hang-cpu")
    assert (r["status"], r["exit_code"]) == ("timeout", -signal.SIGKILL)
    assert r["reason"] == (f"timed out: no report after the cell timeout of {TIMEOUT_S} s; "
                           "the cell's process group was killed")
    assert "GATE_RESIDUAL_FAULT=hang: sleeping forever" in r["log_tail"]  # the hang was reached
    assert TIMEOUT_S <= r["duration_s"] < TIMEOUT_S + 30


def test_unbounded_allocation_is_oom(fault_run):
    r = report_of(fault_run[1], "host-oom-cpu")
    assert r["status"] == "oom" and r["results"]["fault"]["status"] == "oom"
    assert r["reason"].startswith("fault: case 5: RuntimeError: ")
    assert "can't allocate memory" in r["reason"] and "\n" not in r["reason"]
    assert r["results"]["eager"]["status"] == "ok"  # the limit was lifted again


def test_killed_process_is_error_with_exit_code_and_reasoned_signal(fault_run):
    r = report_of(fault_run[1], "host-kill-cpu")
    assert (r["status"], r["exit_code"]) == ("error", -signal.SIGKILL)
    assert r["reason"].startswith("cell process was killed by SIGKILL (exit code -9) and wrote "
                                  "no report; "), r["reason"]
    assert "/proc/vmstat oom_kill" in r["reason"]
    assert "GATE_RESIDUAL_FAULT=kill: sending SIGKILL" in r["log_tail"]


def test_a_rerun_reuses_the_ok_cell_a_cell_process_wrote(fault_run):
    """End to end: the fingerprint the runner stamped on the child's report matches the next
    run's (tests/test_rerun.py covers what changes it and that failed cells re-run)."""
    reports = fault_run[1]
    before = (reports / "host-plain-cpu.json").read_bytes()
    again = runner_cli("matrix", "--matrix", str(FAULTS), "--reports", str(reports),
                       "--target", "cpu", "--mode", "plain")
    assert again.returncode == 0, again.stderr
    assert "1 cell: 1 ok (1 reused)" in again.stdout.splitlines()
    assert "[runner] cell host-plain-cpu: running" not in again.stdout
    assert (reports / "host-plain-cpu.json").read_bytes() == before


# ------------------------------------------------------------------ in process, no cell process


@pytest.fixture
def with_fault(monkeypatch):
    """``fault`` registered in this process, as GATE_RESIDUAL_FAULTS=1 does at import."""
    monkeypatch.setitem(implementations.registry("gate_residual"), "fault", faulty.FAULT)


def small_matrix(impls):
    data = yaml.safe_load(FAULTS.read_text())
    data["implementations"] = impls
    return parse_matrix(data, known_implementations=implementations.known)


def test_raise_leaves_the_bitwise_comparisons_of_the_others(with_fault, monkeypatch):
    monkeypatch.setenv("GATE_RESIDUAL_FAULT", "raise")
    m = small_matrix(["eager", "numba", "fault", "fp64"])
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["status"] == "error" and r["results"]["fault"]["status"] == "error"
    assert r["results"]["numba"]["status"] == "ok"
    assert r["results"]["numba"]["vs eager"]["5"]["out"][0]["equal"] is True
    assert r["results"]["fp64"]["status"] == "ok"


def test_disarmed_fault_is_eager(with_fault, monkeypatch):
    monkeypatch.delenv("GATE_RESIDUAL_FAULT", raising=False)
    m = small_matrix(["eager", "fault", "fp64"])
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["status"] == "ok"
    assert r["results"]["fault"]["vs eager"]["5"]["out"][0]["differ"] == 0


def test_unknown_fault_is_an_error_naming_the_choices(with_fault, monkeypatch):
    monkeypatch.setenv("GATE_RESIDUAL_FAULT", "segfault")
    m = small_matrix(["eager", "fault", "fp64"])
    r = run_cell(m, Cell("host", "plain", "cpu"), select_cases(m), timings=False)
    assert r["results"]["fault"]["reason"] == (
        "case 5: SettingError: GATE_RESIDUAL_FAULT='segfault': expected one of none, raise, "
        "hang, oom, kill, illegal_address")


def test_fault_is_registered_only_when_enabled():
    code = ("import importlib, os, gate_residual_matrix.runner.cell.catalog as c; "
            "print(','.join(c.known('gate_residual'))); "
            "os.environ['GATE_RESIDUAL_FAULTS'] = '1'; "
            "import gate_residual_matrix.ops.gate_residual.implementations as g; "
            "importlib.reload(g); "
            "importlib.reload(c); print(','.join(c.known('gate_residual')))")
    env = {k: v for k, v in os.environ.items() if k != "GATE_RESIDUAL_FAULTS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    off, on = done.stdout.split()
    test_only = ("fault", "inplace", "batch_variant")
    assert off.split(",")[:3] == ["eager", "numba", "fp64"]
    assert not set(test_only) & set(off.split(","))
    assert on.split(",") == [*off.split(","), *test_only]


def test_fault_matrix_is_a_config_error_without_the_switch(tmp_path, monkeypatch):
    from gate_residual_matrix.runner.__main__ import main

    # switch off
    monkeypatch.setattr(implementations, "known", lambda op: ("eager", "numba", "fp64"))
    reports = tmp_path / "reports"
    code = main(["matrix", "--matrix", str(FAULTS), "--reports", str(reports)])
    assert code == 2 and not reports.exists()


@pytest.mark.parametrize(("err", "oom"), [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (MemoryError(), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 64"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("can't allocate memory"), False),
])
def test_out_of_memory_recognises_allocator_failures(err, oom):
    assert out_of_memory(err) is oom


@pytest.mark.parametrize(("code", "log", "timed_out", "kills", "status", "fragment"), [
    (-9, "", True, (0, 0), "timeout", "timed out: no report after the cell timeout of 60 s"),
    (-9, "", False, (3, 4), "oom", "OOM killer fired meanwhile (/proc/vmstat oom_kill 3 -> 4)"),
    (-9, "", False, (3, 3), "error", "oom_kill stayed 3): another process or a hard limit"),
    (-9, "", False, (None, None), "error", "SIGKILL is ambiguous: the kernel's OOM killer or"),
    (-11, "", False, (0, 0), "error", "killed by SIGSEGV (exit code -11) and wrote no report"),
    (1, "torch.OutOfMemoryError: CUDA out of memory", False, (0, 0), "oom", "exited with code 1"),
    (3, "error: invalid report", False, (0, 0), "error", "exited with code 3 and wrote no"),
])
def test_classify_and_explain_a_cell_process_without_report(code, log, timed_out, kills,
                                                            status, fragment):
    ending = Ending(code, log, timed_out, oom_kills=kills)
    assert classify(ending) == status
    reason = explain(ending, 60.0)
    assert fragment in reason and "\n" not in reason


def test_oom_kill_count_reads_proc_vmstat():
    count = oom_kill_count()
    if Path("/proc/vmstat").exists() and "oom_kill " in Path("/proc/vmstat").read_text():
        assert isinstance(count, int) and count >= 0
    else:
        assert count is None


def _cell_processes(pid: int) -> list[int]:
    """Children of ``pid`` that run ``python -m gate_residual_matrix cell`` (not git, not a fork
    yet to exec)."""
    try:
        children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    found = []
    for child in children:
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cell" in argv and b"--run-id" in argv:
            found.append(child)
    return found


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
                    reason="needs /proc/<pid>/task/<pid>/children (Linux)")
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_kills_the_cell_process_keeps_the_reports_and_exits_128_plus_it(
        tmp_path, signum, code):
    """SIGTERM used to kill the runner alone: the cell process ran on, orphaned."""
    kept = tmp_path / "host-plain-cuda.json"
    kept.write_bytes((ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").read_bytes())
    before = kept.read_bytes()
    env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1"}
    parent = subprocess.Popen(
        [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(FAULTS),
         "--reports",
         str(tmp_path), "--target", "cpu", "--mode", "hang", "--timeout", "300"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A child inherits an ignored SIGINT, and Python then never installs its Ctrl-C
        # handler. Something earlier in a full test run leaves SIGINT ignored in pytest's
        # process, so the runner starts as it would from an interactive shell: SIGINT default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not _cell_processes(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    (child,) = _cell_processes(parent.pid)
    parent.send_signal(signum)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == code, err
    assert err.strip().splitlines()[-1] == (
        f"error: interrupted by {signal.Signals(signum).name}: the reports written so far are "
        "whole; run again to finish (cells whose report is current are not run again)")
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host-plain-cuda.json"]  # no staging
    assert kept.read_bytes() == before


@pytest.fixture
def shell_signals():
    """SIGINT and SIGTERM as an interactive shell starts a command (a full test run may have
    left SIGINT ignored in this process); restored afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_cell_process_starts_is_held_until_it_is_known(shell_signals,
                                                                          signum):
    from gate_residual_matrix.runner.backends.interrupts import deferred, signals_interrupt
    from gate_residual_matrix.runner.errors import Interrupted

    reached_end = False
    with signals_interrupt():
        installed = signal.getsignal(signum)
        with pytest.raises(Interrupted) as stopped:
            with deferred():
                os.kill(os.getpid(), signum)
                time.sleep(0.05)  # the handler ran here: held, not raised
                reached_end = True
        assert signal.getsignal(signum) is installed
        os.kill(os.getpid(), signum)  # a second signal, during the clean-up: ignored
        time.sleep(0.05)
    assert reached_end and stopped.value.exit_code == 128 + signum
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


# ------------------------------------------------------------------ on the H200


@pytest.mark.gpu
def test_cuda_illegal_address_and_oom_cost_their_cell_only(tmp_path):
    modes = [a for m in ("illegal", "oom", "plain") for a in ("--mode", m)]
    done = runner_cli("matrix", "--matrix", str(FAULTS), "--reports", str(tmp_path), *modes,
                      "--timeout", "600", env={"GATE_RESIDUAL_FAULT_OOM_MB": "2048"})
    assert done.returncode == 5, done.stderr
    illegal = report_of(tmp_path, "host-illegal-cuda")
    assert illegal["status"] == "error", illegal["reason"]
    text = f"{illegal['reason']}\n{illegal['log_tail']}".lower()
    assert "illegal" in text, text[-2000:]  # CUDA_ERROR_ILLEGAL_ADDRESS / illegal memory access
    oom = report_of(tmp_path, "host-oom-cuda")
    assert oom["status"] == "oom" and "OutOfMemoryError" in oom["reason"], oom["reason"]
    assert oom["results"]["eager"]["status"] == "ok"
    for cell in ("host-plain-cuda", "host-plain-cpu"):
        assert report_of(tmp_path, cell)["status"] == "ok"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_swallowed_interrupt_is_still_known(shell_signals, signum):
    """Library code that catches the first signal's exception (Ray Client's waits can) does
    not lose it: :func:`fired` names it until the block ends, and the second is ignored."""
    from gate_residual_matrix.runner.backends.interrupts import fired, signals_interrupt
    from gate_residual_matrix.runner.errors import Interrupted

    assert fired() is None
    with signals_interrupt():
        try:
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
        except BaseException as swallowed:  # what a library's broad except does
            assert isinstance(swallowed, Interrupted)
        assert fired() == signum
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the first one stands
        time.sleep(0.05)
        assert fired() == signum
    assert fired() is None
