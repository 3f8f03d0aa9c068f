"""The matrix on a real local Ray cluster: a head and worker nodes, each its own
``ray start`` process (tests/ray_cluster.py), whose custom resources pose as GPU models.

The cells are small CPU cells (D = 8, N = 1 and 2), routed by those resources; their reports
are compared with a local run's, bit for bit. A node is killed in the middle of a cell (its
cell hangs there: the ``fault`` implementation, armed by that node's environment), and the
cell runs again on another node or ends ``error`` naming the dead one. Every process a node
started is in that node's process group, which the fixture ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gate_residual_matrix.runner import pipeline as run_mod
from gate_residual_matrix.runner.__main__ import main
from gate_residual_matrix.runner.backends.ray import cluster as cluster_mod
from gate_residual_matrix.runner.backends.ray.connect import parse_address
from gate_residual_matrix.runner.config.matrix import load_matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.cells import Cell
from tests.ray_cluster import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
GPU_A, GPU_B = "Test GPU A", "Test GPU B"
HANG = {"GATE_RESIDUAL_FAULTS": "1", "GATE_RESIDUAL_FAULT_HANG_ROWS": "2"}
"""A node with these in its environment runs ``fault``'s N = 2 call forever: a cell that
stops in its middle (after its first case) until its node dies or it is cancelled."""
SMALL = {
    "schema_version": 1, "op": "gate_residual",
    "problem": {"D": 8, "G": 2, "dtype": "bfloat16", "index_dtype": "int64", "seed": 17},
    "cases": [{"n": 1}, {"n": 2}, {"n": 2, "specials": True}],
    "implementations": ["eager", "numba", "fp64"], "baseline": "eager",
    "accuracy_reference": "fp64",
    "modes": {"plain": {}, "deterministic": {"torch": {"deterministic": True}}},
    "stacks": {"host": {"kind": "host"}}, "targets": ["cpu"],
}
FAULTY = {**SMALL, "cases": [{"n": 1}, {"n": 2}], "implementations": ["eager", "fault"],
          "modes": {"plain": {}}}
del FAULTY["accuracy_reference"]


def write_matrix(tmp_path: Path, data: dict, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cluster():
    """Head (no CPU) + node a (gpu:Test GPU A, armed to hang) + node b (gpu:Test GPU B)."""
    with LocalCluster() as local:
        local.add_worker("a", {f"gpu:{GPU_A}": 1}, env=HANG)  # one at a time: two `ray start`
        local.add_worker("b", {f"gpu:{GPU_B}": 1})            # at once can lose one of them
        yield local


@pytest.fixture
def steady_project(monkeypatch):
    """The project's state as the test began, held still: others may edit or commit in a
    shared tree between two runs of a test, which would change the fingerprints."""
    state = run_mod.project_state()
    monkeypatch.setattr(run_mod, "project_state", lambda: dict(state))
    monkeypatch.setattr(run_mod, "uncommitted_digest", lambda: "0" * 64)


def reports(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))
            if not p.name.startswith("summary")}


def started_on(out: str) -> list[str]:
    return re.findall(r"\[cluster\] node [0-9a-f]{8} \(([^)]*)\): \S+ started", out)


def test_cells_routed_by_gpu_model_have_the_bits_of_a_local_run(cluster, tmp_path, capsys,
                                                                steady_project):
    matrix = write_matrix(tmp_path, SMALL)
    local = run_mod.run_matrix(matrix, reports_dir=tmp_path / "local", backend="host",
                               render=False)
    on_a = run_mod.run_matrix(matrix, reports_dir=tmp_path / "a", render=False,
                              cluster=cluster.client_address, gpu_model=GPU_A)
    out_a = capsys.readouterr().out
    on_b = run_mod.run_matrix(matrix, reports_dir=tmp_path / "b", render=False,  # GCS address
                              cluster=cluster.address, gpu_model=GPU_B, modes=["plain"])
    out_b = capsys.readouterr().out
    assert [(o.cell, o.status) for o in local] == [(o.cell, o.status) for o in on_a] == [
        ("host-plain-cpu", "ok"), ("host-deterministic-cpu", "ok")], [o.reason for o in on_a]
    assert [(o.cell, o.status) for o in on_b] == [("host-plain-cpu", "ok")], on_b
    assert started_on(out_a) == [f"gpu:{GPU_A}"] * 2, out_a
    assert started_on(out_b) == [f"gpu:{GPU_B}"], out_b
    want = reports(tmp_path / "local")
    for folder in ("a", "b"):
        for cell, got in reports(tmp_path / folder).items():
            assert got["inputs"] == want[cell]["inputs"]
            for impl, result in want[cell]["results"].items():
                assert result["sha256"], (cell, impl)
                assert got["results"][impl]["sha256"] == result["sha256"], (folder, cell, impl)
            assert got["fingerprint"] == want[cell]["fingerprint"]
    again = run_mod.run_matrix(matrix, reports_dir=tmp_path / "a", backend="host", render=False)
    assert [(o.cell, o.status, o.reused) for o in again] == [
        ("host-plain-cpu", "ok", True), ("host-deterministic-cpu", "ok", True)]


def test_a_cell_no_node_can_run_is_skipped_naming_the_resource(cluster, tmp_path, capsys):
    matrix = write_matrix(tmp_path, {**SMALL, "targets": ["cpu", "cuda"],
                                     "modes": {"plain": {}}})
    outcomes = run_mod.run_matrix(matrix, reports_dir=tmp_path / "r", render=False,
                                  cluster=cluster.address, gpu_model="Test GPU Z")
    why = {o.cell: (o.status, o.reason) for o in outcomes}
    assert why["host-plain-cpu"][0] == why["host-plain-cuda"][0] == "skipped"
    assert "no node of the cluster offers gpu:Test GPU Z;" in why["host-plain-cpu"][1]
    assert "no node of the cluster offers GPU;" in why["host-plain-cuda"][1]
    assert f"gpu:{GPU_A}" in why["host-plain-cpu"][1]  # what the nodes do offer
    written = reports(tmp_path / "r")
    assert written["host-plain-cpu"]["status"] == "skipped"
    assert "gpu:Test GPU Z" in written["host-plain-cpu"]["reason"]
    assert "started" not in capsys.readouterr().out


def _interactive_sigint() -> None:
    """In the child before exec: SIGINT as an interactive shell leaves it. A test run started
    in the background (``cmd &``) inherits SIGINT ignored, and the command keeps it ignored
    (as it should under nohup), so a Ctrl-C test would send a signal nobody hears."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Driver:
    """``python -m gate_residual_matrix matrix --cluster ...`` in a subprocess, its output
    read as it comes."""

    def __init__(self, cluster, matrix: Path, reports_dir: Path, *args: str) -> None:
        env = {**os.environ, "GATE_RESIDUAL_FAULTS": "1", "GATE_RESIDUAL_PROGRESS": "plain"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gate_residual_matrix.runner", "matrix", "--matrix", str(matrix),
             "--reports",
             str(reports_dir), "--cluster", cluster.client_address, "--timeout", "300", *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_interactive_sigint)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.out)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.proc.kill()
        raise AssertionError(f"no {pattern!r} in the driver's output:\n{self.out}")

    def finish(self, timeout_s: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            self.proc.kill()
            raise AssertionError(f"the driver did not end in {timeout_s} s:\n{self.out}") from err


def cell_processes() -> list[str]:
    """Cell processes that run a matrix a node copied (the tests' matrices are outside the
    project): ``python -m gate_residual_matrix cell --matrix /tmp/gate-residual-cluster-...``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "runner cell" in cmd and "gate-residual-cluster-" in cmd:
            found.append(f"{proc.name}: {cmd}")
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_cancels_the_cluster_tasks(cluster, tmp_path, sig):
    matrix = write_matrix(tmp_path, FAULTY)
    driver = Driver(cluster, matrix, tmp_path / "r", "--gpu-model", GPU_A)
    driver.wait_for(r"host-plain-cpu: case 1/2")  # then it hangs in case 2 (node a's HANG)
    assert cell_processes()
    driver.proc.send_signal(sig)
    stopped = time.monotonic()
    assert driver.finish(60) == 128 + sig, driver.out  # 130, 143: ray.init's handler undone
    assert f"interrupted by {sig.name}" in driver.out
    assert "SIGTERM handler is not set" not in driver.out  # Ray Client's note, kept quiet
    deadline = time.monotonic() + 30
    while cell_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cell_processes()
    # cancelled, not killed after CANCEL_WAIT_S: the task's own clean-up stopped the cell
    assert time.monotonic() - stopped < cluster_mod.CANCEL_WAIT_S + 15


def test_a_node_that_dies_mid_cell_is_replaced_by_another(cluster, tmp_path):
    gpu = "Test GPU K"
    cluster.add_worker("k1", {f"gpu:{gpu}": 1}, env=HANG)
    matrix = write_matrix(tmp_path, FAULTY)
    driver = Driver(cluster, matrix, tmp_path / "r", "--gpu-model", gpu)
    first = driver.wait_for(r"node ([0-9a-f]{8}) \(gpu:Test GPU K\): host-plain-cpu: case 1/2")
    cluster.add_worker("k2", {f"gpu:{gpu}": 1},  # knows `fault` but is not armed: the cell ends
                       env={"GATE_RESIDUAL_FAULTS": "1"})
    cluster.kill("k1")
    assert driver.finish() == 0, driver.out
    assert f"the task died on node {first[1]} (gpu:{gpu})" in driver.out
    assert "running it again (attempt 2 of 3)" in driver.out
    second = re.findall(r"node ([0-9a-f]{8}) \(gpu:Test GPU K\): host-plain-cpu ok", driver.out)
    assert second and second[0] != first[1], driver.out
    report = reports(tmp_path / "r")["host-plain-cpu"]
    assert report["status"] == "ok" and report["cases"] == [1, 2]
    cluster.kill("k2")


def test_a_cell_whose_only_node_dies_is_an_error_naming_it(cluster, tmp_path):
    gpu = "Test GPU L"
    cluster.add_worker("l", {f"gpu:{gpu}": 1}, env=HANG)
    matrix = write_matrix(tmp_path, FAULTY)
    driver = Driver(cluster, matrix, tmp_path / "r", "--gpu-model", gpu)
    node = driver.wait_for(r"node ([0-9a-f]{8}) \(gpu:Test GPU L\): host-plain-cpu: case 1/2")[1]
    cluster.kill("l")
    assert driver.finish() == 5, driver.out
    report = reports(tmp_path / "r")["host-plain-cpu"]
    assert report["status"] == "error"
    assert f"node {node} (gpu:{gpu}): " in report["reason"]
    assert "Died" in report["reason"] or "Crashed" in report["reason"], report["reason"]
    assert f"no node of the cluster offers gpu:{gpu}" in report["reason"]


# --- without a cluster ------------------------------------------------------------------


def test_without_ray_the_cluster_option_is_exit_2_with_the_install_command(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    matrix = write_matrix(tmp_path, SMALL)
    code = main(["matrix", "--matrix", str(matrix), "--reports", str(tmp_path / "r"),
                 "--cluster", "ray://127.0.0.1:10001"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "pip install -e '.[ray]'" in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--cluster", "http://x:1"], "expected ray://HOST:PORT, HOST:PORT or auto"),
    (["--cluster", "ray://x"], "expected ray://HOST:PORT, HOST:PORT or auto"),
    (["--cluster", "auto"], "RAY_ADDRESS is not set"),
    (["--gpu-model", "NVIDIA H200"], "--gpu-model: places cells on a cluster's nodes"),
    (["--cluster", "ray://x:1", "--abba", "plain"], "--abba: runs its processes"),
    (["--cluster", "ray://x:1", "--retries", "-1"], "--retries: expected a number >= 0"),
])
def test_bad_cluster_options_are_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    matrix = write_matrix(tmp_path, SMALL)
    code = main(["matrix", "--matrix", str(matrix), "--reports", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_needs_per_cell():
    m = load_matrix(ROOT / "matrix.yaml")
    docker = next(s for s, spec in m.stacks.items() if spec.kind == "docker")
    assert cluster_mod.needs(m, Cell("host", "plain", "cuda"), "NVIDIA H200") == {
        "CPU": 1.0, "GPU": 1.0, "gpu:NVIDIA H200": 1.0}
    assert cluster_mod.needs(m, Cell("host", "plain", "cpu"), "NVIDIA H200") == {
        "CPU": 1.0, "gpu:NVIDIA H200": cluster_mod.TOKEN}
    assert cluster_mod.needs(m, Cell(docker, "plain", "cpu")) == {
        "CPU": 1.0, "docker": cluster_mod.TOKEN}
    assert parse_address("auto", {"RAY_ADDRESS": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    with pytest.raises(ConfigError, match="from RAY_ADDRESS"):
        parse_address("auto", {"RAY_ADDRESS": "nonsense"})


def test_a_node_of_another_commit_does_not_run_the_cell(tmp_path, monkeypatch):
    """A node elsewhere (another checkout) at another commit: an error report, no cell."""
    from gate_residual_matrix.runner.backends.ray import node as cluster_node
    from gate_residual_matrix.runner.cell import environment

    node = SimpleNamespace(get_node_id=lambda: "c" * 56)
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get_runtime_context=lambda: node))
    monkeypatch.setattr(environment, "project_state", lambda: {"commit": "1" * 40,
                                                                 "dirty": False})
    class Ran(Exception):
        pass

    def run(*args, **kwargs):
        raise Ran

    monkeypatch.setattr("gate_residual_matrix.runner.backends.host.HostBackend.run", run)
    text = yaml.safe_dump(SMALL)
    payload = {"cell": ("host", "plain", "cpu"), "cases": ["1"], "matrix_text": text,
               "matrix_rel": None, "matrix_sha256": "", "run_id": "r" * 32, "timeout_s": 60,
               "backend": "host", "build": False, "commit": "2" * 40, "key": 0, "attempt": 0,
               "checkout": {"host": "elsewhere", "root": "/srv/gate-residual"}}
    got, data = cluster_node.run_on_node(payload)
    report = cluster_mod.decode(data)
    assert got == "c" * 56 and report["status"] == "error"
    assert report["reason"].startswith(f"node cccccccc runs project commit {'1' * 12}, the "
                                       f"driver {'2' * 12}: check out the driver's commit")
    with pytest.raises(Ran):  # the driver's own checkout: nothing to compare, on to the cell
        cluster_node.run_on_node({**payload, "checkout": cluster_node.checkout()})


class FakeRay:
    """Enough of ``ray`` for :class:`runner.backends.ray.cluster.Cluster`'s bookkeeping: two
    nodes, and a
    ``get`` that raises what a worker's death raises."""

    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        pass

    class OutOfMemoryError(RayError):
        pass

    class NodeDiedError(RayError):
        pass

    exceptions = SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError,
                                 OutOfMemoryError=OutOfMemoryError)

    def __init__(self, error: Exception) -> None:
        self.error, self.alive = error, {"a" * 56, "b" * 56}

    def nodes(self):
        return [{"NodeID": n, "Alive": n in self.alive,
                 "Resources": {"CPU": 1.0, "gpu:X": 1.0}} for n in ("a" * 56, "b" * 56)]

    def get(self, ref):
        raise self.error


