"""One queue of compile workers for every matrix file (runner/gpu_host/compile_queue.py): each
file's mode is heard as soon as its calls are made, the first mode's job gets the workers
before the later ones, a failing worker costs its own calls only and never loops."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.ops.gate_residual.compiled import missing_compiler
from gate_residual_matrix.runner.cell import precompile
from gate_residual_matrix.runner.config.matrix import parse_matrix
from gate_residual_matrix.runner.gpu_host import compile_queue


def _matrix_file(tmp_path: Path, name: str, seed: int, n: int) -> Path:
    m = parse_matrix({
        "schema_version": 1, "op": "gate_residual",
        "problem": {"D": 16, "G": 3, "dtype": "bfloat16", "index_dtype": "int64", "seed": seed},
        "cases": [{"n": n}], "implementations": ["eager", "fp64", "compiled"],
        "baseline": "eager", "accuracy_reference": "fp64", "repeats": 2,
        "timing": {"warmup": 0, "iters": 1}, "batch_invariance": {"max_size": 5},
        "modes": {"plain": {}, "inference": {"torch": {"inference_mode": True}}},
        "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"]})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(m.model_dump(mode="json", exclude_none=True)))
    return path


def _plan(mode: str, calls: int, **kw) -> precompile.ModePlan:
    item = {"impl": "eager", "dtype": "float32", "index_dtype": "int64", "rows": 2,
            "grad": "train"}
    return precompile.ModePlan(mode, [dict(item, rows=r + 2) for r in range(calls)],
                               kw.get("torch", {}), kw.get("env", {}), f"key-{mode}",
                               "gate_residual", {"D": 8, "G": 3})


def test_jobs_are_one_per_mode_first_waves_first_files_in_the_order_given():
    a, b = Path("a.yaml"), Path("b.yaml")
    jobs = compile_queue.make_jobs([(a, [_plan("plain", 2), _plan("tf32", 3)]),
                                    (b, [_plan("plain", 4), _plan("tf32", 1)])], target="cpu")
    assert [(j.mode, j.first, [p for p, _ in j.parts]) for j in jobs] == [
        ("plain", True, [a, b]), ("tf32", False, [a, b])]
    assert [r for _, _, r in jobs[0].ranges()] == [range(0, 2), range(2, 6)]
    assert jobs[0].calls[2]["rows"] == 2 and jobs[0].calls[2]["op"] == "gate_residual"
    # a mode whose settings differ between files is a job of its own; a file whose first
    # plan is not plain (its plain report is finished) starts a first wave of that mode
    other = compile_queue.make_jobs([(a, [_plan("tf32", 1, env={"X": "1"})]),
                                     (b, [_plan("plain", 1), _plan("tf32", 1)])], target="cpu")
    assert [(j.mode, j.first) for j in other] == [("tf32", True), ("plain", True),
                                                  ("tf32", False)]


def test_free_workers_go_to_the_first_wave_then_to_the_later_job_with_most_left(tmp_path):
    jobs = compile_queue.make_jobs([(Path("a"), [_plan("plain", 3), _plan("tf32", 2),
                                                 _plan("inference", 6)])], target="cpu")
    running = compile_queue._Running(jobs, tmp_path)
    assert running.next_job() == 0
    claims = [Path(f"{p.with_suffix('')}.claims") for p in running.plans]
    claims[0].write_text("2")
    assert running.next_job() == 0  # one call of the first wave is left to claim
    claims[0].write_text("3")
    assert running.next_job() == 2  # six calls left beat two
    claims[2].write_text("6")
    assert running.next_job() == 1
    claims[1].write_text("2")
    assert running.next_job() is None and running.over(1)


@pytest.mark.skipif(missing_compiler("cpu") is not None, reason="needs g++ for inductor")
def test_every_files_mode_is_compiled_in_one_queue_and_heard_as_it_ends(
        tmp_path, fresh_seed, monkeypatch):
    """Two files, two modes, two workers: each (file, mode) heard once, compiled, its stamp
    left; the first wave over only after both files' first mode is heard; the cells then
    find every mode stamped."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    rng = random.Random(fresh_seed)
    files = [_matrix_file(tmp_path, f"{name}.yaml", fresh_seed + i, rng.randrange(6, 20))
             for i, name in enumerate(("a", "b"))]
    plans = []
    for path in files:
        done, got = precompile.mode_plans(path, target="cpu", modes=["plain", "inference"])
        assert done == {} and [p.mode for p in got] == ["plain", "inference"]
        plans.append((path, got))
    heard: list = []
    record = compile_queue.run_jobs(
        compile_queue.make_jobs(plans, target="cpu"), workers=2, timeout_s=600,
        on_part=lambda path, mode, outcome: heard.append((path.name, mode, outcome)),
        on_first_over=lambda: heard.append("first wave over"))
    assert record["failed"] == [] and record["calls"] == sum(
        len(p.items) for _, ps in plans for p in ps)
    # the first wave is over after both files' plain (a later part may come before it too)
    over = heard.index("first wave over")
    plain_before = sorted(h[:2] for h in heard[:over] if h[1] == "plain")
    assert plain_before == [("a.yaml", "plain"), ("b.yaml", "plain")]
    assert sorted(h for h in heard if h != "first wave over") == [
        (f, m, "compiled") for f in ("a.yaml", "b.yaml") for m in ("inference", "plain")]
    for path in files:
        assert precompile.mode_plans(path, target="cpu", modes=["plain", "inference"]) == (
            {"plain": "stamped", "inference": "stamped"}, [])


