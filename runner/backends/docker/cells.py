"""Run one cell of a docker stack in its own container (the docker backend's ``run``).

One container per cell, running the same ``python -m runner cell ...`` as the host backend,
with the arguments of :func:`container_config`: no network, user 10001 (not root), not
privileged, every capability dropped, read-only root file system (the baked-in project
included) with a tmpfs ``/tmp`` mounted exec (torch.compile loads the libraries it builds
there), the matrix file bound read-only and one fresh staging directory bound as the only
writable path ``/reports``; ``target: cuda`` adds a GPU device
request (all GPUs or the ids given). The container is killed at the cell timeout and removed
in every case, Ctrl-C and SIGTERM to the runner included (its staging directory too). The
cell's report is then read from the staging directory, stamped with the
image (tag, id, digest, base, pins) and written to the reports directory; when the cell wrote
none, the report says why (timeout, oom, error) with the exit code and the container log's
tail.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import images, lifetime
from runner import report as report_io
from runner.backends.docker.engine import (
    DEFAULT_LOGS_DIR,
    BuildResult,
    DeviceRequest,
    Engine,
    _tail,
    docker_errors,
    requests,
)
from runner.backends.interrupts import deferred
from runner.cell import case_key, skeleton
from runner.cells import cases_on
from runner.config import DockerStack
from runner.environment import project_state
from runner.errors import ConfigError, ImageError
from runner.progress import PREFIX, ProgressView
from runner.staging import stopped_partial

__all__ = ["CONTAINER_MATRIX", "CONTAINER_REPORTS", "ContainerConfig", "DockerBackend",
           "Unready", "build_command", "cell_command", "container_config", "gpu_request",
           "image_record"]

CONTAINER_MATRIX = "/run/gate-residual/matrix.yaml"
CONTAINER_REPORTS = "/reports"
TMPFS_SIZE = "4g"


@dataclass(frozen=True)
class ContainerConfig:
    """Arguments for ``APIClient.create_container`` (``create``) and for
    ``APIClient.create_host_config`` (``host``): the whole of what a cell's container may do."""

    create: Mapping[str, Any]
    host: Mapping[str, Any]


def cell_command(cell, case_ids: Sequence[str], run_id: str) -> list[str]:
    """The container's argv: the host backend's ``python -m runner cell`` with container paths.

    Example::

        >>> cell_command(Cell("s", "plain", "cpu"), ["257"], "ab")[:4]
        ['python', '-m', 'runner', 'cell']
    """
    argv = ["python", "-m", "runner", "cell", "--matrix", CONTAINER_MATRIX,
            "--stack", cell.stack, "--mode", cell.mode, "--target", cell.target,
            "--reports", CONTAINER_REPORTS, "--run-id", run_id]
    for case_id in case_ids:
        argv += ["--case", str(case_id)]
    return argv


def gpu_request(gpus: str) -> dict:
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


