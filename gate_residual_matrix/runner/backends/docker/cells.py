"""Run one cell of a docker stack in its own container (the docker backend's ``run``).

One container per cell, running the same ``python -m gate_residual_matrix cell ...`` as the
host backend, with the arguments of :func:`runner.backends.docker.container.container_config` (no
network, not root, read-only, one writable staging directory). The container is killed at
the cell timeout and removed in every case, Ctrl-C and SIGTERM to the runner included (its
staging directory too). The cell's report is then read from the staging directory, stamped
with the image (tag, id, digest, base, pins) and written to the reports directory; when the
cell wrote none, the report says why (:mod:`runner.backends.failure`: timeout, oom, error)
with the exit code and the container log's tail.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate_residual_matrix.runner.backends.base import failed_report, skipped_lines
from gate_residual_matrix.runner.backends.docker import images
from gate_residual_matrix.runner.backends.docker.container import (
    CONTAINER_MATRIX,
    CONTAINER_REPORTS,
    ContainerConfig,
    cell_command,
    container_config,
    gpu_request,
)
from gate_residual_matrix.runner.backends.docker.engine import (
    DEFAULT_LOGS_DIR,
    BuildResult,
    DeviceRequest,
    Engine,
    docker_errors,
    requests,
)
from gate_residual_matrix.runner.backends.failure import Ending, classify, explain, log_tail
from gate_residual_matrix.runner.backends.interrupts import deferred
from gate_residual_matrix.runner.backends.staging import stopped_partial
from gate_residual_matrix.runner.cell.environment import project_state
from gate_residual_matrix.runner.cell.progress import PREFIX, ProgressView
from gate_residual_matrix.runner.cell.run import case_key
from gate_residual_matrix.runner.config.matrix import Case, DockerStack, Matrix
from gate_residual_matrix.runner.errors import BackendError, ImageError
from gate_residual_matrix.runner.plan.cells import Cell, cases_on
from gate_residual_matrix.runner.reports import store as report_io
from gate_residual_matrix.runner.status import Status

__all__ = ["CONTAINER_MATRIX", "CONTAINER_REPORTS", "ContainerConfig", "DockerBackend",
           "Unready", "build_command", "cell_command", "container_config", "gpu_request",
           "image_record"]


def image_record(spec: images.ImageSpec, *, image_id: str | None = None,
                 digest: str | None = None, base_id: str | None = None) -> dict[str, Any]:
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


def _follow(api: Any, container: str, view: ProgressView) -> None:
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
        self._project: dict[str, Any] | None = None

    def spec(self, matrix: Matrix, stack: str) -> images.ImageSpec:
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

    def fingerprint_extra(self, matrix: Matrix, cell: Cell) -> dict[str, Any]:
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

    def unready(self, matrix: Matrix, stack: str) -> Unready | None:
        """Why the cells of ``stack`` cannot run here as things are, or None. Never builds.

        In this order: a wheelhouse (``pip.find_links``) or CA bundle (``pip.ca_bundle``)
        the stack names is not on this host; the engine lacks the stack's image and this
        backend may not build (``unbuilt``: ``nox -s build -- --stack NAME`` or ``matrix
        --build`` makes it; its base image may be missing too); with ``build``, the image
        is missing and so is its base image (never pulled). Each line says how to get what
        is missing. None for a ``kind: host`` stack, an image the engine has, and a stack
        that cannot be rendered (its cells end ``build_error``).
        """
        found = matrix.stacks[stack]
        if not isinstance(found, DockerStack):
            return None
        options = found.pip.over(matrix.pip)
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

    def prepare(self, matrix: Matrix, stacks: Sequence[str], *,
                strict: bool) -> dict[str, str]:
        """Which of ``stacks`` are skipped here, named once, before any cell runs.

        Returns {stack: the reason each of its cells' reports gets}, and prints one line
        per shared reason (``[runner] skipped docker stack(s) a, b: ...``). A stack is
        skipped when :meth:`unready` names what it lacks: its image above all, never built
        without ``build`` (``--build``); the line then gives the command that builds them
        all. ``strict`` (``--backend docker``): only a missing image stops the run, before
        anything runs; the cells of a stack that lacks something else end ``build_error``.
        With ``build`` the images still missing are built here (a failed build: the
        stack's cells end ``build_error``).

        Raises:
            BackendError: ``strict`` without ``build`` and a stack has no image, e.g.
                ``--backend docker: no image for docker stacks a, b (the matrix never
                builds one): `nox -s build -- --stack a --stack b`, or add --build``.
        """
        skips: dict[str, str] = {}
        unbuilt: dict[str | None, list[str]] = {}
        for stack in stacks:
            unready = self.unready(matrix, stack)
            if unready is not None and unready.unbuilt:
                unbuilt.setdefault(unready.base, []).append(stack)
                skips[stack] = unready.reason
            elif unready is not None and not strict:
                skips[stack] = unready.reason
        if unbuilt and strict:
            names = [s for group in unbuilt.values() for s in group]
            bases = "; ".join(f"first, their {base}" for base in unbuilt if base)
            raise BackendError(f"--backend docker: no image for docker stack(s) "
                               f"{', '.join(names)} (the matrix never builds one): "
                               f"`{build_command(names)}`, or add --build"
                               + (f"; {bases}" if bases else ""))
        lines = [f"skipped docker stack(s) {', '.join(group)}: no image, and the matrix never "
                 f"builds one: `{build_command(group)}`, or add --build"
                 + (f"; first, their {base}" if base else "") for base, group in unbuilt.items()]
        lines += skipped_lines({stack: reason for stack, reason in skips.items()
                                if not any(stack in group for group in unbuilt.values())})
        for line in lines:
            print(f"[runner] {line}", flush=True)
        if self.build:
            for stack in stacks:
                if stack not in skips and self.unready(matrix, stack) is None:
                    try:
                        self.ensure_image(self.spec(matrix, stack))
                    except ImageError:
                        pass  # not renderable: the cells say so (build_error)
        return skips

    def run(self, matrix: Matrix, cell: Cell, cases: Sequence[Case], *, matrix_path: Path,
            reports_dir: Path, run_id: str, timeout_s: float) -> dict[str, Any]:
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
            ending = self._run_container(
                config, timeout_s, cell_id=cell.id, cases=len(cases_on(cases, cell.target)))
            exit_code, log = ending.exit_code, ending.log
            path = stage / f"{cell.id}.json"
            loaded = report_io.read_report(path) if path.exists() else None
            if loaded and loaded.data and loaded.data.get("run_id") == run_id:
                report = loaded.data
                report["cell"]["backend"] = self.name
                report["image"] = image
                if report["status"] == Status.PARTIAL:  # stopped after some cases: keep them
                    report = stopped_partial(report, classify(ending),
                                             f"container exit code {exit_code}",
                                             exit_code=exit_code, log_tail=log_tail(log))
                if report["status"] != Status.OK and not report.get("log_tail"):
                    report["log_tail"] = log_tail(log)
                report_io.write_report(report, reports_dir)
                return report
            reason = explain(ending, timeout_s, "container")
            if loaded is not None and loaded.problem:
                reason += f" (its report was unreadable: {loaded.problem})"
            return self._failed(matrix, cell, cases, run_id, reports_dir, classify(ending),
                                reason, log_tail=log_tail(log), exit_code=exit_code,
                                image=image, started=started)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _run_container(self, config: ContainerConfig, timeout_s: float, *,
                       cell_id: str = "cell", cases: int = 0) -> Ending:
        """Create, start, wait (killing at ``timeout_s``), collect logs, always remove. The
        cell's progress lines are shown as they come (:class:`runner.cell.progress.ProgressView`).

        Returns how the container ended (exit code, log, timed out, OOM-killed).
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
            return Ending(state.get("ExitCode"), log, timed_out,
                          oom_killed=bool(state.get("OOMKilled")))
        finally:  # also on Ctrl-C / SIGTERM: force removal kills a running container
            if container is not None:
                try:
                    api.remove_container(container, force=True)
                except docker_errors.NotFound:
                    pass

    def _project_state(self) -> dict[str, Any]:
        if self._project is None:
            self._project = project_state()
        return self._project

    def _failed(self, matrix: Matrix, cell: Cell, cases: Sequence[Case], run_id: str,
                reports_dir: Path, status: str, reason: str, *, image: dict[str, Any] | None,
                started: float, log_tail: str | None = None,
                exit_code: int | None = None) -> dict[str, Any]:
        return failed_report(matrix, cell, cases, backend=self.name, run_id=run_id,
                             reports_dir=reports_dir, status=status, reason=reason,
                             started=started, exit_code=exit_code, log_tail=log_tail,
                             image=image)
