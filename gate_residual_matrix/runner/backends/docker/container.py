"""What a cell's container may do: its argv and its arguments, as plain data.

Pure functions, no docker-py call (tests inspect them): :func:`container_config` gives the
arguments of ``APIClient.create_container`` and ``create_host_config`` for one cell: no
network, user 10001 (not root), not privileged, every capability dropped, read-only root
file system with a tmpfs ``/tmp`` mounted exec (torch.compile loads the libraries it
builds there), the matrix file bound read-only and one fresh staging directory bound as
the only writable path ``/reports``; ``target: cuda`` adds a GPU device request
(:func:`gpu_request`). :func:`cell_command` is the host backend's ``python -m
gate_residual_matrix cell`` with the container's paths.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.backends import lifetime
from gate_residual_matrix.runner.backends.base import cell_argv
from gate_residual_matrix.runner.backends.docker import images
from gate_residual_matrix.runner.errors import ConfigError
from gate_residual_matrix.runner.plan.cells import Cell

__all__ = ["CONTAINER_MATRIX", "CONTAINER_REPORTS", "TMPFS_SIZE", "ContainerConfig",
           "cell_command", "container_config", "gpu_request"]

CONTAINER_MATRIX = "/run/gate-residual/matrix.yaml"
CONTAINER_REPORTS = "/reports"
TMPFS_SIZE = "4g"


@dataclass(frozen=True)
class ContainerConfig:
    """Arguments for ``APIClient.create_container`` (``create``) and for
    ``APIClient.create_host_config`` (``host``): the whole of what a cell's container may do."""

    create: Mapping[str, Any]
    host: Mapping[str, Any]


def cell_command(cell: Cell, case_ids: Sequence[str], run_id: str) -> list[str]:
    """The container's argv: :func:`runner.backends.base.cell_argv` with container paths.

    Example::

        >>> cell_command(Cell("s", "plain", "cpu"), ["257"], "ab")[:4]
        ['python', '-m', 'runner', 'cell']
    """
    return cell_argv("python", CONTAINER_MATRIX, CONTAINER_REPORTS, cell, case_ids, run_id)


def gpu_request(gpus: str) -> dict[str, Any]:
    """A GPU device request: ``"all"`` or comma-separated device ids / UUIDs (``"0,1"``).

    Returns the keyword arguments of ``docker.types.DeviceRequest``. Raises ConfigError
    (a bad ``--gpus``: exit 2) for an empty or malformed list.

    Example::

        >>> gpu_request("all"), gpu_request("0,2")["device_ids"]
        ({'count': -1, 'capabilities': [['gpu']]}, ['0', '2'])
    """
    if gpus == "all":
        return {"count": -1, "capabilities": [["gpu"]]}
    ids = [g.strip() for g in gpus.split(",")]
    if not all(re.fullmatch(r"[0-9]+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+", g) for g in ids):
        raise ConfigError(f'--gpus: expected "all" or device ids like "0,1", got {gpus!r}')
    return {"device_ids": ids, "capabilities": [["gpu"]]}


def container_config(image: str, command: Sequence[str], *, cell: Cell, run_id: str,
                     mode_env: Mapping[str, str], matrix_path: Path, stage_dir: Path,
                     project: Mapping[str, Any], gpus: str = "all",
                     timeout_s: float | None = None) -> ContainerConfig:
    """The container of one cell, as plain arguments (a pure function: tests inspect it).

    ``stage_dir`` (absolute) becomes ``/reports``, the only writable bind; ``matrix_path``
    is bound read-only at :data:`CONTAINER_MATRIX`. ``project`` ({commit, dirty}) is passed
    as ``GATE_RESIDUAL_COMMIT`` / ``GATE_RESIDUAL_DIRTY`` so the report names the checkout
    the image was made from. ``cell.target == "cuda"`` adds the device request of
    :func:`gpu_request`. ``timeout_s``: the cell's own deadline, so that a container whose
    runner died still ends (:mod:`runner.backends.lifetime`).
    """
    env: dict[str, str] = {**dict(mode_env), "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
    if timeout_s is not None:
        env.update(lifetime.child_environment(timeout_s))
    if project.get("commit"):
        env["GATE_RESIDUAL_COMMIT"] = str(project["commit"])
        env["GATE_RESIDUAL_DIRTY"] = "1" if project.get("dirty") else "0"
    host = {
        "binds": {str(Path(stage_dir).resolve()): {"bind": CONTAINER_REPORTS, "mode": "rw"},
                  str(Path(matrix_path).resolve()): {"bind": CONTAINER_MATRIX, "mode": "ro"}},
        "network_mode": "none",
        "privileged": False,
        "read_only": True,
        # exec: torch.compile loads the .so files inductor and Triton build under /tmp (HOME);
        # Docker mounts a tmpfs noexec unless told, and then `compiled` fails to load them.
        "tmpfs": {"/tmp": f"rw,exec,nosuid,nodev,size={TMPFS_SIZE}"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "init": True,
        "device_requests": ([gpu_request(gpus)] if cell.target == "cuda" else []),
    }
    create = {
        "image": image,
        "command": list(command),
        "user": f"{images.IMAGE_UID}:{images.IMAGE_UID}",
        "environment": env,
        "network_disabled": True,
        "working_dir": "/opt/gate-residual",
        "name": f"gate-residual-{cell.id}-{run_id[:12]}",
        "labels": {f"{images.LABEL_PREFIX}cell": cell.id, f"{images.LABEL_PREFIX}run-id": run_id},
        "use_config_proxy": False,
    }
    return ContainerConfig(create=create, host=host)
