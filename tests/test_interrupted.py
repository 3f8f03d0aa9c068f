"""kill -9 at any moment of a report write leaves the old report or the new one, whole.

tests/write_worker.py writes ~2 MB reports of three cells in a loop; this test kills it with
SIGKILL at random moments, many times, and after each kill reads every report: each must be
a complete, valid report of a generation that was there before or that the worker wrote,
byte for byte. The same harness on a plain ``open(..., "w")`` writer must see torn files:
the check is able to fail. Temporary files a kill leaves behind are never read as reports.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gate_residual_matrix.runner.reports.store import (
    read_report,
    read_reports,
    remove_stale_temp_files,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import write_worker

WORKER = Path(write_worker.__file__)


@dataclass
class Outcome:
    kills: int = 0
    torn: list[str] = field(default_factory=list)  # what the reader said of bad files
    wrong: list[str] = field(default_factory=list)  # whole files with unexpected content
    advanced: int = 0  # kills after which some report had a newer generation
    temp_files: int = 0


def kill_while_writing(directory: Path, mode: str, kills: int, seed: int) -> Outcome:
    """Start the worker, SIGKILL it after a random delay, check every report; ``kills`` times."""
    rng, outcome = random.Random(seed), Outcome()
    known: dict[str, int] = {}
    for round_ in range(kills):
        start = (round_ + 1) * 1_000_000
        proc = subprocess.Popen([sys.executable, str(WORKER), str(directory), mode, str(start)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.12))
        proc.kill()
        proc.wait()
        proc.stdout.close()
        outcome.kills += 1
        moved = False
        for cell_id in write_worker.CELLS:
            path = directory / f"{cell_id}.json"
            if not path.exists():
                assert cell_id not in known, f"{cell_id}: a report disappeared"
                continue
            loaded = read_report(path)
            if not loaded.ok:
                outcome.torn.append(f"{cell_id}: {loaded.problem}")
                known.pop(cell_id, None)
                continue
            generation = write_worker.generation_of(loaded.data)
            if generation != known.get(cell_id) and generation < start:
                outcome.wrong.append(f"{cell_id}: generation {generation} from nowhere")
            if loaded.data != write_worker.report(generation, cell_id):
                outcome.wrong.append(f"{cell_id}: generation {generation} differs")
            moved |= generation != known.get(cell_id)
            known[cell_id] = generation
        outcome.advanced += moved
    outcome.temp_files = len([p for p in directory.iterdir() if p.name.endswith(".tmp")])
    return outcome


def write_every_cell_once(directory: Path, start: int) -> None:
    """Run the worker until each cell has a whole report of this run, then SIGKILL it
    (however slow the machine, every cell then has a report)."""
    proc = subprocess.Popen([sys.executable, str(WORKER), str(directory), "atomic", str(start)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    written: set[str] = set()
    while written != set(write_worker.CELLS):
        line = proc.stdout.readline()
        assert line.startswith("wrote "), f"the worker stopped: {line!r}"
        written.add(line.split()[1])
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_sigkill_mid_write_leaves_old_or_new_report_never_torn(tmp_path):
    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(32)))
    outcome = kill_while_writing(tmp_path, "atomic", kills=24, seed=seed)
    assert outcome.torn == [] and outcome.wrong == [], f"seed {seed}: {outcome}"
    assert outcome.advanced >= 5, f"seed {seed}: the worker rarely got a write done: {outcome}"
    # the kills did land inside writes: their temporary files are the evidence
    assert outcome.temp_files >= 1, f"seed {seed}: no kill landed mid-write: {outcome}"
    write_every_cell_once(tmp_path, start=(outcome.kills + 1) * 1_000_000)
    assert sorted(r.path.name for r in read_reports(tmp_path)) == sorted(
        f"{c}.json" for c in write_worker.CELLS)
    assert all(r.ok for r in read_reports(tmp_path))


def test_the_same_kills_tear_a_plain_write(tmp_path):
    """The control: without the temporary file and rename, the reader sees torn reports."""
    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(32)))
    outcome = kill_while_writing(tmp_path, "naive", kills=6, seed=seed)
    assert outcome.torn, f"seed {seed}: no torn file seen: the harness could not fail"
    assert any(p.startswith(("truncated", "corrupt")) or ": truncated" in p for p in outcome.torn)


def _temp(directory: Path, name: str, age_s: float) -> Path:
    path = directory / name
    path.write_text('{"half": ')
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_stale_temp_files_are_invisible_and_removed_when_old(tmp_path):
    old = _temp(tmp_path, ".host-plain-cpu.json.4242.0badc0de.tmp", 3600)
    young = _temp(tmp_path, ".host-plain-cpu.json.4243.deadbeef.tmp", 1)
    other = _temp(tmp_path, ".notes.tmp", 3600)  # not ours: left alone
    stage = tmp_path / ".docker-0123abcd"  # a killed docker run's staging directory
    stage.mkdir()
    (stage / "host-plain-cpu.json").write_text(
        json.dumps(write_worker.report(1, "host-plain-cpu")))
    (tmp_path / ".host-det-cpu.json").write_text("{")
    assert read_reports(tmp_path) == []
    assert remove_stale_temp_files(tmp_path) == [old]
    assert not old.exists() and young.exists() and other.exists()
    assert remove_stale_temp_files(tmp_path / "missing") == []

