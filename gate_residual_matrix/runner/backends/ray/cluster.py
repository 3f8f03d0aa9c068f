"""The matrix on a Ray cluster: ``python -m gate_residual_matrix matrix --cluster
ADDRESS``.

The runner (:func:`runner.pipeline.run_matrix`) decides, as on one machine, which cells run
(reuse, resume, ``--case`` merges) and submits them to the cluster's site
(:class:`runner.backends.ray.site.RaySite`); this module runs them, each as a Ray task on a node
that offers what the cell needs (:func:`needs`), all at once, and hands each report back
to the runner as it arrives, which validates it and writes it with its atomic writer.

* **Resources.** A ``cuda`` cell takes ``GPU: 1``; with ``--gpu-model NAME`` every cell
  also takes the custom resource ``gpu:NAME`` (a ``cuda`` cell one unit, a ``cpu`` cell a
  token 0.001, so that it runs on a host of that model without holding its GPU); a cell of
  a ``kind: docker`` stack takes ``docker`` (0.001). Every cell takes one ``CPU``. Nodes
  advertise ``gpu:<model>`` and ``docker`` with ``ray start --resources``
  (``python -m gate_residual_matrix.cluster_node`` prints the line for its host).
* **Skipped.** A cell that no live node can run is ``skipped``, naming the resource nobody
  offers (:meth:`Cluster.unoffered`).
* **Node death.** A task that ends because its worker or node died (not because the cell
  failed: that is a report) is submitted again, up to ``retries`` more times, while some
  live node still offers what it needs; then the cell is ``error`` (``oom`` when Ray's
  memory monitor killed it), the reason naming each node it died on and why.
* **Ctrl-C** (SIGINT, SIGTERM) cancels every task still queued or running: a running task
  gets ``KeyboardInterrupt``, which stops its cell's process group or container, as on
  one machine; after :data:`CANCEL_WAIT_S` the tasks left are killed.
* **Progress** comes per node: ``[cluster] node 1b2c3d4e (gpu:NVIDIA H200): ...``, each
  cell's start, its case lines, its end, then each node's cells and busy time.

Connecting (the address, Ray as the optional extra ``.[ray]``, the signal handlers kept):
:mod:`runner.backends.ray.connect`. docs/cluster.md has the commands for a cluster.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gate_residual_matrix.runner.backends import interrupts
from gate_residual_matrix.runner.backends.failure import Ending, classify
from gate_residual_matrix.runner.backends.ray.node import DOCKER, GPU_PREFIX, checkout, run_on_node
from gate_residual_matrix.runner.cell.run import skeleton
from gate_residual_matrix.runner.config.matrix import Case, DockerStack, Matrix
from gate_residual_matrix.runner.errors import ConfigError, ImageError, Interrupted, ReportError
from gate_residual_matrix.runner.plan.cells import Cell
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.status import Status

if TYPE_CHECKING:
    from gate_residual_matrix.runner.backends.docker.cells import DockerBackend

__all__ = ["CANCEL_WAIT_S", "Cluster", "Job", "backend_choice", "decode", "needs"]

TOKEN = 0.001
"""The share of a presence resource (``docker``, a ``cpu`` cell's ``gpu:<model>``) a cell takes."""
RECHECK_S = 2.0
"""Seconds between checks that every pending cell still has a live node that can run it."""
CANCEL_WAIT_S = 10.0
"""After Ctrl-C: how long cancelled tasks get to stop their cells before they are killed."""
def backend_choice(backend: str, abba: str | None = None) -> str:
    """The backend a cluster run gives ``kind: docker`` stacks for ``--backend backend``:
    ``docker`` (a node's engine, the ``docker`` resource) for auto and docker, ``host``
    (their cells skipped, as on one machine) for host.

    Raises:
        ConfigError: an unknown backend, or ``--abba`` (its A-B-B-A order of processes
            is one machine's).

    Example::

        >>> backend_choice("auto")
        'docker'
    """
    from gate_residual_matrix.runner.backends.registry import CHOICES

    if backend not in CHOICES:
        raise ConfigError(f"--backend: unknown backend {backend!r}; choose from "
                          f"{', '.join(CHOICES)}")
    if abba is not None:
        raise ConfigError("--abba: runs its processes in A-B-B-A order on one machine; "
                          "leave out --cluster")
    return "host" if backend == "host" else "docker"


def needs(matrix: Matrix, cell: Cell, gpu_model: str | None = None) -> dict[str, float]:
    """The Ray resources one run of ``cell`` takes (see the module docstring).

    Example::

        >>> from gate_residual_matrix.runner.plan.cells import Cell
        >>> needs(m, Cell("host", "plain", "cuda"), "NVIDIA H200")  # doctest: +SKIP
        {'CPU': 1.0, 'GPU': 1.0, 'gpu:NVIDIA H200': 1.0}
    """
    wanted = {"CPU": 1.0}
    if cell.target == "cuda":
        wanted["GPU"] = 1.0
    if gpu_model:
        wanted[GPU_PREFIX + gpu_model] = 1.0 if cell.target == "cuda" else TOKEN
    if isinstance(matrix.stacks[cell.stack], DockerStack):
        wanted[DOCKER] = TOKEN
    return wanted


@dataclass
class Job:
    """One cell for the cluster. ``key``: the caller's index (echoed to ``on_report``);
    ``cases``: the Case objects to run; ``backend``: ``host`` or ``docker`` (the backend
    the node runs the cell in)."""

    key: int
    cell: Cell
    cases: Sequence[Case]
    run_id: str
    backend: str
    wanted: dict[str, float]
    died: list[str] = field(default_factory=list)


def _label(node: dict) -> str:
    """``node 1b2c3d4e (gpu:NVIDIA H200, docker)``: the short id and its custom resources."""
    custom = [k for k in node.get("Resources", {}) if k.startswith(GPU_PREFIX) or k == DOCKER]
    return f"node {node['NodeID'][:8]}" + (f" ({', '.join(sorted(custom))})" if custom else "")


class Cluster:
    """A connected Ray cluster: what its nodes offer, and :meth:`run` for cells.

    Made by :func:`runner.backends.ray.connect.connect`; ``close()`` disconnects (the cluster goes
    on).
    """

    name = "cluster"

    def __init__(self, ray, address: str, *, gpu_model: str | None, retries: int,
                 build: bool, matrix_dir: Path) -> None:
        self.ray, self.address, self.gpu_model = ray, address, gpu_model
        self.retries, self.build = retries, build
        self._images: DockerBackend | None = None
        self._matrix_dir = matrix_dir
        self.nodes: dict[str, dict] = {}
        self._seen: dict[str, dict] = {}
        self.refresh()

    def refresh(self) -> dict[str, dict]:
        """The live nodes, ``{node id: ray.nodes() entry}`` (also kept in ``nodes``)."""
        listed = self.ray.nodes()
        self.nodes = {n["NodeID"]: n for n in listed if n.get("Alive")}
        self._seen.update(self.nodes)  # a dead node keeps the entry it had alive
        for n in listed:
            self._seen.setdefault(n["NodeID"], n)
        return self.nodes

    def label(self, node_id: str | None) -> str:
        """How progress and reasons name a node: ``node 1b2c3d4e (gpu:NVIDIA H200)``, a
        dead one too."""
        if node_id is None:
            return "an unknown node (the task died before it said where it ran)"
        node = self._seen.get(node_id)
        return _label(node) if node else f"node {node_id[:8]}"

    def unoffered(self, wanted: dict[str, float]) -> str | None:
        """Why no live node can run a cell that takes ``wanted``, or None when one can.

        Names the resource no node offers at all (with what they do offer), or else says
        that no single node offers them together.
        """
        offers = [n.get("Resources", {}) for n in self.nodes.values()]
        for name, amount in wanted.items():
            if not any(o.get(name, 0) >= amount for o in offers):
                have = sorted({k for o in offers for k in o if k in ("CPU", "GPU", DOCKER)
                               or k.startswith(GPU_PREFIX)})
                return (f"no node of the cluster offers {name}; its {len(offers)} live "
                        f"node(s) offer {', '.join(have) or 'nothing'}")
        if not any(all(o.get(k, 0) >= v for k, v in wanted.items()) for o in offers):
            return (f"no single node of the cluster offers "
                    f"{', '.join(f'{k} ({v:g})' for k, v in wanted.items())} together")
        return None

    def memory_bytes(self) -> int | None:
        """The largest ``memory`` resource of a live node (bytes Ray lets tasks use), for
        :func:`runner.plan.case_sizes.check_case_sizes`; None when no node says."""
        sizes = [n.get("Resources", {}).get("memory") for n in self.nodes.values()]
        return int(max(s for s in sizes if s)) if any(sizes) else None

    def fingerprint_extra(self, matrix: Matrix, cell: Cell) -> dict[str, Any]:
        """What a cell's fingerprint adds on a cluster: a docker stack's image tag (its
        content hash: each node builds its own image, whose ids differ); {} for host."""
        if not isinstance(matrix.stacks[cell.stack], DockerStack):
            return {}
        if self._images is None:
            from gate_residual_matrix.runner.backends.docker.cells import DockerBackend

            self._images = DockerBackend(matrix_dir=self._matrix_dir)
        try:
            return {"image": self._images.spec(matrix, cell.stack).tag}
        except ImageError as err:  # the cells end build_error on their node
            return {"image_error": str(err)}

    def close(self) -> None:
        """Disconnect from the cluster (which goes on running)."""
        self.ray.shutdown()

    def run(self, jobs: Sequence[Job], *, matrix: Matrix, matrix_path: Path, timeout_s: float,
            commit: str | None, on_report: Callable[[Job, dict[str, Any]], None],
            origin: Path | None = None) -> None:
        """Run ``jobs`` on the cluster at once; call ``on_report(job, report)`` in the order
        the reports arrive (a report made here for a task that could not finish).
        ``matrix_path``: the run's validated snapshot of the matrix, whose bytes go to the
        nodes; ``origin``: the user's file (default ``matrix_path``), whose place in the
        project a node's own copy is looked for at.

        Raises whatever interrupts the wait (``KeyboardInterrupt``,
        :class:`runner.errors.Interrupted`) after cancelling the tasks left.
        """
        from gate_residual_matrix.runner.backends.ray.progress import Progress
        from gate_residual_matrix.runner.cell.environment import PROJECT_ROOT

        ray = self.ray
        data = Path(matrix_path).read_bytes()  # the node compares the bytes of its own copy
        try:
            rel = str(Path(origin or matrix_path).resolve().relative_to(PROJECT_ROOT))
        except ValueError:
            rel = None
        base = {"matrix_text": data.decode("utf-8"), "matrix_rel": rel, "build": self.build,
                "matrix_sha256": hashlib.sha256(data).hexdigest(), "timeout_s": timeout_s,
                "commit": commit, "checkout": checkout()}
        progress = Progress(self, {job.key: job.cell.id for job in jobs})
        remote = ray.remote(run_on_node)
        pending: dict = {}

        def submit(job: Job, attempt: int) -> None:
            wanted = dict(job.wanted)
            options = {"num_cpus": wanted.pop("CPU"), "num_gpus": wanted.pop("GPU", 0),
                       "resources": wanted, "max_retries": 0, "name": f"cell {job.cell.id}"}
            payload = {**base, "cell": (job.cell.stack, job.cell.mode, job.cell.target,
                                               job.cell.prefix),
                       "cases": [c.id for c in job.cases], "run_id": job.run_id,
                       "backend": job.backend, "key": job.key, "attempt": attempt}
            pending[remote.options(**options).remote(payload, progress.queue)] = (job, attempt)

        try:
            for job in jobs:
                submit(job, 0)
            recheck = time.monotonic() + RECHECK_S
            while pending:
                if (signum := interrupts.fired()) is not None:  # raised, and swallowed by Ray
                    raise Interrupted(signum)
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                progress.drain()
                if not ready and time.monotonic() >= recheck:
                    recheck = time.monotonic() + RECHECK_S
                    self._drop_unrunnable(pending, progress, matrix, on_report)
                for ref in ready:
                    job, attempt = pending.pop(ref)
                    report = self._collect(ref, job, attempt, progress, matrix)
                    if report is None:
                        submit(job, attempt + 1)
                    else:
                        progress.finished(job, attempt, report)
                        on_report(job, report)
            progress.drain()
            progress.summary()
        except BaseException:
            self._cancel(list(pending))
            raise

    def _collect(self, ref: Any, job: Job, attempt: int, progress: Any,
                 matrix: Matrix) -> dict[str, Any] | None:
        """The report of a finished task, or None when it is to run again."""
        ray, exc = self.ray, self.ray.exceptions
        node = progress.node_of(job.key, attempt)
        try:
            node, data = ray.get(ref)
        except exc.RayTaskError as err:  # our task code raised on the node: no retry
            return self._failed(matrix, job, Status.ERROR, f"on {self.label(node)}: the cluster "
                                f"task failed: {_first_line(err)}")
        except exc.RayError as err:  # the worker or its node died, or Ray killed it
            self.refresh()
            job.died.append(f"{self.label(node)}: {type(err).__name__}: {_first_line(err)}")
            gone = self.unoffered(job.wanted)
            if attempt < self.retries and gone is None:
                progress.say(f"{job.cell.id}: the task died on {self.label(node)} "
                             f"({type(err).__name__}); running it again "
                             f"(attempt {attempt + 2} of {self.retries + 1})")
                return None
            # Ray's memory monitor killed it: oom, by the classifier every backend uses
            status = classify(Ending(None, oom_killed=isinstance(err, exc.OutOfMemoryError)))
            tail = f"; {gone}" if gone else f"; {attempt + 1} attempt(s), the limit"
            return self._failed(matrix, job, status, "the cluster task died "
                                f"{len(job.died)} time(s): " + "; ".join(job.died) + tail)
        progress.ran_on(job.key, attempt, node)
        try:
            return decode(data)
        except ReportError as err:
            return self._failed(matrix, job, Status.ERROR, f"{self.label(node)} returned a report "
                                f"that is not valid: {err}")

    def _drop_unrunnable(self, pending: dict, progress: Any, matrix: Matrix,
                         on_report: Callable[[Job, dict[str, Any]], None]) -> None:
        """End the pending tasks that have not started and that no live node can run any
        more (``error``, naming what is missing and the deaths so far). Ray keeps such a task
        queued for ever: a cell whose last node of its GPU model died is run again only while
        the cluster still listed that node alive (its death is noticed after a heartbeat
        timeout). A task that started is left to :meth:`_collect`, which records how it
        ended; a cluster that does not answer the node list this time is asked again at the
        next check."""
        try:
            self.refresh()
        except Exception:  # the GCS busy or restarting: nothing learnt, nothing dropped
            return
        dropped = []
        for ref, (job, attempt) in list(pending.items()):
            gone = self.unoffered(job.wanted)
            if gone is None or progress.node_of(job.key, attempt) is not None:
                continue
            del pending[ref]
            dropped.append(ref)
            died = (f"the cluster task died {len(job.died)} time(s): " + "; ".join(job.died)
                    + "; ") if job.died else ""
            report = self._failed(matrix, job, Status.ERROR, f"{died}{gone}")
            progress.finished(job, attempt, report)
            on_report(job, report)
        if dropped:
            self._cancel(dropped)

    def _failed(self, matrix: Matrix, job: Job, status: str, reason: str) -> dict[str, Any]:
        return skeleton(matrix, job.cell, job.cases, backend=job.backend, run_id=job.run_id,
                        status=status, reason=reason)

    def _cancel(self, refs: list) -> None:
        """Cancel ``refs`` (KeyboardInterrupt in a running task: its cell is stopped), wait
        up to :data:`CANCEL_WAIT_S` for them to end, then kill the workers of those left."""
        ray = self.ray
        for ref in refs:
            try:
                ray.cancel(ref)
            except Exception:  # already finished, or the cluster gone
                pass
        deadline = time.monotonic() + CANCEL_WAIT_S
        left = refs
        while left and time.monotonic() < deadline:
            _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
        for ref in left:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass


def decode(data: bytes) -> dict:
    """A report from a node's JSON bytes, upgraded and validated as the reader does.

    Raises:
        ReportError: not UTF-8 JSON of an object, or not a valid report.
    """
    try:
        report = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise ReportError(f"not a JSON report: {err}") from err
    if not isinstance(report, dict):
        raise ReportError(f"expected a JSON object, got {type(report).__name__}")
    report = report_io.upgrade(report)
    report_io.validate(report)
    return report


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _first_line(err: BaseException) -> str:
    """The gist of ``err``: its last non-empty line (a task's traceback ends with the
    error), up to its first sentence, at most 300 characters."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(err).__name__
    return text.split(". ")[0][:300]
