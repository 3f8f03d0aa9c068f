"""Where the selected cells of a run go: :class:`Site` (a backend here, or a Ray cluster).

Made by :func:`runner.pipeline.choose_site` and :func:`runner.pipeline.connect`, read by
every later step: :func:`runner.pipeline.check_site` sets whether a GPU is there,
:func:`runner.pipeline.prepare` asks its docker backend which stacks cannot run, and
:func:`runner.run.run_cells` takes each cell's backend (made on first use) and what
fingerprints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gate_residual_matrix.runner.backends.base import Backend, Fingerprinter
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.ray import cluster as cluster_mod
from gate_residual_matrix.runner.backends.registry import BACKENDS

__all__ = ["Site"]


@dataclass
class Site:
    """Where the selected cells run: ``chosen``, the backend docker stacks get (``note``:
    why ``--backend auto`` chose the host), the docker backend when this host runs
    containers, the Ray cluster when ``--cluster`` (its nodes run every cell), whether a
    GPU is there; the backends made so far (:meth:`backend`)."""

    chosen: str
    note: str | None = None
    docker: DockerBackend | None = None
    cluster: cluster_mod.Cluster | None = None
    has_gpu: bool = False
    made: dict[str, Backend] = field(default_factory=dict)

    def backend(self, name: str) -> Backend:
        """The backend ``name`` of this run, made on first use."""
        if name == "docker" and self.docker is not None:
            return self.docker
        if name not in self.made:
            self.made[name] = BACKENDS[name]()
        return self.made[name]

    def fingerprinter(self, name: str) -> Fingerprinter:
        """What fingerprints a cell that runs on ``name``: the cluster when there is one
        (a docker stack's image tag), else the backend."""
        return self.cluster if self.cluster is not None else self.backend(name)