def container_config(image: str, command: Sequence[str], *, cell, run_id: str,
                     mode_env: Mapping[str, str], matrix_path: Path, stage_dir: Path,
                     project: Mapping[str, Any], gpus: str = "all",
                     timeout_s: float | None = None) -> ContainerConfig:
    """The container of one cell, as plain arguments (a pure function: tests inspect it).

    ``stage_dir`` (absolute) becomes ``/reports``, the only writable bind; ``matrix_path``
    is bound read-only at :data:`CONTAINER_MATRIX`. ``project`` ({commit, dirty}) is passed
    as ``GATE_RESIDUAL_COMMIT`` / ``GATE_RESIDUAL_DIRTY`` so the report names the checkout
    the image was made from. ``cell.target == "cuda"`` adds the device request of
    :func:`gpu_request`. ``timeout_s``: the cell's own deadline, so that a container whose
    runner died still ends (:mod:`runner.lifetime`).
    """
    env = {**dict(mode_env), "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
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


def image_record(spec: images.ImageSpec, *, image_id: str | None = None,
                 digest: str | None = None, base_id: str | None = None) -> dict:
    """The report's ``image`` object (docs/report-format.md)."""
    return {"tag": spec.tag, "id": image_id, "digest": digest,
            "content_hash": spec.content_hash, "base_image": spec.base_image,
            "base_id": base_id, "pins": dict(spec.pins)}


def build_command(stacks: Sequence[str]) -> str:
    """The command that builds the images of ``stacks``.

    Example::

        >>> build_command(["a", "b"])
        'nox -s build -- --stack a --stack b'
    """
    return "nox -s build -- " + " ".join(f"--stack {s}" for s in stacks)


@dataclass(frozen=True)
class Unready:
    """Why the cells of one docker stack cannot run here as things are.

    ``reason``: one line saying what is missing and what to do, for each cell's report.
    ``unbuilt``: the stack's image is not on the engine and this run may not build it (the
    matrix builds only with ``--build``); ``base``: then also the line saying its base image
    is missing (:meth:`Engine.base_image_missing`), else None.
    """

    reason: str
    unbuilt: bool = False
    base: str | None = None


def _follow(api, container: str, view: ProgressView) -> None:
    """Thread: feed the container's progress lines to ``view`` as they come (the full log
    is read once the container has ended). Any engine error ends the following, not the
    cell."""
    try:
        pending = ""
        for chunk in api.logs(container, stdout=True, stderr=True, stream=True, follow=True):
            pending += chunk.decode("utf-8", "replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                if line.startswith((PREFIX, "[cell]")):
                    view.feed(line)
    except Exception:  # progress is never worth failing a cell for
        return


class DockerBackend(Engine):
    """Runs each cell in a container of its stack's image.

    ``gpus``: ``"all"`` or device ids for ``target: cuda`` cells; ``matrix_dir`` resolves
    relative wheelhouse / CA bundle paths; ``build``: whether this backend may build an
    image the engine lacks (``matrix --build``); without it a missing image is never built
    (:meth:`unready` says so) and a cell that reaches :meth:`run` anyway ends
    ``build_error``. ``logs_dir`` and ``progress``: see :class:`Engine`.
    """

    name = "docker"

    def __init__(self, *, gpus: str = "all", matrix_dir: Path | None = None,
                 build: bool = False, logs_dir: Path = DEFAULT_LOGS_DIR,
                 progress: bool | None = None) -> None:
        gpu_request(gpus)  # refuse a malformed value now, not at the first cuda cell
        super().__init__(logs_dir=logs_dir, progress=progress)
        self.gpus = gpus
        self.matrix_dir = matrix_dir
        self.build = build
        self._specs: dict[tuple[int, str], images.ImageSpec | ImageError] = {}
        self._project: dict | None = None

    def spec(self, matrix, stack: str) -> images.ImageSpec:
        """The rendered image of ``stack`` (cached for this run). Raises ImageError."""
        key = (id(matrix), stack)
        if key not in self._specs:
            try:
                self._specs[key] = images.render(matrix, stack,
                                                 matrix_dir=self.matrix_dir or Path.cwd())
            except ImageError as err:
                self._specs[key] = err
        found = self._specs[key]
        if isinstance(found, ImageError):
            raise found
        return found

    def fingerprint_extra(self, matrix, cell) -> dict:
        """The image tag (content hash) and id of the cell's stack; {} for host stacks.

        With ``build`` the image is built here when the engine lacks it (once a run, see
        :meth:`ensure_image`), so the id is that of the image the cell will run in: a
        report is reused only for the very same image. A missing image or a failed build
        gives id None.
        """
        if not isinstance(matrix.stacks[cell.stack], DockerStack):
            return {}
        try:
            spec = self.spec(matrix, cell.stack)
        except ImageError as err:
            return {"image_error": str(err)}
        return {"image": spec.tag, "image_id": self._image(spec).image_id}

    def _image(self, spec: images.ImageSpec) -> BuildResult:
        """The image of ``spec``: built when missing only if this backend may build."""
        if self.build:
            return self.ensure_image(spec)
        return self.find_image(spec) or BuildResult(spec.stack, spec, False, reason=(
            f"image {spec.tag} is not built, and the matrix never builds one: "
            f"`{build_command([spec.stack])}`, or add --build to the matrix command"))

    def unready(self, matrix, stack: str) -> Unready | None:
        """Why the cells of ``stack`` cannot run here as things are, or None. Never builds.

        In this order: a wheelhouse (``pip.find_links``) or CA bundle (``pip.ca_bundle``)
        the stack names is not on this host; the engine lacks the stack's image and this
        backend may not build (``unbuilt``: ``nox -s build -- --stack NAME`` or ``matrix
        --build`` makes it; its base image may be missing too); with ``build``, the image
        is missing and so is its base image (never pulled). Each line says how to get what
        is missing. None for a ``kind: host`` stack, an image the engine has, and a stack
        that cannot be rendered (its cells end ``build_error``).
        """
        if not isinstance(matrix.stacks[stack], DockerStack):
            return None
        options = matrix.stacks[stack].pip.over(matrix.pip)
        for key, value, is_file in (("pip.find_links", options.find_links, False),
                                    ("pip.ca_bundle", options.ca_bundle, True)):
            if value is None:
                continue
            path = Path(value) if Path(value).is_absolute() else (
                (self.matrix_dir or Path.cwd()) / value)
            there = path.is_file() if is_file else (path.is_dir() and any(
                p.is_file() and not p.name.startswith(".") for p in path.iterdir()))
            if not there:
                what = "CA bundle" if is_file else "wheelhouse (a directory of wheels)"
                return Unready(f'stack "{stack}": {key} {path}: this host has no such {what}, '
                               "which the image build needs (docs/containers.md)")
        try:
            spec = self.spec(matrix, stack)
        except ImageError:
            return None  # a stack that cannot be rendered is a build_error, not this host's lack
        if self.find_image(spec) is not None:
            return None
        no_base = self.base_image_missing(spec)
        if self.build:
            return Unready(no_base) if no_base else None
        reason = self._image(spec).reason or ""
        return Unready(reason + (f"; first, its {no_base}" if no_base else ""),
                       unbuilt=True, base=no_base)

    def run(self, matrix, cell, cases, *, matrix_path: Path, reports_dir: Path, run_id: str,
            timeout_s: float) -> dict:
        """Run one cell in a container; always returns its report (also written)."""
        started = time.perf_counter()
        try:
            spec = self.spec(matrix, cell.stack)
        except ImageError as err:
            return self._failed(matrix, cell, cases, run_id, reports_dir, "build_error",
                                str(err), image=None, started=started)
        built = self._image(spec)
        if not built.ok:
            log = f"(full log: {built.log_path})\n{built.log_tail}" if built.log_path else None
            return self._failed(matrix, cell, cases, run_id, reports_dir, "build_error",
                                f"{spec.tag}: {built.reason}", log_tail=log,
                                image=image_record(spec), started=started)
        image = image_record(spec, image_id=built.image_id, digest=built.digest,
                             base_id=built.base_id)
        stage = Path(reports_dir) / f".docker-{run_id}"
        try:
            stage.mkdir(parents=True)
            os.chmod(stage, 0o777)  # the image's user (uid 10001) writes the report here
            config = container_config(
                built.image_id or spec.tag,
                cell_command(cell, [str(case_key(c)) for c in cases], run_id),
                cell=cell, run_id=run_id, mode_env=matrix.modes[cell.mode].env,
                matrix_path=matrix_path, stage_dir=stage, project=self._project_state(),
                gpus=self.gpus, timeout_s=timeout_s)
            exit_code, log, timed_out, oom = self._run_container(
                config, timeout_s, cell_id=cell.id, cases=len(cases_on(cases, cell.target)))
            path = stage / f"{cell.id}.json"
            loaded = report_io.read_report(path) if path.exists() else None
            if loaded and loaded.data and loaded.data.get("run_id") == run_id:
                report = loaded.data
                report["cell"]["backend"] = self.name
                report["image"] = image
                if report["status"] == "partial":  # stopped after some cases: keep them
                    how = "timeout" if timed_out else ("oom" if oom else "error")
                    report = stopped_partial(report, how, f"container exit code {exit_code}",
                                             exit_code=exit_code, log_tail=_tail(log))
                if report["status"] != "ok" and not report.get("log_tail"):
                    report["log_tail"] = _tail(log)
                report_io.write_report(report, reports_dir)
                return report
            if timed_out:
                status, reason = "timeout", (f"timed out: no report after the cell timeout of "
                                             f"{timeout_s:g} s; the container was killed")
            elif oom or "out of memory" in log.lower() or "outofmemoryerror" in log.lower():
                status, reason = "oom", (f"out of memory: the container was OOM-killed "
                                         f"(exit code {exit_code}) and wrote no report")
            else:
                status = "error"
                reason = f"container exited with code {exit_code} and wrote no report"
            if loaded is not None and loaded.problem:
                reason += f" (its report was unreadable: {loaded.problem})"
            return self._failed(matrix, cell, cases, run_id, reports_dir, status, reason,
                                log_tail=_tail(log), exit_code=exit_code, image=image,
                                started=started)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _run_container(self, config: ContainerConfig, timeout_s: float, *,
                       cell_id: str = "cell", cases: int = 0,
                       ) -> tuple[int | None, str, bool, bool]:
        """Create, start, wait (killing at ``timeout_s``), collect logs, always remove. The
        cell's progress lines are shown as they come (:class:`runner.progress.ProgressView`).

        Returns (exit code, log text, timed out, OOM-killed).
        """
        api = self._api()
        host_config = api.create_host_config(
            **{k: v for k, v in config.host.items() if k != "device_requests"},
            device_requests=[DeviceRequest(**r) for r in config.host["device_requests"]])
        container, timed_out = None, False
        try:
            with deferred():  # an interruption during the create lands once the id is known
                container = api.create_container(host_config=host_config,
                                                 **config.create)["Id"]
            api.start(container)
            with ProgressView(cell_id, cases) as view:
                follower = threading.Thread(target=_follow, args=(api, container, view),
                                            name="container-output", daemon=True)
                follower.start()
                try:
                    api.wait(container, timeout=timeout_s)
                except requests.exceptions.RequestException:  # read timeout: it ran over
                    timed_out = True
                    try:
                        api.kill(container)
                    except docker_errors.APIError:
                        pass  # it ended between the timeout and the kill
                    api.wait(container, timeout=60)
                follower.join(timeout=5)
            state = api.inspect_container(container)["State"]
            log = api.logs(container, stdout=True, stderr=True).decode("utf-8", "replace")
            return state.get("ExitCode"), log, timed_out, bool(state.get("OOMKilled"))
        finally:  # also on Ctrl-C / SIGTERM: force removal kills a running container
            if container is not None:
                try:
                    api.remove_container(container, force=True)
                except docker_errors.NotFound:
                    pass

    def _project_state(self) -> dict:
        if self._project is None:
            self._project = project_state()
        return self._project

    def _failed(self, matrix, cell, cases, run_id: str, reports_dir: Path, status: str,
                reason: str, *, image: dict | None, started: float, log_tail: str | None = None,
                exit_code: int | None = None) -> dict:
        failed = skeleton(matrix, cell, cases, backend=self.name, run_id=run_id,
                          status=status, reason=reason)
        failed.update(exit_code=exit_code, log_tail=log_tail, image=image,
                      duration_s=round(time.perf_counter() - started, 3))
        report_io.write_report(failed, reports_dir)
        return failed