@pytest.mark.parametrize(("error", "status"), [(FakeRay.NodeDiedError("gone. Node IP: 1"),
                                                "error"),
                                               (FakeRay.OutOfMemoryError("killed"), "oom")])
def test_a_dying_task_runs_again_a_bounded_number_of_times(error, status):
    ray = FakeRay(error)
    cluster = cluster_mod.Cluster(ray, "x:1", gpu_model="X", retries=2, build=False,
                                  matrix_dir=ROOT)
    m = load_matrix(ROOT / "matrix.yaml")
    cell = Cell("host", "plain", "cpu")
    job = cluster_mod.Job(0, cell, m.cases[:1], "r" * 32, "host", cluster_mod.needs(m, cell, "X"))
    said = []
    progress = SimpleNamespace(node_of=lambda key, attempt: "ab"[attempt % 2] * 56,
                               say=said.append)
    results = [cluster._collect(None, job, attempt, progress, m) for attempt in range(3)]
    assert [r is None for r in results] == [True, True, False]  # None: run it again
    report = results[-1]
    assert report["status"] == status
    assert report["reason"].startswith("the cluster task died 3 time(s): node aaaaaaaa "
                                       "(gpu:X): ")
    assert "node bbbbbbbb (gpu:X)" in report["reason"] and "3 attempt(s), the limit" in \
        report["reason"]
    assert len(said) == 2 and "attempt 3 of 3" in said[1]
    ray.alive = {"b" * 56}  # the node that offers it is gone: no retry left to try
    job.died.clear()
    cluster.refresh()
    ray.nodes = lambda: [{"NodeID": "b" * 56, "Alive": True, "Resources": {"CPU": 1.0}}]
    cluster.refresh()
    report = cluster._collect(None, job, 0, progress, m)
    assert report is not None and "no node of the cluster offers gpu:X" in report["reason"]


