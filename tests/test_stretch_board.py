"""The board of stretches in flight (contract/stretch_board.py): a timing pass waits for the
other processes' long stretches without stopping anyone, then drains the short ones.

Another process's entry is played here by a file that a separate open file description
holds with ``flock`` (as its owner does for life); a file nobody holds is a dead owner's."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gate_residual_matrix.contract import gpu_lock, stretch_board

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def lock(monkeypatch, tmp_path):
    path = str(tmp_path / "gpu.lock")
    monkeypatch.setenv(gpu_lock.ENV, path)
    return path


class Entry:
    """Another process's file on the board: ``alive`` holds it as its owner would."""

    def __init__(self, lock: str, name: str, start: float, alive: bool = True) -> None:
        os.makedirs(stretch_board.folder(lock), exist_ok=True)
        self.path = os.path.join(stretch_board.folder(lock), name)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        if alive:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.post(start)

    def post(self, start: float) -> None:
        os.pwrite(self.fd, stretch_board._START.pack(start), 0)

    def close(self) -> None:
        os.close(self.fd)


def _read(path: str) -> float:
    with open(path, "rb") as f:
        return stretch_board._START.unpack(f.read())[0]


def _time() -> None:
    with gpu_lock.exclusive():
        pass


def _share() -> None:
    with gpu_lock.shared():
        pass


def _in_thread(body) -> threading.Event:
    """``body`` in a daemon thread; an event set when it has returned."""
    done = threading.Event()

    def run():
        body()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_stretch_is_on_the_board_while_the_lock_is_held(lock):
    mine = os.path.join(stretch_board.folder(lock), str(os.getpid()))
    with gpu_lock.shared():
        assert 0 < time.monotonic() - _read(mine) < 5
        time.sleep(stretch_board.YOUNG_S + 0.05)
        assert stretch_board.oldest_s(lock) == 0.0  # its own entry is not another's
        assert gpu_lock.step_aside()  # compiling: not in flight
        assert _read(mine) == 0.0
        gpu_lock.step_back()
        assert _read(mine) > 0
    assert _read(mine) == 0.0


def test_a_pass_waits_for_a_long_stretch_while_the_others_go_on(lock):
    """Another process has been in a stretch for a second: the pass waits for its end
    without holding the turnstile, so shared work is not stopped; the wait is counted as
    ``long`` (a part of ``exclusive``), not as ``drain``."""
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_SH)  # the other process's stretch in flight
    other = Entry(lock, "1", time.monotonic() - 1.0)
    before = gpu_lock.waited_s()
    timed = _in_thread(_time)
    try:
        time.sleep(0.4)
        assert not timed.is_set()
        worked = _in_thread(_share)
        assert worked.wait(timeout=2)  # not stopped: the turnstile is not taken yet
    finally:
        other.post(0.0)  # the long stretch ends
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)
    assert timed.wait(timeout=20)
    after = gpu_lock.waited_s()
    assert after["long"] - before["long"] >= 0.3
    assert after["exclusive"] - before["exclusive"] >= after["long"] - before["long"]
    assert after["drain"] - before["drain"] < 0.3
    other.close()


def test_a_young_stretch_is_left_to_the_drain(lock):
    """A stretch just begun is not waited for politely: the pass takes the turnstile and
    drains it, as before the board."""
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_SH)
    other = Entry(lock, "1", time.monotonic() + 60)  # began "now" for the next minute
    before = gpu_lock.waited_s()
    timed = _in_thread(_time)
    time.sleep(0.5)
    fcntl.flock(held, fcntl.LOCK_UN)
    os.close(held)
    assert timed.wait(timeout=20)
    after = gpu_lock.waited_s()
    assert after["drain"] - before["drain"] >= 0.4
    assert after["long"] - before["long"] < 0.1
    other.close()


