"""The modes step's queue: cells at once within the CPUs, the first that fits first."""

from __future__ import annotations

import threading
import time

from gate_residual_matrix.runner.gpu_host.schedule import Unit, run_queue


def _tracked(n: int):
    """``n`` units' bodies that record how many CPUs were in use at once."""
    lock = threading.Lock()
    state = {"cpus": 0, "peak": 0, "order": []}

    def body(name: str, cpus: int, seconds: float):
        def run():
            with lock:
                state["cpus"] += cpus
                state["peak"] = max(state["peak"], state["cpus"])
                state["order"].append(name)
            time.sleep(seconds)
            with lock:
                state["cpus"] -= cpus
            return name
        return run
    return state, body


def test_units_never_take_more_cpus_than_there_are():
    state, body = _tracked(5)
    units = [Unit(f"u{i}", c, body(f"u{i}", c, 0.05)) for i, c in enumerate([6, 6, 6, 3, 3])]
    done = run_queue(units, jobs=16, cpus=16)
    assert [u.result for u in done] == ["u0", "u1", "u2", "u3", "u4"]
    assert state["peak"] <= 16
    # u2 (6) does not fit beside u0 and u1 (12 of 16): u3 (3) starts before it
    assert state["order"].index("u3") < state["order"].index("u2")
    assert all(u.started_s is not None and u.ended_s >= u.started_s for u in done)


def test_jobs_bounds_the_units_at_once():
    state, body = _tracked(4)
    run_queue([Unit(f"u{i}", 1, body(f"u{i}", 1, 0.03)) for i in range(4)], jobs=2, cpus=16)
    assert state["peak"] == 2


def test_a_unit_larger_than_the_host_runs_alone():
    state, body = _tracked(2)
    done = run_queue([Unit("big", 32, body("big", 32, 0.02)), Unit("small", 1,
                                                                    body("small", 1, 0.02))],
                     jobs=4, cpus=16)
    assert [u.result for u in done] == ["big", "small"]
    assert state["peak"] == 32  # alone: the small one waited


def test_an_error_stays_with_its_unit():
    def boom():
        raise RuntimeError("a cell's defect")

    done = run_queue([Unit("bad", 1, boom), Unit("good", 1, lambda: 7)], jobs=2, cpus=2)
    assert isinstance(done[0].error, RuntimeError) and done[0].result is None
    assert done[1].result == 7 and done[1].error is None


def test_most_at_once_counts_overlaps_not_touching_ends():
    from gate_residual_matrix.runner.gpu_host.schedule import most_at_once

    def unit(a, b):
        return Unit("u", 1, print, started_s=a, ended_s=b)

    assert most_at_once([]) == 0
    assert most_at_once([unit(0, 1), unit(1, 2), unit(2, 3)]) == 1
    assert most_at_once([unit(0, 5), unit(1, 2), unit(1.5, 3)]) == 3
    assert most_at_once([unit(0, 5), Unit("never", 1, print)]) == 1


def test_the_gpu_memory_peak_is_the_largest_reading(tmp_path, monkeypatch):
    """A fake nvidia-smi that answers 100, then 300, then 200 MiB: the peak is 300."""
    from gate_residual_matrix.runner.gpu_host import gpu_memory

    counter = tmp_path / "n"
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nn=$(cat {counter} 2>/dev/null || echo 0)\n"
                    f"echo $((n + 1)) > {counter}\n"
                    "case $n in 0) echo 100;; 1) echo 300;; *) echo 200;; esac\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(gpu_memory, "MEMORY_EVERY_S", 0.01)

    def calls() -> int:
        try:
            return int(counter.read_text())
        except (OSError, ValueError):  # not written yet, or being written
            return 0

    with gpu_memory.PeakMemory() as memory:
        deadline = time.monotonic() + 5
        while calls() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert memory.peak == 300


def test_without_nvidia_smi_the_peak_is_unknown(tmp_path, monkeypatch):
    from gate_residual_matrix.runner.gpu_host import gpu_memory

    monkeypatch.setenv("PATH", str(tmp_path))
    with gpu_memory.PeakMemory() as memory:
        pass
    assert memory.peak is None


def test_several_gpus_give_the_fullest_ones_memory(tmp_path, monkeypatch):
    from gate_residual_matrix.runner.gpu_host import gpu_memory

    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 1000; echo 2000\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(gpu_memory, "MEMORY_EVERY_S", 0.01)
    with gpu_memory.PeakMemory() as memory:
        pass  # the reading at the end counts too
    assert memory.peak == 2000


def test_units_never_take_more_gpu_memory_than_there_is():
    """Two large cells never run together; small ones fill in beside a large one."""
    lock = threading.Lock()
    state = {"mib": 0, "peak": 0, "beside": set(), "running": set()}

    def body(name: str, mib: int, seconds: float):
        def run():
            with lock:
                state["mib"] += mib
                state["peak"] = max(state["peak"], state["mib"])
                state["beside"] |= {(name, other) for other in state["running"]}
                state["running"].add(name)
            time.sleep(seconds)
            with lock:
                state["mib"] -= mib
                state["running"].discard(name)
            return name
        return run

    sizes = {"large1": 100, "large2": 100, "small1": 25, "small2": 25, "small3": 25}
    units = [Unit(n, 1, body(n, m, 0.1 if n.startswith("large") else 0.03), memory=m)
             for n, m in sizes.items()]
    done = run_queue(units, jobs=16, cpus=16, memory=136)
    assert [u.result for u in done] == list(sizes)
    assert state["peak"] <= 136
    pairs = {frozenset(p) for p in state["beside"]}
    assert frozenset({"large1", "large2"}) not in pairs
    assert any("large1" in p and any(n.startswith("small") for n in p) for p in pairs)
    # without a memory figure only the CPUs count: the two large ones run together
    state.update(mib=0, peak=0)
    run_queue([Unit(n, 1, body(n, m, 0.05), memory=m) for n, m in sizes.items()], jobs=16,
              cpus=16)
    assert state["peak"] == sum(sizes.values())


def test_a_unit_larger_than_the_memory_runs_alone():
    done = run_queue([Unit("huge", 1, lambda: time.sleep(0.1), memory=500),
                      Unit("small", 1, lambda: None, memory=10)],
                     jobs=4, cpus=16, memory=100)
    huge, small = done
    assert [u.error for u in done] == [None, None]
    assert small.started_s >= huge.ended_s  # it waited: nothing runs beside the huge one


def test_a_large_unit_is_not_passed_over_for_ever(monkeypatch):
    """Small units fill in beside a large one, but once a waiting unit has been passed
    MAX_PASSED times, nothing else starts before it (the H200 queue's case: a 78 GB cell
    with two 26 GB ones kept the 105 GB cells waiting to the end)."""
    from gate_residual_matrix.runner.gpu_host import schedule

    lock = threading.Lock()
    started = []

    def body(name, seconds):
        def run():
            with lock:
                started.append(name)
            time.sleep(seconds)
        return run

    sizes = [("a1", 105, 0.10), ("b1", 78, 0.15), ("a2", 105, 0.10), ("b2", 78, 0.15),
             ("b3", 78, 0.15)] + [(f"s{i}", 26, 0.08) for i in range(10)]
    units = [Unit(n, 1, body(n, t), memory=m) for n, m, t in sizes]
    monkeypatch.setattr(schedule, "MAX_PASSED", 2)
    run_queue(units, jobs=16, cpus=16, memory=136)
    order = [n for n, _, _ in sizes]
    later_first = [n for n in started[:started.index("a2")] if order.index(n) > order.index("a2")]
    assert len(later_first) <= 2, started
