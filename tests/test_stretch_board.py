"""The board of stretches in flight (contract/stretch_board.py): a timing pass waits for the
other processes' long stretches without stopping anyone, then drains the short ones."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from gate_residual_matrix.contract import gpu_lock, stretch_board


@pytest.fixture
def lock(monkeypatch, tmp_path):
    path = str(tmp_path / "gpu.lock")
    monkeypatch.setenv(gpu_lock.ENV, path)
    return path


@pytest.fixture
def other():
    """Another live process, whose pid the board entries below stand for."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _post(lock: str, pid: int, start: float) -> str:
    os.makedirs(stretch_board.folder(lock), exist_ok=True)
    name = os.path.join(stretch_board.folder(lock), str(pid))
    with open(name, "wb") as f:
        f.write(stretch_board._START.pack(start))
    return name


def test_a_stretch_is_on_the_board_while_the_lock_is_held(lock):
    mine = os.path.join(stretch_board.folder(lock), str(os.getpid()))
    with gpu_lock.shared():
        with open(mine, "rb") as f:
            start = stretch_board._START.unpack(f.read())[0]
        assert 0 < time.monotonic() - start < 5
        assert gpu_lock.step_aside()  # compiling: not in flight
        with open(mine, "rb") as f:
            assert stretch_board._START.unpack(f.read())[0] == 0.0
        gpu_lock.step_back()
    with open(mine, "rb") as f:
        assert stretch_board._START.unpack(f.read())[0] == 0.0
    assert stretch_board.oldest_s(lock) == 0.0  # its own entry is not another's


def test_a_pass_waits_for_a_long_stretch_while_the_others_go_on(lock, other):
    """Another process has been in a stretch for a second: the pass waits for its end
    without holding the turnstile, so a third party's shared work is not stopped; the wait
    is counted as ``long`` (a part of ``exclusive``), not as ``drain``."""
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_SH)  # the other process's stretch in flight
    entry = _post(lock, other, time.monotonic() - 1.0)
    before = gpu_lock.waited_s()
    done = threading.Event()

    def timing():
        with gpu_lock.exclusive():
            done.set()

    timer = threading.Thread(target=timing)
    timer.start()
    time.sleep(0.4)
    assert not done.is_set()
    t0 = time.monotonic()
    with gpu_lock.shared():  # not stopped: the turnstile is not taken yet
        pass
    assert time.monotonic() - t0 < 0.3
    with open(entry, "wb") as f:  # the long stretch ends
        f.write(stretch_board._START.pack(0.0))
    fcntl.flock(held, fcntl.LOCK_UN)
    os.close(held)
    timer.join(timeout=20)
    assert done.is_set()
    after = gpu_lock.waited_s()
    assert after["long"] - before["long"] >= 0.3
    assert after["exclusive"] - before["exclusive"] >= after["long"] - before["long"]
    assert after["drain"] - before["drain"] < 0.3


def test_a_young_stretch_is_left_to_the_drain(lock, other):
    """A stretch just begun is not waited for politely: the pass takes the turnstile and
    drains it, as before the board."""
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(held, fcntl.LOCK_SH)
    _post(lock, other, time.monotonic() + 60)  # began "now" for the next minute
    before = gpu_lock.waited_s()
    done = threading.Event()

    def timing():
        with gpu_lock.exclusive():
            done.set()

    timer = threading.Thread(target=timing)
    timer.start()
    time.sleep(0.5)
    fcntl.flock(held, fcntl.LOCK_UN)
    os.close(held)
    timer.join(timeout=20)
    after = gpu_lock.waited_s()
    assert after["drain"] - before["drain"] >= 0.4
    assert after["long"] - before["long"] < 0.1


def test_a_dead_process_is_not_waited_for(lock):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    entry = _post(lock, gone.pid, time.monotonic() - 10.0)
    before = gpu_lock.waited_s()
    with gpu_lock.exclusive():
        pass
    assert gpu_lock.waited_s()["long"] - before["long"] < 0.2
    assert not os.path.exists(entry)


def test_the_wait_is_bounded(lock, other, monkeypatch):
    """A stretch that never ends is waited for at most WAIT_MAX_S; then the pass drains."""
    monkeypatch.setattr(stretch_board, "WAIT_MAX_S", 0.5)
    _post(lock, other, time.monotonic() - 1.0)
    before = gpu_lock.waited_s()
    t0 = time.monotonic()
    with gpu_lock.exclusive():
        pass
    assert 0.4 <= time.monotonic() - t0 < 5
    assert 0.4 <= gpu_lock.waited_s()["long"] - before["long"] < 1.0


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