def test_a_retry_queued_for_a_node_that_is_gone_ends_as_an_error(monkeypatch):
    """The race CI hit under load: the task died, but the cluster still listed its node
    alive, so the cell was queued again, for a node that never comes back. The wait loop's
    recheck ends it (``error``, naming the death and the missing resource) instead of
    waiting for ever."""
    ray = FakeRay(FakeRay.NodeDiedError("gone"))
    cluster = cluster_mod.Cluster(ray, "x:1", gpu_model="X", retries=2, build=False,
                                  matrix_dir=ROOT)
    m = load_matrix(ROOT / "matrix.yaml")
    cell = Cell("host", "plain", "cpu")
    job = cluster_mod.Job(0, cell, m.cases[:1], "r" * 32, "host", cluster_mod.needs(m, cell, "X"))
    job.died.append("node aaaaaaaa (gpu:X): NodeDiedError: gone")
    cancelled, reports, ended = [], [], []
    monkeypatch.setattr(cluster, "_cancel", cancelled.extend)
    started = {(0, 2)}  # job 0's attempt 2 said where it runs; attempt 1 never started
    progress = SimpleNamespace(finished=lambda j, attempt, r: ended.append(attempt),
                               node_of=lambda key, attempt: "b" * 56 if (key, attempt) in
                               started else None)
    pending = {"queued": (job, 1)}
    cluster._drop_unrunnable(pending, progress, m, lambda j, r: reports.append(r))
    assert pending and not reports  # both nodes listed alive: it may still run

    def no_answer():
        raise ConnectionError("GCS restarting")

    ray.nodes = no_answer
    cluster._drop_unrunnable(pending, progress, m, lambda j, r: reports.append(r))
    assert pending and not reports  # no node list this time: asked again at the next check
    ray.nodes = lambda: [{"NodeID": "b" * 56, "Alive": True, "Resources": {"CPU": 1.0}}]
    running = {"running": (job, 2)}
    cluster._drop_unrunnable(running, progress, m, lambda j, r: reports.append(r))
    assert running and not reports  # it started: _collect will say how it ended
    cluster._drop_unrunnable(pending, progress, m, lambda j, r: reports.append(r))
    assert not pending and cancelled == ["queued"] and ended == [1]
    (report,) = reports
    assert report["status"] == "error"
    assert report["reason"].startswith("the cluster task died 1 time(s): node aaaaaaaa (gpu:X)")
    assert "no node of the cluster offers gpu:X" in report["reason"]
