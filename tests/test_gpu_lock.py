"""contract/gpu_lock.py: several cells on one GPU, timings alone.

Each test runs real processes that take the lock file and log (time, event) lines; the
assertions are on the order of those events, never on a speed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gate_residual_matrix.contract import gpu_lock
from tests.lock_probe import free_for_a_timer

ROOT = Path(__file__).resolve().parents[1]

_HOLDER = textwrap.dedent("""
    import sys, time
    from gate_residual_matrix.contract import gpu_lock
    kind, hold, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    def note(what):
        with open(log, "a") as f:
            f.write(f"{time.monotonic():.6f} {kind} {what}\\n")
    note("asks")
    with getattr(gpu_lock, kind)():
        note("in")
        time.sleep(hold)
        note("out")
""")


def _start(kind: str, hold: float, log: Path, lock: Path) -> subprocess.Popen:
    env = {**os.environ, gpu_lock.ENV: str(lock), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", _HOLDER, kind, str(hold), str(log)], env=env)


def _events(log: Path) -> list[tuple[float, str, str]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return sorted((float(t), k, w) for t, k, w in rows)


def _wait_for(log: Path, what: str, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and what in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"no {what!r} in {log.read_text() if log.exists() else '(no log)'}")


def test_exclusive_waits_for_shared_holders_and_keeps_new_ones_out(tmp_path):
    log, lock = tmp_path / "log", tmp_path / "gpu.lock"
    first = _start("shared", 1.5, log, lock)
    _wait_for(log, "shared in")
    timer = _start("exclusive", 0.8, log, lock)
    _wait_for(log, "exclusive asks")
    time.sleep(0.3)  # the timer now holds the turnstile
    late = _start("shared", 0.1, log, lock)
    for p in (first, timer, late):
        assert p.wait(timeout=30) == 0
    order = [(k, w) for _, k, w in _events(log) if w in ("in", "out")]
    # the timer starts only after the first holder left, and the late shared holder, which
    # asked while the timer waited, starts only after the timer is done
    assert order.index(("exclusive", "in")) > order.index(("shared", "out"))
    ex_out = order.index(("exclusive", "out"))
    late_in = [i for i, e in enumerate(order) if e == ("shared", "in")][-1]
    assert late_in > ex_out


def test_shared_holders_overlap(tmp_path):
    log, lock = tmp_path / "log", tmp_path / "gpu.lock"
    procs = [_start("shared", 1.0, log, lock) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=30) == 0
    ins = [t for t, _, w in _events(log) if w == "in"]
    outs = [t for t, _, w in _events(log) if w == "out"]
    assert max(ins) < min(outs), "two cells' untimed GPU work must be able to overlap"


def test_a_killed_holder_releases_the_lock(tmp_path):
    log, lock = tmp_path / "log", tmp_path / "gpu.lock"
    holder = _start("exclusive", 60, log, lock)
    _wait_for(log, "exclusive in")
    waiter = _start("shared", 0.0, log, lock)
    _wait_for(log, "shared asks")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert waiter.wait(timeout=20) == 0
    assert "shared in" in log.read_text()


def test_threads_share_one_process_lock_and_exclusive_is_refused_inside_shared(monkeypatch,
                                                                              tmp_path):
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    # threads racing to open the lock file first get the one pair of descriptors (two pairs
    # would be two flock owners in one process: a CI run hung on that)
    start = threading.Barrier(8, timeout=10)
    seen = []

    def opener():
        start.wait()
        seen.append(gpu_lock._fds(gpu_lock.path()))

    openers = [threading.Thread(target=opener) for _ in range(8)]
    for t in openers:
        t.start()
    for t in openers:
        t.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1
    inside = threading.Barrier(2, timeout=10)

    def worker():
        with gpu_lock.shared():
            inside.wait()

    t = threading.Thread(target=worker)
    t.start()
    with gpu_lock.shared():
        inside.wait()  # both threads inside at once: one process, one shared lock
        with pytest.raises(RuntimeError, match="inside shared"):
            with gpu_lock.exclusive():
                pass
        t.join(timeout=10)  # the worker leaves first: this thread releases the file lock
    assert not t.is_alive()
    with gpu_lock.exclusive():  # and the process can still take it alone afterwards
        pass


def test_without_the_setting_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(gpu_lock.ENV, raising=False)
    assert gpu_lock.path() is None
    with gpu_lock.shared(), gpu_lock.shared():
        pass
    with gpu_lock.exclusive():
        pass


def test_the_time_spent_waiting_for_the_lock_is_counted(monkeypatch, tmp_path):
    """What another cell's hold costs this process is in waited_s (the report's
    ``gpu_lock_wait``): at least the time the other held the lock after we asked."""
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    other = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)  # another cell, timing
    fcntl.flock(other, fcntl.LOCK_EX)
    before = gpu_lock.waited_s()
    asked = threading.Event()

    def cell():
        asked.set()
        with gpu_lock.shared():
            pass

    t = threading.Thread(target=cell)
    t.start()
    asked.wait()
    time.sleep(0.5)
    fcntl.flock(other, fcntl.LOCK_UN)
    os.close(other)
    t.join(timeout=20)
    after = gpu_lock.waited_s()
    assert after["shared"] - before["shared"] >= 0.4
    assert after["exclusive"] == before["exclusive"] and after["drain"] == before["drain"]
    held = gpu_lock.held_s()
    with gpu_lock.exclusive():  # nobody holds it now: (almost) no wait
        time.sleep(0.3)
    assert gpu_lock.waited_s()["exclusive"] - after["exclusive"] < 0.4
    assert gpu_lock.held_s() - held >= 0.3  # the time it held the GPU alone


def test_the_drain_is_the_wait_behind_a_stretch_in_progress(monkeypatch, tmp_path):
    """A timing pass that asks while another process is inside a stretch of shared GPU work
    waits for that stretch with the turnstile held: that wait is ``drain``, a part of
    ``exclusive``."""
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    other = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)  # another cell, mid-stretch
    fcntl.flock(other, fcntl.LOCK_SH)
    before = gpu_lock.waited_s()
    done = threading.Event()

    def timing():
        with gpu_lock.exclusive():
            done.set()

    timer = threading.Thread(target=timing)
    timer.start()
    time.sleep(0.5)
    assert not done.is_set()
    fcntl.flock(other, fcntl.LOCK_UN)
    os.close(other)
    timer.join(timeout=20)
    after = gpu_lock.waited_s()
    drain = after["drain"] - before["drain"]
    assert drain >= 0.4 and after["exclusive"] - before["exclusive"] >= drain
    assert after["shared"] == before["shared"]


def test_stretches_of_shared_work_are_counted_by_length(monkeypatch, tmp_path):
    """Each stretch (the lock file taken shared, then let go) lands in one bucket, nested
    holders of one process making one stretch."""
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    seconds0, counts0 = gpu_lock.stretches()
    with gpu_lock.shared():
        time.sleep(0.2)
        with gpu_lock.shared():  # re-entrant: the same stretch
            pass
    with gpu_lock.shared():
        pass
    seconds, counts = gpu_lock.stretches()
    grew = {k: counts[k] - counts0[k] for k in counts if counts[k] != counts0[k]}
    assert grew == {"0.1-0.5s": 1, "<0.1s": 1}
    assert 0.2 <= seconds["0.1-0.5s"] - seconds0["0.1-0.5s"] < 0.5


def _long_hold(joins: int) -> None:
    """One stretch of about 0.3 s on this thread, which ``joins`` other threads' sections
    join while it holds."""
    with gpu_lock.shared():
        for _ in range(joins):
            joiner = threading.Thread(target=_section)
            joiner.start()
            joiner.join(timeout=10)
        time.sleep(0.3)


def _section() -> None:
    with gpu_lock.shared():
        pass


def test_long_stretches_count_the_threads_that_joined_them(monkeypatch, tmp_path):
    """A long stretch that other threads joined while it was held (a chain: joiners pass no
    turnstile) is told from a single long hold by its joins."""
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    monkeypatch.setattr(gpu_lock, "LONG_S", 0.2)
    gpu_lock.doing("chained")
    before = gpu_lock.long_stretch_joins()
    _long_hold(joins=3)
    gpu_lock.doing("alone")
    _long_hold(joins=0)
    gpu_lock.doing("")
    after = gpu_lock.long_stretch_joins()
    grew = {k: after[k] - before.get(k, 0) for k in after}
    assert grew["_long_hold (chained)"] == 3
    assert grew["_long_hold (alone)"] == 0


_COMPILER = textwrap.dedent("""
    import sys, time
    from gate_residual_matrix.contract import gpu_lock
    hold, log, lock = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    def note(what):
        with open(log, "a") as f:
            f.write(f"{time.monotonic():.6f} compiling {what}\\n")
    with gpu_lock.compiling(lock):
        note("in")
        time.sleep(hold)
        note("out")
