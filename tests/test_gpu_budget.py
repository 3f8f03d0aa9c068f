"""contract/gpu_budget.py: the GPU memory of one host shared out case by case.

Requests from threads of this process (each its own ledger entry) and from child processes;
the assertions are on the order of grants, never on a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from gate_residual_matrix.contract import gpu_budget, gpu_lock

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ledger(monkeypatch, tmp_path):
    """A lock file and a budget of 100 MiB in this process's settings; the ledger's path."""
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    monkeypatch.setenv(gpu_budget.ENV, "100")
    monkeypatch.setattr(gpu_budget, "POLL_S", 0.01)
    return tmp_path / "gpu.lock.budget"


def _holder(mib: int, kind: str, log: list, name: str, hold: threading.Event):
    def body():
        with gpu_budget.reserve(mib, kind):
            log.append((name, "in"))
            hold.wait(20)
        log.append((name, "out"))
    thread = threading.Thread(target=body)
    thread.start()
    return thread


def _until(predicate, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def _waiting(ledger: Path) -> int:
    return len(json.loads(ledger.read_text() or "{}").get("waiting", {})) if ledger.exists() \
        else 0


def test_without_the_settings_nothing_is_held(monkeypatch, tmp_path):
    monkeypatch.delenv(gpu_budget.ENV, raising=False)
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    with gpu_budget.reserve(10**9, "case"):
        pass
    assert not (tmp_path / "gpu.lock.budget").exists()


def test_a_request_waits_until_it_fits_first_come_first_served(ledger):
    """A holds 70 of 100; B asks 50 and waits; C asks 10, which would fit, but asked after
    B: it waits behind B (a large case is never passed over for ever). When A leaves, B goes
    in, then C beside it."""
    log: list = []
    release_a, release_b, release_c = threading.Event(), threading.Event(), threading.Event()
    a = _holder(70, "case", log, "A", release_a)
    _until(lambda: ("A", "in") in log)
    b = _holder(50, "case", log, "B", release_b)
    _until(lambda: _waiting(ledger) == 1)
    c = _holder(10, "case", log, "C", release_c)
    _until(lambda: _waiting(ledger) == 2)
    time.sleep(0.2)
    assert log == [("A", "in")]
    release_a.set()
    _until(lambda: ("C", "in") in log)
    assert log.index(("B", "in")) < log.index(("C", "in"))
    release_b.set()
    release_c.set()
    for t in (a, b, c):
        t.join(20)
    assert json.loads(ledger.read_text()) == {"held": {}, "waiting": {}}
    assert gpu_budget.waited_s() > 0


def test_a_request_larger_than_the_budget_goes_ahead_once_no_case_holds_memory(ledger):
    """Bases do not stop it (it would wait for ever); another case does."""
    log: list = []
    base_done, case_done = threading.Event(), threading.Event()
    base = _holder(40, "base", log, "base", base_done)
    case = _holder(30, "case", log, "case", case_done)
    _until(lambda: ("case", "in") in log and ("base", "in") in log)
    big_done = threading.Event()
    big = _holder(500, "case", log, "big", big_done)
    _until(lambda: _waiting(ledger) == 1)
    time.sleep(0.2)
    assert ("big", "in") not in log
    case_done.set()
    _until(lambda: ("big", "in") in log)
    with gpu_budget._book(str(ledger)) as book:
        assert sorted(book["held"].values()) == [40, 500]
    base_done.set()
    big_done.set()
    for t in (base, case, big):
        t.join(20)


_HOLD = textwrap.dedent("""
    import sys, time
    from gate_residual_matrix.contract import gpu_budget
    with gpu_budget.reserve(int(sys.argv[1]), "case"):
        print("in", flush=True)
        time.sleep(60)