def test_a_call_that_raises_costs_its_own_part_only(tmp_path, monkeypatch):
    """A call that raises is recorded and its worker goes on: that file's part is failed
    with the error, the other file's part is still compiled."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    bad = _plan("plain", 2)
    for item in bad.items:
        item["impl"] = "no_such_implementation"
    good = _plan("plain", 1)
    heard: dict = {}
    record = compile_queue.run_jobs(
        compile_queue.make_jobs([(Path("bad.yaml"), [bad]), (Path("good.yaml"), [good])],
                                target="cpu"),
        workers=2, timeout_s=300, on_part=lambda p, m, o: heard.setdefault(p.name, o))
    assert heard["good.yaml"] == "compiled", heard
    assert heard["bad.yaml"].startswith("failed: 2 of 2 calls not made ("), heard
    assert "no_such_implementation" in heard["bad.yaml"] and record["failed"] == []


def test_workers_that_cannot_start_are_not_restarted_for_ever(tmp_path, monkeypatch):
    """A mode whose workers die before their first claim (settings torch refuses): after
    MAX_FAILED of them the job gets no more, and its parts are failed with their exits."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    plan = _plan("plain", 3, torch={"no_such_setting": True})
    heard: dict = {}
    record = compile_queue.run_jobs(
        compile_queue.make_jobs([(Path("a.yaml"), [plan])], target="cpu"), workers=2,
        timeout_s=300, on_part=lambda p, m, o: heard.setdefault(p.name, o))
    # the workers running when the limit is reached die too: at most workers - 1 more
    assert compile_queue.MAX_FAILED <= len(record["failed"]) <= compile_queue.MAX_FAILED + 1
    assert record["workers"] == len(record["failed"]), record
    assert heard["a.yaml"].startswith("failed: 3 of 3 calls not made (worker-"), heard
    assert "ValidationError" in heard["a.yaml"], heard  # the error line, not pydantic's hint


def test_a_part_is_told_once_each_call_is_made_or_lost(tmp_path):
    """Without processes: the done and lost files decide. A part with a call missing is
    not compiled; with the missing call lost it is failed at once, before the job ends."""
    a, b = Path("a.yaml"), Path("b.yaml")
    jobs = compile_queue.make_jobs([(a, [_plan("plain", 2)]), (b, [_plan("plain", 2)])],
                                   target="cpu")
    running = compile_queue._Running(jobs, tmp_path)
    done, lost = Path(f"{running.plans[0]}.done"), Path(f"{running.plans[0]}.lost")
    done.write_text("0\n2\n3")  # the last line half-written: 3 is not done yet
    assert running.settle(0, final=False) == []
    lost.write_text("1\teager: RuntimeError: boom\n")
    (got,) = running.settle(0, final=False)
    assert got[0] == a and got[2] == "failed: 1 of 2 calls not made (eager: RuntimeError: boom)"
    done.write_text("0\n2\n3\n")
    assert [(p, o) for p, _, o in running.settle(0, final=False)] == [(b, "compiled")]
    assert running.settle(0, final=True) == []  # each part told once
