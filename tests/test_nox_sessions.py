"""The nox sessions keep the runner's exit codes: a script calling ``nox -s matrix``
can tell bad input (2) from an unwritable report (3), a backend that cannot run (4) and a
failed cell (5).

Each test runs nox itself in a subprocess, through its session machinery (the session
function, ``session.run``, nox's failure handling), with ``--no-venv --no-install`` so that
no virtualenv is made and nothing installed: the session's ``python`` is this interpreter.
A few seconds in all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.runner.errors import (
    BackendError,
    CellsFailed,
    ConfigError,
    Interrupted,
    Regressed,
    ReportError,
)
from tests.committed_reports import HOST_PLAIN_CPU

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def python_on_path(tmp_path_factory) -> str:
    """A PATH whose ``python`` is this interpreter (its virtualenv included)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def nox(path: str, session: str, *posargs: str) -> subprocess.CompletedProcess:
    """``nox -s session -- posargs`` on this project's noxfile, without a virtualenv; its
    ``stdout`` holds everything, nox's lines and the runner's stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--no-venv",
         "--no-install", "--no-color", "-s", session, "--", *posargs],
        env={**os.environ, "PATH": path}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)


def test_bad_option_is_exit_2(python_on_path: str) -> None:
    done = nox(python_on_path, "matrix", "--no-such-option")
    assert done.returncode == 2, done.stdout
    assert "unrecognized arguments: --no-such-option" in done.stdout
    # nox's result line says why, in place of its plain "Session matrix failed."
    assert "nox > Session matrix failed: exit code 2 (bad matrix.yaml or option)." in \
        done.stdout.splitlines()


def test_unreadable_report_is_exit_3(python_on_path: str, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "broken.json").write_text('{"schema_version": 1')
    done = nox(python_on_path, "report", "--reports", str(reports), "--out", str(tmp_path / "o"))
    assert done.returncode == 3, done.stdout
    assert "warning: " in done.stdout and (tmp_path / "o" / "README.md").exists()


def test_docker_backend_without_an_image_is_exit_4(python_on_path: str, tmp_path: Path) -> None:
    """With an engine: no image for the stack, and the matrix builds none (4); without one:
    no engine (4). Either way nothing ran."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data.pop("pip", None)
    cpu = {**data["stacks"]["cpu-torch2.13"], "pip": {}, "torch": "0.0.1"}  # never built
    data["stacks"] = {"never-built": cpu}
    data.update(cases=[{"n": 1}], targets=["cpu"], modes={"plain": {}},
                timing={"warmup": 1, "iters": 2})
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    done = nox(python_on_path, "matrix", "--matrix", str(matrix), "--reports",
               str(tmp_path / "reports"), "--backend", "docker")
    assert done.returncode == 4, done.stdout
    assert "error: --backend docker: " in done.stdout
    assert not (tmp_path / "reports").exists()


def test_refused_cell_is_exit_5(python_on_path: str, tmp_path: Path) -> None:
    """A one-case run against the committed report of another commit is refused: the
    matrix ran to its end, one cell did not end ok (5). No cell process runs."""
    reports = tmp_path / "reports"
    reports.mkdir()
    shutil.copy(HOST_PLAIN_CPU, reports)
    done = nox(python_on_path, "matrix", "--reports", str(reports), "--op", "gate_residual",
               "--stack", "host", "--mode", "plain", "--target", "cpu", "--case", "1",
               "--backend", "host")
    assert done.returncode == 5, done.stdout
    assert "error: 1 of 1 cells did not end ok: host-plain-cpu (refused)" in done.stdout


def test_a_regressed_verdict_is_exit_6(python_on_path: str, tmp_path: Path) -> None:
    """``nox -s compare``: the new report's numba out differs where the baseline's was
    equal (runner/compare_reports/)."""
    report = json.loads((ROOT / "tests" / "data" / "h200" / "host-plain-cuda.json").read_text())
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "host-plain-cuda.json").write_text(json.dumps(report))
    for a, b in (("numba", "eager"), ("eager", "numba")):
        report["results"][a][f"vs {b}"]["257"]["out"][0].update(
            equal=False, differ=1, max_abs=0.5, max_ulp=1, first_differ=3)
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "host-plain-cuda.json").write_text(json.dumps(report))
    done = nox(python_on_path, "compare", str(tmp_path / "base"), str(tmp_path / "new"),
               "--compare-out", str(tmp_path / "out"))
    assert done.returncode == 6, done.stdout
    assert "REGRESSED host-plain-cuda: numba vs eager out: bits:equal->differ" in done.stdout
    assert ("nox > Session compare failed: exit code 6 (a verdict regressed against the "
            "baseline).") in done.stdout.splitlines()


def test_bench_without_a_gpu_is_exit_4_in_one_line(python_on_path: str, tmp_path: Path) -> None:
    """No usage block: the benchmark's one line, then nox's result line with the code."""
    if importlib.util.find_spec("torch") and __import__("torch").cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = nox(python_on_path, "bench", "--out", str(tmp_path / "bench"))
    assert done.returncode == 4, done.stdout
    mine = [line for line in done.stdout.splitlines() if not line.startswith("nox > ")]
    assert len(mine) == 1 and mine[0].startswith("error: no CUDA device: "), done.stdout
    assert "usage:" not in done.stdout and not (tmp_path / "bench").exists()


def test_the_noxfile_knows_every_runner_exit_code() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import noxfile
    finally:
        sys.path.remove(str(ROOT))
    codes = {e.exit_code for e in (ConfigError, ReportError, BackendError, CellsFailed,
                                   Regressed)}
    codes |= {Interrupted(s).exit_code for s in (2, 15)}
    assert set(noxfile.RUNNER_CODES) == codes == {2, 3, 4, 5, 6, 130, 143}


def test_a_quiet_install_says_it_is_still_running(monkeypatch) -> None:
    """pip -q is silent while it unpacks torch: the install helper logs a line every
    HEARTBEAT_S seconds until the command returns, and none after."""
    sys.path.insert(0, str(ROOT))
    try:
        import noxfile
    finally:
        sys.path.remove(str(ROOT))
    lines: list[str] = []
    monkeypatch.setattr(noxfile, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(noxfile.logger, "info", lines.append)

    class Session:
        def run(self, *command: str, external: bool) -> None:
            assert command == ("pip", "install", "torch") and external
            time.sleep(0.3)

    noxfile.install(Session(), "torch", "pip", "install", "torch")
    count = len(lines)
    assert count >= 3 and all(line.startswith("still installing torch (") for line in lines)
    time.sleep(0.2)
    assert len(lines) == count
