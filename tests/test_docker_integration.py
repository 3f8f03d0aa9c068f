"""Integration: a real Docker engine builds the local base image and the CPU stack, and runs
cells in containers through ``run_matrix`` (marked ``docker``; CI runs it, see .ci/run).

Without an engine these tests fail, they do not skip: start one with
``bash .ci/install-docker.sh`` or deselect them with ``-m "not docker"``. Making the base
image needs root (debootstrap); it is made once and kept (``nox -s base_image``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gate_residual_matrix.runner.backends.docker import base_image
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.docker.engine import build_stacks
from gate_residual_matrix.runner.pipeline import run_matrix
from gate_residual_matrix.runner.reports.store import read_report

pytestmark = pytest.mark.docker

ROOT = Path(__file__).parent.parent
SHIPPED = yaml.safe_load((ROOT / "matrix.yaml").read_text())
STACK = "cpu-torch2.13"


@pytest.fixture(scope="module", autouse=True)
def pinned_project():
    """A fixed project state, so that edits to the checkout while the tests run do not change
    the fingerprints between runs (tests/test_rerun.py covers the project state's part)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_RESIDUAL_COMMIT", "0123456789abcdef0123456789abcdef01234567")
        yield


@pytest.fixture(scope="module")
def engine() -> DockerBackend:
    backend = DockerBackend(progress=False)
    why = backend.available()
    if why:
        pytest.fail(f"{why}: run `bash .ci/install-docker.sh` (root) or deselect with "
                    "-m 'not docker'", pytrace=False)
    base_image.make(SHIPPED["stacks"][STACK]["base_image"], backend=backend)
    return backend


@pytest.fixture(scope="module")
def small_matrix(tmp_path_factory) -> Path:
    """The shipped CPU stack as is (same image tag as `nox -s build`), one small case, and two
    stacks whose build fails: one without its base image, one with a pin pip cannot meet."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    cpu = data["stacks"][STACK]
    data["stacks"] = {
        STACK: cpu,
        "nobase": {**cpu, "base_image": "gate-residual/absent:never-made"},
        "badpin": {**cpu, "torch": "0.0.1"},
    }
    data.update(cases=[{"n": 257}], targets=["cpu"], repeats=2,
                timing={"warmup": 1, "iters": 2}, modes={"plain": {}},
                implementations=["eager", "numba", "fp64", "compiled"])
    data.pop("batch_invariance", None)
    path = tmp_path_factory.mktemp("matrix") / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def run(engine: DockerBackend, small_matrix: Path, tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    outcomes = run_matrix(small_matrix, reports_dir=reports, backend="docker", render=False,
                          timeout_s=900, build=True)
    # Every commit changes the project layer, so each run tags a new image of the stack: keep
    # only this one (its layers stay), or a CI machine's disk fills run after run.
    build_stacks(small_matrix, stacks=[STACK], prune=True, engine=engine)
    return {o.cell: o for o in outcomes}, reports


def test_cpu_cell_runs_in_its_image(run) -> None:
    outcomes, reports = run
    assert outcomes[f"{STACK}-plain-cpu"].status == "ok", outcomes[f"{STACK}-plain-cpu"]
    report = read_report(reports / f"{STACK}-plain-cpu.json").data
    assert report["status"] == "ok" and report["cell"]["backend"] == "docker"
    image = report["image"]
    assert image["tag"].startswith(f"gate-residual-matrix:{STACK}-")
    assert image["id"].startswith("sha256:") and image["base_id"].startswith("sha256:")
    assert image["pins"] == {"python": "3.11", "torch": "==2.13.0+cpu", "numba-cuda": "==0.30.4"}
    env = report["environment"]
    assert env["torch"] == "2.13.0+cpu" and env["python"].startswith("3.11.")
    assert env["libraries"]["numba-cuda"] == "0.30.4" and env["libraries"]["numpy"] < "2.5"
    out = report["results"]["numba"]["vs eager"]["257"]["out"][0]
    assert out["equal"] is True and out["differ"] == 0 and out["numel"] == 257 * 5376
    sha = {impl: report["results"][impl]["sha256"]["257"]["out"] for impl in ("numba", "eager")}
    assert sha["numba"] == sha["eager"]
    # The image carries gcc, g++ and Python.h, so torch.compile builds and runs in it.
    compiled = report["results"]["compiled"]
    assert compiled["status"] == "ok", compiled["reason"]
    assert compiled["vs eager"]["257"]["grads"]["y"]["equal"] is True


def test_failed_builds_are_reported_and_the_matrix_goes_on(run) -> None:
    outcomes, reports = run
    assert {c: o.status for c, o in outcomes.items()} == {
        f"{STACK}-plain-cpu": "ok", "nobase-plain-cpu": "build_error",
        "badpin-plain-cpu": "build_error"}
    nobase = read_report(reports / "nobase-plain-cpu.json").data
    assert "gate-residual/absent:never-made is not on this Docker engine and is never pulled" \
        in nobase["reason"]
    badpin = read_report(reports / "badpin-plain-cpu.json").data
    assert badpin["status"] == "build_error" and badpin["image"]["id"] is None
    assert "torch==0.0.1" in badpin["log_tail"], badpin["log_tail"]
    assert badpin["image"]["pins"]["torch"] == "==0.0.1"


def test_a_current_report_is_not_run_again(run, engine, small_matrix: Path) -> None:
    _, reports = run
    again = run_matrix(small_matrix, reports_dir=reports, backend="docker", render=False,
                       stacks=[STACK])
    assert [(o.status, o.reused) for o in again] == [("ok", True)]


def test_timeout_kills_and_removes_the_container(run, small_matrix: Path, tmp_path: Path) -> None:
    import docker

    outcomes = run_matrix(small_matrix, reports_dir=tmp_path, backend="docker", render=False,
                          stacks=[STACK], timeout_s=1.0)
    assert [o.status for o in outcomes] == ["timeout"]
    report = read_report(tmp_path / f"{STACK}-plain-cpu.json").data
    assert "the container was killed" in report["reason"]
    left = docker.from_env().containers.list(
        all=True, filters={"label": f"org.gate-residual-matrix.run-id={report['run_id']}"})
    assert left == []
    assert not list(tmp_path.glob(".docker-*"))  # the staging directory is gone too


def test_auto_skips_a_stack_whose_base_image_is_missing(run, small_matrix: Path,
                                                       tmp_path: Path) -> None:
    """On an engine without the base image, `nox -s matrix` (auto) must not fail: skipped."""
    outcomes = run_matrix(small_matrix, reports_dir=tmp_path, backend="auto", render=False,
                          stacks=["nobase", STACK], timeout_s=900)
    assert {o.cell: o.status for o in outcomes} == {"nobase-plain-cpu": "skipped",
                                                    f"{STACK}-plain-cpu": "ok"}
    nobase = read_report(tmp_path / "nobase-plain-cpu.json").data
    assert nobase["status"] == "skipped" and "make one with `nox -s base_image`" in \
        nobase["reason"]


def _containers(run_id_label: str) -> list:
    import docker

    return docker.from_env().containers.list(all=True, filters={"label": run_id_label})


def test_sigterm_stops_and_removes_the_cell_container(run, small_matrix: Path,
                                                      tmp_path: Path) -> None:
    """SIGTERM used to kill the runner alone: the container ran on and `.docker-<run>/`
    stayed. Now: container removed, staging gone, exit 143, the reports kept."""
    data = yaml.safe_load(small_matrix.read_text())
    data["stacks"] = {STACK: data["stacks"][STACK]}
    data["implementations"] = [*data["implementations"], "fault"]
    data["modes"] = {"hang": {"env": {"GATE_RESIDUAL_FAULTS": "1",
                                      "GATE_RESIDUAL_FAULT": "hang"}}}
    matrix = tmp_path / "hang.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    reports = tmp_path / "reports"
    reports.mkdir()
    kept = reports / "host-plain-cuda.json"
    kept.write_bytes((ROOT / "tests" / "data" / "reports" / "host-plain-cuda.json").read_bytes())
    label = f"org.gate-residual-matrix.cell={STACK}-hang-cpu"
    assert _containers(label) == []
    runner = subprocess.Popen(
        [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(matrix),
         "--reports",
         str(reports), "--backend", "docker", "--build", "--timeout", "600"],
        cwd=ROOT, env={**os.environ, "GATE_RESIDUAL_FAULTS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900  # the image may be built first
    while time.monotonic() < deadline and runner.poll() is None:
        running = [c for c in _containers(label) if c.status == "running"]
        if running and "sleeping forever" in running[0].logs().decode():
            break
        time.sleep(0.5)
    else:
        runner.kill()
        pytest.fail(f"the hang cell never started: {runner.communicate()}")
    assert list(reports.glob(".run-*")), "the staging directory is there while the cell runs"
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=120)
    assert runner.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM: ")
    assert _containers(label) == []
    assert sorted(p.name for p in reports.iterdir()) == ["host-plain-cuda.json"]
    assert kept.read_bytes() == (ROOT / "tests" / "data" / "reports" /
                                 "host-plain-cuda.json").read_bytes()