""")


def test_no_cell_times_while_compile_workers_run_but_shared_work_goes_on(tmp_path):
    """The compile gate: a cell that asks for the GPU alone waits until the compile-ahead
    ends, without holding the turnstile meanwhile, so the other cells' shared stretches go
    on; after it, the timing goes ahead as usual."""
    log, lock = tmp_path / "log", tmp_path / "gpu.lock"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    compiler = subprocess.Popen([sys.executable, "-c", _COMPILER, "2.0", str(log), str(lock)],
                                env=env)
    _wait_for(log, "compiling in")
    timer = _start("exclusive", 0.1, log, lock)
    _wait_for(log, "exclusive asks")
    time.sleep(0.3)
    other = _start("shared", 0.1, log, lock)
    for p in (compiler, timer, other):
        assert p.wait(timeout=30) == 0
    order = [(k, w) for _, k, w in _events(log) if w in ("in", "out")]
    assert order.index(("shared", "out")) < order.index(("compiling", "out"))
    assert order.index(("exclusive", "in")) > order.index(("compiling", "out"))


def test_a_stretch_steps_aside_while_compiling_and_takes_the_lock_again(monkeypatch,
                                                                       tmp_path):
    """Inside a stretch, step_aside lets the lock file go (a timer could take it) and counts
    the time; step_back takes it again; the stretch's two parts count as two stretches."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    aside0, (_, counts0) = gpu_lock.aside_s(), gpu_lock.stretches()
    with gpu_lock.shared():
        assert not free_for_a_timer(lock)
        assert gpu_lock.step_aside()
        assert not gpu_lock.step_aside()  # once: already aside
        assert free_for_a_timer(lock)
        time.sleep(0.2)
        gpu_lock.step_back()
        assert not free_for_a_timer(lock)
        gpu_lock.step_back()  # more often than step_aside: nothing
    assert free_for_a_timer(lock)
    assert gpu_lock.aside_s() - aside0 >= 0.2
    assert sum(gpu_lock.stretches()[1].values()) - sum(counts0.values()) == 2


