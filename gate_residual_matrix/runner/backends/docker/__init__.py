"""The docker backend: each docker stack's image, each cell in its own container.

Every docker-py call of the project lives in this package, in two modules with one job each:
:mod:`~runner.backends.docker.engine` (is an engine there; build images with a progress
display, never pulling; prune; import a root file system) and
:mod:`~runner.backends.docker.cells` (:class:`DockerBackend`: one locked-down container per
cell, its report stamped with the image; it builds a missing image only when told to,
``matrix --build``); what that container may do is plain data, made by
:mod:`~runner.backends.docker.container`. The images themselves are rendered, with no
docker-py call, by :mod:`runner.images`. docker-py is optional (``pip install '.[docker]'``):
without it :meth:`DockerBackend.available` says so and ``--backend auto`` uses the host.
"""

from __future__ import annotations

from gate_residual_matrix.runner.backends.docker.cells import (
    DockerBackend,
    Unready,
    build_command,
    image_record,
)
from gate_residual_matrix.runner.backends.docker.container import (
    CONTAINER_MATRIX,
    CONTAINER_REPORTS,
    ContainerConfig,
    cell_command,
    container_config,
    gpu_request,
)
from gate_residual_matrix.runner.backends.docker.engine import (
    BuildResult,
    Engine,
    build_stacks,
    docker_errors,
)

__all__ = ["CONTAINER_MATRIX", "CONTAINER_REPORTS", "BuildResult", "ContainerConfig",
           "DockerBackend", "Engine", "Unready", "build_command", "build_stacks",
           "cell_command", "container_config", "docker_errors", "gpu_request", "image_record"]