""")


def test_a_killed_holder_frees_its_share(ledger, monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, "90"], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "in"
    log: list = []
    done = threading.Event()
    waiter = _holder(50, "case", log, "W", done)
    _until(lambda: _waiting(ledger) == 1)
    proc.kill()
    proc.wait(10)
    _until(lambda: ("W", "in") in log)
    done.set()
    waiter.join(20)


def test_an_interrupted_request_leaves_the_queue(ledger, monkeypatch):
    """A request stopped while it waits (a SIGTERM's exception) takes its place in the queue
    with it: the requests behind it are not held up."""
    with gpu_budget.reserve(90, "case"):
        calls = [0]
        real_sleep = time.sleep

        def interrupted(seconds):
            calls[0] += 1
            if calls[0] > 3:
                raise KeyboardInterrupt
            real_sleep(seconds)

        monkeypatch.setattr(gpu_budget.time, "sleep", interrupted)
        with pytest.raises(KeyboardInterrupt):
            with gpu_budget.reserve(50, "case"):
                pass
        monkeypatch.setattr(gpu_budget.time, "sleep", real_sleep)
        assert _waiting(ledger) == 0


def test_the_share_of_tensors_is_rounded_up():
    tensors = [torch.empty(3, dtype=torch.float32), torch.empty(2**20, dtype=torch.bfloat16)]
    assert gpu_budget.mib_of(tensors, 1) == 3  # 2 MiB + 12 bytes
    assert gpu_budget.mib_of(tensors, 10) == 21
    assert gpu_budget.mib_of([], 10) == 0


def test_a_bad_budget_setting_means_no_ledger(monkeypatch):
    monkeypatch.setenv(gpu_budget.ENV, "lots")
    assert gpu_budget.budget_mib() is None


def test_a_cuda_case_and_its_timing_pass_hold_their_shares(ledger, monkeypatch):
    """What a cell process holds while a case runs (COPIES x its input bytes) and while its
    timing pass runs (TIMING_COPIES x the input bytes of the cases it times), read from the
    ledger inside the faked work; nothing once they end."""
    from concurrent.futures import ThreadPoolExecutor

    from gate_residual_matrix import ops
    from gate_residual_matrix.runner.cell import case as case_mod
    from gate_residual_matrix.runner.cell import run as run_mod
    from gate_residual_matrix.runner.cell import timing_pass
    from gate_residual_matrix.runner.cell.phases import PhaseClock
    from gate_residual_matrix.runner.config.matrix import load_matrix

    monkeypatch.setenv(gpu_budget.ENV, str(10**6))
    matrix = load_matrix(ROOT / "matrix-rms-norm.yaml")
    seen: dict = {}

    def held() -> list:
        with gpu_budget._book(str(ledger)) as book:
            return sorted((k.split(":")[1], v) for k, v in book["held"].items())

    monkeypatch.setattr(run_mod, "run_case", lambda ctx, case, x, key, dtype: seen.update(
        case=held(), x=x))
    monkeypatch.setattr(timing_pass, "take", lambda cases, **kw: seen.update(timings=held()))
    with ThreadPoolExecutor(1) as hasher:
        ctx = case_mod.CaseContext(spec=ops.get(matrix.op), matrix=matrix, target="cuda",
                                   device="cuda", impls=[], results={},
                                   clock=PhaseClock(sync=False), hasher=hasher,
                                   inference=False, with_timings=True)
        run_mod._run_one_case(ctx, {"inputs": {}}, max(matrix.cases, key=lambda c: c.n))
    nbytes = sum(t.numel() * t.element_size() for t in seen["x"].tensors.values())
    assert seen["case"] == [("case", -(-gpu_budget.COPIES * nbytes // 2**20))]
    case_mod.time_pending(ctx, [timing_pass.Pending([], seen["x"], None, "k")])
    assert seen["timings"] == [("timings", -(-gpu_budget.TIMING_COPIES * nbytes // 2**20))]
    assert held() == []


def test_the_ledger_is_written_whole_and_can_be_cleared(ledger):
    """Every write replaces the ledger with a whole JSON file (a process stopped halfway
    leaves the old one, never a truncated one); clear() forgets every entry."""
    with gpu_budget.reserve(30, "case"):
        assert json.loads(ledger.read_text())["held"]
        gpu_budget.clear(str(ledger)[:-len(".budget")])
        assert json.loads(ledger.read_text()) == {"held": {}, "waiting": {}}
    assert not [p for p in ledger.parent.iterdir() if p.name.endswith(".tmp")]
