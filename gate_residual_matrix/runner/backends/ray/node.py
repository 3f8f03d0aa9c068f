"""What runs on a Ray node: one cell, through this node's own backend.

The driver (:mod:`runner.backends.ray.cluster`) sends :func:`run_on_node` a payload (the cell, its
case
ids, the matrix file's text, the run id, the timeout, the project commit it stamps) and a
progress queue. On the node the cell runs exactly as on one machine: the host backend's
fresh ``python -m gate_residual_matrix cell`` process, or the docker backend's container, with
the same timeout, isolation and parent-death guard, into a staging directory of its own; the report
goes back to the driver as JSON bytes, which the driver validates and writes (the node
writes nothing the driver keeps). The cell's progress lines go to the queue, with the id of
the node, so that the driver shows them per node.

A node must run the driver's code: unless it runs from the driver's own checkout (the same
host and directory: a local cluster, where the files are the very same), the task compares
the node's git HEAD with the commit the driver stamps on every report and, when they differ,
returns an ``error`` report saying so instead of running the cell. A docker stack whose
image this node lacks is ``skipped`` with the reason (``--build``: built here first, once per
node, keyed by its content-hash tag, docs/cluster.md). The cell sees the node's environment,
as set for ``ray start``.

``python -m gate_residual_matrix.cluster_node`` prints the ``ray start`` line for this host: its GPU
models (torch) and whether a Docker engine answers (:func:`advertised`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from gate_residual_matrix import settings
from gate_residual_matrix.runner.cell.progress import MODE_ENV

__all__ = ["GPU_PREFIX", "advertised", "ray_start_line", "run_on_node"]

GPU_PREFIX = "gpu:"
"""A GPU model's custom resource is this prefix and torch's device name: ``gpu:NVIDIA H200``."""
DOCKER = "docker"
"""The custom resource a node with a Docker engine offers."""
TEMP_PREFIX = "gate-residual-cluster-"
"""A task's temporary directory: ``<TMPDIR>/gate-residual-cluster-<worker pid>-<random>``
(the matrix copy and the cell's stage)."""


def _post(queue, event: dict) -> None:
    """Post ``event`` to the driver's progress actor without waiting (a task blocked in
    ``ray.get`` would lend its CPU to another cell); progress never fails a cell."""
    if queue is None:
        return
    try:
        queue.post.remote(event)
    except Exception:  # the queue's actor gone, full, ...: the cell goes on
        pass


class _Forward(io.TextIOBase):
    """A stdout that sends each whole line to the progress queue (with this node's id)."""

    def __init__(self, queue, node: str, key: int) -> None:
        self.queue, self.node, self.key, self._pending = queue, node, key, ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                _post(self.queue, {"kind": "line", "key": self.key, "node": self.node,
                                   "text": line})
        return len(text)


@contextlib.contextmanager
def _cancellable():
    """Python's own SIGINT handler for the duration (main thread only).

    Ray cancels a running task (``ray.cancel``, the driver's Ctrl-C) by simulating SIGINT
    in the worker's main thread, which raises ``KeyboardInterrupt`` only where SIGINT has a
    Python handler: a node started with SIGINT ignored (``nohup``, a shell's ``&``) passes
    that on to its workers, and the cell would run on until the driver's forced cancel.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _matrix_here(payload: dict, tmp: Path) -> tuple[Path, Path]:
    """The matrix file to run on this node, and the directory its relative paths start from.

    The node's checkout's own file when it has the same path (relative to the project) and
    the same sha256 as the driver's; else the driver's text, written under ``tmp`` (its
    relative paths then start from this node's checkout)."""
    from gate_residual_matrix.runner.cell.environment import PROJECT_ROOT

    rel = payload.get("matrix_rel")
    if rel:
        mine = PROJECT_ROOT / rel
        try:
            if hashlib.sha256(mine.read_bytes()).hexdigest() == payload["matrix_sha256"]:
                return mine, mine.parent
        except OSError:
            pass
    copy = tmp / "matrix.yaml"
    copy.write_text(payload["matrix_text"], encoding="utf-8")
    return copy, PROJECT_ROOT


def run_on_node(payload: dict, queue=None) -> tuple[str, bytes]:
    """Run one cell on this Ray node; return this node's id and the cell's report as UTF-8
    JSON bytes.

    ``payload``: ``cell`` (stack, mode, target), ``cases`` (case ids), ``matrix_text``,
    ``matrix_rel`` and ``matrix_sha256`` (the driver's matrix file), ``run_id``,
    ``timeout_s``, ``backend`` (``host`` or ``docker``), ``build``, ``commit`` (the
    driver's git HEAD) and ``checkout`` (the driver's :func:`checkout`), ``key`` and
    ``attempt`` (the driver's bookkeeping, echoed in the events). ``queue``: the
    :class:`runner.backends.ray.progress.Events` actor for ``start`` and ``line`` events, or
    None. Every outcome of the cell is a report (``ok`` ... ``error``, ``skipped``); only a
    defect of this function, the node's death or a cancellation (Ctrl-C on the driver,
    which stops the cell's process group or container first) ends the task otherwise.
    """
    import ray

    from gate_residual_matrix.runner.backends.base import Backend
    from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
    from gate_residual_matrix.runner.backends.host import HostBackend
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.cell.environment import project_state
    from gate_residual_matrix.runner.cell.run import skeleton
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.plan.cells import Cell, select_cases

    node = ray.get_runtime_context().get_node_id()
    key = payload["key"]
    _post(queue, {"kind": "start", "key": key, "attempt": payload["attempt"], "node": node})
    _remove_orphans()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        matrix_path, matrix_dir = _matrix_here(payload, tmp)
        matrix = load_matrix(matrix_path, known_implementations=implementations.known)
        cell = Cell(*payload["cell"])
        cases = select_cases(matrix, payload["cases"])
        frame = dict(matrix=matrix, cell=cell, cases=cases, backend=payload["backend"],
                     run_id=payload["run_id"])
        commit = project_state().get("commit")
        if payload.get("checkout") != checkout() and commit != payload["commit"]:
            return node, _dumps(skeleton(**frame, status="error", reason=(
                f"node {node[:8]} runs project commit {_short(commit)}, the driver "
                f"{_short(payload['commit'])}: check out the driver's commit on every node "
                "(docs/cluster.md)")))
        backend: Backend
        if payload["backend"] == "docker":
            gpus = ",".join(str(i) for i in ray.get_gpu_ids()) or "all"
            docker = DockerBackend(gpus=gpus, matrix_dir=matrix_dir, build=payload["build"])
            unready = docker.unready(matrix, cell.stack)
            if unready is not None:
                return node, _dumps(skeleton(**frame, status="skipped",
                                       reason=f"on node {node[:8]}: {unready.reason}"))
            backend = docker
        else:
            backend = HostBackend()
        stage = tmp / "stage"
        stage.mkdir()
        previous = settings.raw(MODE_ENV)
        if previous != "off":
            os.environ[MODE_ENV] = "plain"  # one line per case, which the driver shows
        try:
            with contextlib.redirect_stdout(_Forward(queue, node, key)), _cancellable():
                report = backend.run(matrix, cell, cases, matrix_path=matrix_path,
                                     reports_dir=stage, run_id=payload["run_id"],
                                     timeout_s=payload["timeout_s"])
        finally:
            if previous is None:
                os.environ.pop(MODE_ENV, None)
            else:
                os.environ[MODE_ENV] = previous
        return node, _dumps(report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkout() -> dict[str, str]:
    """This process's project checkout: ``{"host": hostname, "root": project directory}``."""
    from gate_residual_matrix.runner.cell.environment import PROJECT_ROOT

    return {"host": socket.gethostname(), "root": str(PROJECT_ROOT)}


def _remove_orphans() -> None:
    """Remove the temporary directories of tasks whose worker is gone (killed with its node
    or by a forced cancel, it could not remove its own)."""
    for path in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = path.name[len(TEMP_PREFIX):].split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (PermissionError, OverflowError):
            continue


def _dumps(report: dict) -> bytes:
    return json.dumps(report, allow_nan=False).encode("utf-8")


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "(none: not a git checkout)"


def advertised() -> dict[str, float]:
    """The custom resources this host should offer: ``{"gpu:<model>": count, ...}`` for
    each GPU model torch sees (``torch.cuda.get_device_name``, the name reports record as
    ``environment.gpu``) and ``{"docker": 1}`` when a Docker engine answers.

    Example (an 8 x H200 host with Docker)::

        >>> advertised()  # doctest: +SKIP
        {'gpu:NVIDIA H200': 8, 'docker': 1}
    """
    import torch

    offered: dict[str, float] = {}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            name = GPU_PREFIX + torch.cuda.get_device_name(i)
            offered[name] = offered.get(name, 0) + 1
    try:
        from gate_residual_matrix.runner.backends.docker.cells import DockerBackend

        if DockerBackend().available() is None:
            offered[DOCKER] = 1
    except Exception:  # docker-py missing or the engine unreadable: no docker resource
        pass
    return offered


def ray_start_line(offered: dict[str, float], head: str = "HEAD:6379") -> str:
    """The ``ray start`` command that joins ``head`` offering ``offered``.

    Example::

        >>> ray_start_line({"gpu:NVIDIA H200": 8, "docker": 1}, "10.0.0.1:6379")
        'ray start --address=10.0.0.1:6379 --resources=\\'{"gpu:NVIDIA H200": 8, "docker": 1}\\''
    """
    return f"ray start --address={head} --resources='{json.dumps(offered)}'"


if __name__ == "__main__":  # pragma: no cover - a helper for humans
    head = sys.argv[1] if len(sys.argv) > 1 else "HEAD:6379"
    print(ray_start_line(advertised(), head))