def test_a_stretch_grown_long_behind_another_pass_is_waited_for_again(lock):
    """The pass waited for another's turnstile; meanwhile a stretch ran long. Once it takes
    the turnstile it sees that, lets it go and waits again, stopping nobody."""
    turnstile = os.open(lock + ".turnstile", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(turnstile, fcntl.LOCK_EX)  # another process's pass
    before = gpu_lock.waited_s()
    timed = _in_thread(_time)
    time.sleep(0.3)
    other = Entry(lock, "1", time.monotonic() - 1.0)
    fcntl.flock(turnstile, fcntl.LOCK_UN)  # that pass ends
    try:
        time.sleep(0.3)
        assert not timed.is_set()
        worked = _in_thread(_share)
        assert worked.wait(timeout=2)  # the turnstile was let go again
    finally:
        other.post(0.0)
        os.close(turnstile)
    assert timed.wait(timeout=20)
    assert gpu_lock.waited_s()["long"] - before["long"] >= 0.2
    other.close()


def test_an_entry_nobody_holds_is_a_dead_process_whatever_its_pid(lock):
    """A process killed in a stretch leaves its start behind, and its pid may name a live
    process by now (here this test's parent): nobody holds the file, so it is not waited
    for, and it is removed; so is an idle one."""
    stale = Entry(lock, str(os.getppid()), time.monotonic() - 10.0, alive=False)
    idle = Entry(lock, "2", 0.0, alive=False)
    foreign = Entry(lock, "99999999999", time.monotonic() - 10.0, alive=False)
    before = gpu_lock.waited_s()
    with gpu_lock.exclusive():
        pass
    assert gpu_lock.waited_s()["long"] - before["long"] < 0.2
    assert not any(os.path.exists(e.path) for e in (stale, idle, foreign))
    for e in (stale, idle, foreign):
        e.close()


def test_a_killed_process_is_not_waited_for(lock):
    """A real process that takes the lock shared and is killed mid-stretch (SIGKILL, not
    reaped yet): the kernel dropped its locks, so no pass waits for it."""
    code = textwrap.dedent("""
        import sys, time
        from gate_residual_matrix.contract import gpu_lock
        with gpu_lock.shared():
            print("in", flush=True)
            time.sleep(60)
    """)
    env = {**os.environ, gpu_lock.ENV: lock, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "in"
        time.sleep(stretch_board.YOUNG_S + 0.1)
        assert stretch_board.oldest_s(lock) >= stretch_board.YOUNG_S  # alive: in flight
        child.kill()
        deadline = time.monotonic() + 10
        while stretch_board.oldest_s(lock) and time.monotonic() < deadline:
            time.sleep(0.02)  # a zombie (not reaped) holds no lock
        assert stretch_board.oldest_s(lock) == 0.0
    finally:
        child.kill()
        child.wait()


def test_a_forked_child_leaves_its_parents_entry(lock, tmp_path):
    """A child forked from a process on the board exits normally (its atexit hooks run):
    the parent's file stays."""
    code = textwrap.dedent("""
        import os, sys
        from gate_residual_matrix.contract import gpu_lock, stretch_board
        with gpu_lock.shared():
            pass
        mine = os.path.join(stretch_board.folder(gpu_lock.path()), str(os.getpid()))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        print(os.path.exists(mine))
    """)
    env = {**os.environ, gpu_lock.ENV: lock, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stdout + done.stderr


def test_the_wait_is_bounded(lock, monkeypatch):
    """A stretch that never ends is waited for at most WAIT_MAX_S; then the pass drains."""
    monkeypatch.setattr(stretch_board, "WAIT_MAX_S", 0.5)
    other = Entry(lock, "1", time.monotonic() - 1.0)
    before = gpu_lock.waited_s()
    t0 = time.monotonic()
    with gpu_lock.exclusive():
        pass
    assert 0.4 <= time.monotonic() - t0 < 5
    assert 0.4 <= gpu_lock.waited_s()["long"] - before["long"] < 1.0
    other.close()


def test_without_a_board_the_lock_works_as_before(lock):
    """A board folder that cannot be made (a file in its place) records nothing; the shared
    and exclusive sections work."""
    with open(stretch_board.folder(lock), "w") as f:
        f.write("not a folder")
    with gpu_lock.shared():
        pass
    with gpu_lock.exclusive():
        pass
    assert stretch_board.oldest_s(lock) == 0.0