@contextlib.contextmanager
def _copy_in_flight():
    """Another thread of this process inside a stretch (a hashing thread's copy) meanwhile."""
    inside, leave = threading.Event(), threading.Event()

    def copier():
        with gpu_lock.shared():
            inside.set()
            leave.wait(timeout=20)

    t = threading.Thread(target=copier)
    t.start()
    inside.wait(timeout=20)
    try:
        yield
    finally:
        leave.set()
        t.join(timeout=20)


def test_stepping_aside_is_refused_where_it_would_free_gpu_work(monkeypatch, tmp_path):
    """Not outside a stretch, not inside a timing pass, not while another thread of the
    process is inside a stretch (a hashing copy), and nothing without the setting."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    assert not gpu_lock.step_aside()
    with gpu_lock.exclusive():
        assert not gpu_lock.step_aside()
        assert not free_for_a_timer(lock)
    with _copy_in_flight(), gpu_lock.shared():
        assert not gpu_lock.step_aside()
        assert not free_for_a_timer(lock)
    monkeypatch.delenv(gpu_lock.ENV)
    with gpu_lock.shared():
        assert not gpu_lock.step_aside()


def test_a_stretch_left_aside_ends_without_the_lock_and_the_next_takes_it(monkeypatch,
                                                                          tmp_path):
    """A compile that raises skips its step_back: the stretch ends with the lock already
    let go, and the next stretch takes it as usual."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    with pytest.raises(ValueError), gpu_lock.shared():
        gpu_lock.step_aside()
        raise ValueError("the compile failed")
    gpu_lock.step_back()  # late: nothing to take back
    assert free_for_a_timer(lock)
    with gpu_lock.shared():
        assert not free_for_a_timer(lock)


