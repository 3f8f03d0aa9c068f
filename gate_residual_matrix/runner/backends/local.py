"""This machine as a site: :class:`LocalSite`, the cells run one at a time by the host and
docker backends of this process (:mod:`runner.backends.registry`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gate_residual_matrix.runner.backends.base import Backend, Fingerprinter
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.registry import BACKENDS, resolve
from gate_residual_matrix.runner.backends.site import (
    Job,
    OnReport,
    Site,
    SiteOptions,
    docker_stacks,
)
from gate_residual_matrix.runner.backends.staging import run_staged
from gate_residual_matrix.runner.config.matrix import Matrix
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.case_sizes import host_memory_bytes
from gate_residual_matrix.runner.plan.cells import Cell

__all__ = ["LocalSite", "cuda_available"]


def cuda_available() -> bool:
    """Whether torch sees a CUDA device here (no CUDA context is created)."""
    import torch

    return torch.cuda.is_available()


@dataclass
class LocalSite(Site):
    """This machine: ``chosen``, the backend docker stacks get (``note``: why ``--backend
    auto`` chose the host), the docker backend when this host runs containers; the backends
    made so far (:meth:`backend`). :meth:`drain` runs the submitted cells one after another,
    each into a staging directory (:func:`runner.backends.staging.run_staged`), and hands
    each report back as soon as it is made."""

    chosen: str
    note: str | None = None
    docker: DockerBackend | None = None
    has_gpu: bool = False
    made: dict[str, Backend] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    name = "local"

    @classmethod
    def choose(cls, options: SiteOptions) -> LocalSite:
        """The site for ``options``: ``--backend`` resolved
        (:func:`runner.backends.registry.resolve`: ``auto`` asks the Docker engine); the
        docker backend is made only where this host may run containers.

        Raises:
            ConfigError: an unknown backend, ``--gpu-model`` (it places cells on a
                cluster's nodes).
            BackendError: ``--backend docker`` and no engine answers.
        """
        if options.gpu_model is not None:
            raise ConfigError("--gpu-model: places cells on a cluster's nodes; add --cluster")
        docker = None
        if options.backend != "host":
            docker = DockerBackend(gpus=options.gpus, matrix_dir=options.matrix_dir,
                                   build=options.build)
        chosen, note = resolve(options.backend, docker)
        return cls(chosen, note, docker=docker if chosen == "docker" else None)

    def memory_bytes(self) -> int | None:
        """This host's physical memory."""
        return host_memory_bytes()

    def gpu_available(self) -> bool:
        """Whether torch sees a CUDA device here."""
        return cuda_available()

    def prepare(self, matrix: Matrix, cells: Sequence[Cell], *,
                strict: bool) -> dict[str, str]:
        """On the host backend every docker stack is skipped; on the docker backend its
        ``prepare`` says which (no image: never built without ``--build``, which builds the
        missing ones here)."""
        if self.chosen != "docker":
            return self.skip_docker_stacks(matrix, cells)
        return self.backend("docker").prepare(matrix, docker_stacks(matrix, cells, self.has_gpu),
                                              strict=strict)

    def why_not(self, matrix: Matrix, cell: Cell) -> str | None:
        """A ``cuda`` cell where torch sees no GPU."""
        if cell.target == "cuda" and not self.has_gpu:
            return "target cuda: torch sees no CUDA device on this host"
        return None

    def backend(self, name: str) -> Backend:
        """The backend ``name`` of this run, made on first use."""
        if name == "docker" and self.docker is not None:
            return self.docker
        if name not in self.made:
            self.made[name] = BACKENDS[name]()
        return self.made[name]

    def fingerprinter(self, name: str) -> Fingerprinter:
        """The backend itself (a docker image's id; nothing on the host)."""
        return self.backend(name)

    def submit(self, job: Job) -> None:
        """Queue ``job``; it runs in :meth:`drain`."""
        self.jobs.append(job)

    def drain(self, on_report: OnReport) -> None:
        """Run the queued jobs in order, each reported before the next starts."""
        while self.jobs:
            job = self.jobs.pop(0)
            job.announce()
            batch = job.batch
            report = run_staged(self.backend(job.backend), batch.matrix, job.cell, job.cases,
                                job.resume, matrix_path=batch.matrix_path,
                                reports_dir=batch.reports_dir, run_id=job.run_id,
                                timeout_s=batch.timeout_s, stamp=job.stamp)
            on_report(job, report)
