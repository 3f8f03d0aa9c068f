"""A cell process ends by itself at its deadline, or when its runner is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gate_residual_matrix.runner.backends import lifetime

ROOT = Path(__file__).resolve().parent.parent
SLEEPER = ("from gate_residual_matrix.runner.backends import lifetime; "
           "lifetime.start_watchdog(poll_s=0.05); import time; time.sleep(60)")


def test_a_cell_past_its_deadline_exits_by_itself():
    env = {**os.environ, lifetime.DEADLINE_ENV: f"{time.time() + 1:.3f}"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SLEEPER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == lifetime.DEADLINE_EXIT
    assert time.monotonic() - t0 < 15 and "deadline passed" in proc.stdout


def test_a_cell_whose_parent_is_gone_exits(tmp_path):
    """A middle process starts the cell (naming itself as the parent), lets it start its
    watchdog, then exits: the orphaned cell notices within a second and ends."""
    pid_file = tmp_path / "pid"
    middle = (f"import os, subprocess, sys; env = dict(os.environ, {lifetime.PARENT_ENV}="
              f"str(os.getpid())); p = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], "
              f"env=env); open({str(pid_file)!r}, 'w').write(str(p.pid)); import time; "
              f"time.sleep(3)")
    subprocess.run([sys.executable, "-c", middle], cwd=ROOT, timeout=30, check=True)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        try:
            if "zombie" in Path(f"/proc/{pid}/status").read_text().lower():
                break
        except OSError:
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{pid}").exists() and "zombie" not in Path(
        f"/proc/{pid}/status").read_text().lower()
    assert not alive, "the orphaned cell kept running"


def test_child_environment_names_the_runner_and_a_deadline_after_its_timeout():
    env = lifetime.child_environment(10.0)
    assert env[lifetime.PARENT_ENV] == str(os.getpid())
    assert time.time() + 10 < float(env[lifetime.DEADLINE_ENV]) < time.time() + 30