def test_long_stretches_are_recorded_by_where_they_began(monkeypatch, tmp_path):
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "gpu.lock"))
    monkeypatch.setattr(gpu_lock, "LONG_S", 0.1)
    before = gpu_lock.long_stretches()
    gpu_lock.doing("impl_a")

    def slow_check():
        with gpu_lock.shared():
            time.sleep(0.15)

    slow_check()
    with gpu_lock.shared():  # short: not recorded
        pass
    gpu_lock.doing("")
    grew = {k: v - before.get(k, 0.0) for k, v in gpu_lock.long_stretches().items()
            if v != before.get(k)}
    assert list(grew) == ["slow_check (impl_a)"] and grew["slow_check (impl_a)"] >= 0.15


def test_only_the_holder_or_a_helper_of_the_main_threads_stretch_steps_aside(monkeypatch,
                                                                             tmp_path):
    """A thread that compiles outside any stretch must not free a hashing thread's copy; a
    thread without a stretch of its own (autograd's engine, compiling a backward) may step
    aside the main thread's stretch."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    got = {}
    with _copy_in_flight():
        assert not gpu_lock.step_aside()  # the main thread, in no stretch: the copy keeps it
        assert not free_for_a_timer(lock)

    def engine():
        got["aside"] = gpu_lock.step_aside()
        got["free"] = free_for_a_timer(lock)
        gpu_lock.step_back()

    with gpu_lock.shared():  # the main thread's call; its backward compiles elsewhere
        helper = threading.Thread(target=engine)
        helper.start()
        helper.join(timeout=20)
        assert not free_for_a_timer(lock)
    assert got == {"aside": True, "free": True}
    assert free_for_a_timer(lock)


def test_an_error_at_the_end_of_a_stretch_still_lets_the_lock_go(monkeypatch, tmp_path):
    """A CUDA error surfaces at the stretch's closing synchronize: it is raised, and the lock
    is let go all the same (else no other cell could time again)."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))

    def sticky_error():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_lock, "_drain", sticky_error)
    with pytest.raises(RuntimeError, match="illegal memory access"), gpu_lock.shared():
        assert not free_for_a_timer(lock)
    assert free_for_a_timer(lock)


def test_a_stretch_that_another_thread_joined_can_still_step_aside(monkeypatch, tmp_path):
    """Once the joiner has left, the thread whose stretch it is may step aside for a compile
    (a hashing thread's copy during the main thread's call used to keep every later compile
    of that call under the lock)."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    with gpu_lock.shared():
        joiner = threading.Thread(target=_section)
        joiner.start()
        joiner.join(timeout=10)
        assert gpu_lock.step_aside()
        assert free_for_a_timer(lock)
        gpu_lock.step_back()
        assert not free_for_a_timer(lock)
    assert free_for_a_timer(lock)


def test_a_thread_entering_while_its_process_steps_aside_lets_go_as_it_leaves(
        monkeypatch, tmp_path):
    """The main thread compiles (stepped aside); a hashing thread's copy takes the lock and,
    as it leaves, lets it go again: the rest of the compile is not under the lock. The copy
    counts as a join of the stretch that stepped aside, at its site."""
    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(gpu_lock.ENV, str(lock))
    monkeypatch.setattr(gpu_lock, "LONG_S", 0.0)
    gpu_lock.doing("aside")
    before = gpu_lock.long_stretch_joins()
    with gpu_lock.shared():
        assert gpu_lock.step_aside()
        with _copy_in_flight():
            assert not free_for_a_timer(lock)  # the copy holds it
        assert free_for_a_timer(lock)  # let go again: the main thread is still compiling
        gpu_lock.step_back()
        assert not free_for_a_timer(lock)
    gpu_lock.doing("")
    after = gpu_lock.long_stretch_joins()
    site = "test_a_thread_entering_while_its_process_steps_aside_lets_go_as_it_leaves (aside)"
    assert after.get(site, 0) - before.get(site, 0) >= 1
