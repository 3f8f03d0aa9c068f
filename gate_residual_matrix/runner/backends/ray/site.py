"""A Ray cluster as a site: :class:`RaySite`, the cells submitted run as the cluster's
tasks, all at once, in :meth:`RaySite.drain` (:meth:`runner.backends.ray.cluster.Cluster.run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gate_residual_matrix.runner.backends.base import Backend, Fingerprinter
from gate_residual_matrix.runner.backends.ray import cluster as cluster_mod
from gate_residual_matrix.runner.backends.ray.connect import connect
from gate_residual_matrix.runner.backends.site import Job, OnReport, Site, SiteOptions
from gate_residual_matrix.runner.config.matrix import Matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.cells import Cell

__all__ = ["RaySite"]


class RaySite(Site):
    """The Ray cluster at ``--cluster ADDRESS``: its nodes run every cell (a docker stack's
    on a node with an engine, unless ``--backend host`` skips them).

    Made without connecting (options checked); :meth:`open` connects
    (:func:`runner.backends.ray.connect.connect`).

    Raises:
        ConfigError: an unknown backend, ``--abba`` (its A-B-B-A order of processes is one
            machine's).
    """

    name = "ray"

    def __init__(self, options: SiteOptions) -> None:
        self.chosen = cluster_mod.backend_choice(options.backend, options.abba)
        self.options = options
        self.cluster: cluster_mod.Cluster | None = None
        self.jobs: dict[int, Job] = {}

    def open(self) -> None:
        """Connect to the cluster.

        Raises:
            ConfigError: Ray is not installed, a malformed address or option.
            BackendError: the cluster does not answer.
        """
        o = self.options
        self.cluster = connect(str(o.cluster), gpu_model=o.gpu_model, retries=o.retries,
                               build=o.build, matrix_dir=o.matrix_dir)

    def close(self) -> None:
        """Disconnect (the cluster goes on)."""
        if self.cluster is not None:
            self.cluster.close()

    def _connected(self) -> cluster_mod.Cluster:
        if self.cluster is None:
            raise RuntimeError("RaySite: open() it first")
        return self.cluster

    def memory_bytes(self) -> int | None:
        """The largest ``memory`` resource of a live node."""
        return self._connected().memory_bytes()

    def gpu_available(self) -> bool:
        """True: a cell that no node can run is skipped by :meth:`why_not`, naming what is
        missing."""
        return True

    def prepare(self, matrix: Matrix, cells: Sequence[Cell], *,
                strict: bool) -> dict[str, str]:
        """With the nodes' engines, nothing here (each node says so for its cells); under
        ``--backend host`` every docker stack is skipped."""
        if self.chosen == "docker":
            return {}
        return self.skip_docker_stacks(matrix, cells)

    def why_not(self, matrix: Matrix, cell: Cell) -> str | None:
        """No live node offers what ``cell`` needs (:meth:`Cluster.unoffered`)."""
        cluster = self._connected()
        return cluster.unoffered(cluster_mod.needs(matrix, cell, cluster.gpu_model))

    def fingerprinter(self, name: str) -> Fingerprinter:
        """The cluster: a docker stack's image tag (each node builds its own image)."""
        return self._connected()

    def backend(self, name: str) -> Backend:
        """There is none: the nodes run the cells.

        Raises:
            ConfigError: always.
        """
        raise ConfigError("--abba: runs its processes in A-B-B-A order on one machine; "
                          "leave out --cluster")

    def submit(self, job: Job) -> None:
        """Keep ``job`` for :meth:`drain`."""
        job.announce(" (cluster)")
        self.jobs[job.key] = job

    def drain(self, on_report: OnReport) -> None:
        """Run the kept jobs as the cluster's tasks at once, each report handed on as it
        arrives (:meth:`runner.backends.ray.cluster.Cluster.run`)."""
        jobs, self.jobs = self.jobs, {}
        if not jobs:
            return
        cluster = self._connected()
        batch = next(iter(jobs.values())).batch

        def arrived(task: cluster_mod.Job, report: dict[str, Any]) -> None:
            job = jobs[task.key]
            on_report(job, job.finish(report))

        tasks = [cluster_mod.Job(j.key, j.cell, j.cases, j.run_id, j.backend,
                                 cluster_mod.needs(batch.matrix, j.cell, cluster.gpu_model))
                 for j in jobs.values()]
        cluster.run(tasks, matrix=batch.matrix, matrix_path=batch.matrix_path,
                    origin=batch.origin, timeout_s=batch.timeout_s, commit=batch.commit,
                    on_report=arrived)
