"""The docker backend: build each docker stack's image, run each cell in its own container.

Every docker-py call of the project lives in this module (the low-level ``APIClient``).

Build (:meth:`DockerBackend.ensure_image`): the image named by content
(:func:`runner.images.render`) is built only when the engine lacks it, streaming the build
log with a progress display (tqdm on a terminal, one line per step otherwise) and keeping the
whole log in ``build/logs/<stack>.build.log``. The base image is never pulled: a missing one
is an error that says how to get it. A failed build is data: every cell of that stack gets
a report with status ``build_error``, the reason and the log's tail, and the matrix goes on.

Run (:meth:`DockerBackend.run`): one container per cell, running the same
``python -m runner cell ...`` as the host backend, with the arguments of
:func:`container_config`: no network, user 10001 (not root), not privileged, every
capability dropped, read-only root file system (the baked-in project included) with a
tmpfs ``/tmp``, the matrix file bound read-only and one fresh staging directory bound as
the only writable path ``/reports``; ``target: cuda`` adds a GPU device request (all GPUs
or the ids given). The container is killed at the cell timeout and removed in every case.
The cell's report is then read from the staging directory, stamped with the image (tag,
id, digest, base, pins) and written to the reports directory; when the cell wrote none, the
report says why (timeout, oom, error) with the exit code and the container log's tail.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import images
from runner import report as report_io
from runner.cell import case_key, skeleton
from runner.config import DockerStack
from runner.environment import project_state
from runner.errors import BackendError, ImageError

try:  # docker-py is an optional dependency: pip install '.[docker]'
    import docker
    import requests
    from docker import errors as docker_errors
    from docker.types import DeviceRequest
except ImportError:  # pragma: no cover - exercised where docker-py is absent
    docker = None

__all__ = ["CONTAINER_MATRIX", "CONTAINER_REPORTS", "BuildResult", "ContainerConfig",
           "DockerBackend", "cell_command", "container_config", "image_record"]

CONTAINER_MATRIX = "/run/gate-residual/matrix.yaml"
CONTAINER_REPORTS = "/reports"
LOG_TAIL_CHARS = 6000
TMPFS_SIZE = "4g"
DEFAULT_LOGS_DIR = Path("build/logs")
_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)")


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


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

    Returns the keyword arguments of ``docker.types.DeviceRequest``. Raises BackendError
    for an empty or malformed list.

    Example::

        >>> gpu_request("all"), gpu_request("0,2")["device_ids"]
        ({'count': -1, 'capabilities': [['gpu']]}, ['0', '2'])
    """
    if gpus == "all":
        return {"count": -1, "capabilities": [["gpu"]]}
    ids = [g.strip() for g in gpus.split(",")]
    if not all(re.fullmatch(r"[0-9]+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+", g) for g in ids):
        raise BackendError(f'--gpus: expected "all" or device ids like "0,1", got {gpus!r}')
    return {"device_ids": ids, "capabilities": [["gpu"]]}


def container_config(image: str, command: Sequence[str], *, cell, run_id: str,
                     mode_env: Mapping[str, str], matrix_path: Path, stage_dir: Path,
                     project: Mapping[str, Any], gpus: str = "all") -> ContainerConfig:
    """The container of one cell, as plain arguments (a pure function: tests inspect it).

    ``stage_dir`` (absolute) becomes ``/reports``, the only writable bind; ``matrix_path``
    is bound read-only at :data:`CONTAINER_MATRIX`. ``project`` ({commit, dirty}) is passed
    as ``GATE_RESIDUAL_COMMIT`` / ``GATE_RESIDUAL_DIRTY`` so the report names the checkout
    the image was made from. ``cell.target == "cuda"`` adds the device request of
    :func:`gpu_request`.
    """
    env = {**dict(mode_env), "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
    if project.get("commit"):
        env["GATE_RESIDUAL_COMMIT"] = str(project["commit"])
        env["GATE_RESIDUAL_DIRTY"] = "1" if project.get("dirty") else "0"
    host = {
        "binds": {str(Path(stage_dir).resolve()): {"bind": CONTAINER_REPORTS, "mode": "rw"},
                  str(Path(matrix_path).resolve()): {"bind": CONTAINER_MATRIX, "mode": "ro"}},
        "network_mode": "none",
        "privileged": False,
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={TMPFS_SIZE}"},
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


@dataclass
class BuildResult:
    """How getting one image went: ``ok``; ``cached`` when the engine had it already.

    ``spec`` is None when the stack could not even be rendered (``reason`` says why).
    """

    stack: str
    spec: images.ImageSpec | None
    ok: bool
    image_id: str | None = None
    digest: str | None = None
    base_id: str | None = None
    size_bytes: int | None = None
    seconds: float = 0.0
    cached: bool = False
    reason: str | None = None
    log_tail: str | None = None
    log_path: Path | None = None
    steps: list[str] = field(default_factory=list)


class DockerBackend:
    """Runs each cell in a container of its stack's image, building images as needed.

    ``gpus``: ``"all"`` or device ids for ``target: cuda`` cells; ``matrix_dir`` resolves
    relative wheelhouse / CA bundle paths; ``logs_dir`` receives the full build logs.
    """

    name = "docker"

    def __init__(self, *, gpus: str = "all", matrix_dir: Path | None = None,
                 logs_dir: Path = DEFAULT_LOGS_DIR, progress: bool | None = None) -> None:
        gpu_request(gpus)  # refuse a malformed value now, not at the first cuda cell
        self.gpus = gpus
        self.matrix_dir = matrix_dir
        self.logs_dir = logs_dir
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._client = None
        self._specs: dict[tuple[int, str], images.ImageSpec | ImageError] = {}
        self._builds: dict[str, BuildResult] = {}
        self._project: dict | None = None
        self._why_not: str | bool | None = False  # False: not asked yet

    # --- the engine ------------------------------------------------------------------
    def available(self) -> str | None:
        """None when a Docker engine answers; otherwise one line saying why not (asked once)."""
        if self._why_not is False:
            self._why_not = self._ask_engine()
        return self._why_not

    def _ask_engine(self) -> str | None:
        if docker is None:
            return "docker-py is not installed (pip install '.[docker]')"
        try:
            self._api().ping()
        except (BackendError, docker_errors.DockerException,
                requests.exceptions.RequestException) as err:
            return f"no Docker engine answers ({_first_line(err)})"
        return None

    def _api(self):
        if docker is None:
            raise BackendError("docker-py is not installed (pip install '.[docker]')")
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=120).api
            except docker_errors.DockerException as err:
                raise BackendError(f"no Docker engine answers ({_first_line(err)})") from err
        return self._client

    def _inspect(self, ref: str) -> dict | None:
        try:
            return self._api().inspect_image(ref)
        except docker_errors.ImageNotFound:
            return None
        except docker_errors.APIError as err:
            if err.status_code == 404:
                return None
            raise

    # --- images ----------------------------------------------------------------------
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
        """The image tag (content hash) and, when built, the image id; {} for host stacks."""
        if not isinstance(matrix.stacks[cell.stack], DockerStack):
            return {}
        try:
            spec = self.spec(matrix, cell.stack)
        except ImageError as err:
            return {"image_error": str(err)}
        found = self._inspect(spec.tag) if self.available() is None else None
        return {"image": spec.tag, "image_id": found["Id"] if found else None}

    def ensure_image(self, spec: images.ImageSpec, *, force: bool = False) -> BuildResult:
        """Build ``spec`` unless the engine has its tag (``force``: build anyway, no cache).

        One attempt per tag and run: a failed build is remembered, not retried for each
        cell of the stack. Never raises for a failed build: see :class:`BuildResult`.
        """
        if spec.tag in self._builds and not force:
            return self._builds[spec.tag]
        found = None if force else self._inspect(spec.tag)
        if found is not None:
            result = BuildResult(spec.stack, spec, True, cached=True,
                                 **self._facts(found, spec))
        else:
            result = self._build(spec, nocache=force)
        self._builds[spec.tag] = result
        return result

    def _facts(self, found: dict, spec: images.ImageSpec) -> dict:
        base = self._inspect(spec.base_image)
        digests = found.get("RepoDigests") or []
        return {"image_id": found["Id"], "digest": digests[0] if digests else None,
                "base_id": base["Id"] if base else None, "size_bytes": found.get("Size")}

    def _build(self, spec: images.ImageSpec, *, nocache: bool) -> BuildResult:
        started = time.perf_counter()
        if self._inspect(spec.base_image) is None:
            return BuildResult(spec.stack, spec, False, reason=(
                f"base image {spec.base_image} is not on this Docker engine and is never "
                f"pulled: `docker pull {spec.base_image}` where a registry is reachable, "
                "or make one with `nox -s base_image`"))
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.logs_dir / f"{spec.stack}.build.log"
        tail: collections.deque[str] = collections.deque(maxlen=400)
        error: str | None = None
        steps: list[str] = []
        bar = self._bar(spec)
        try:
            with tempfile.TemporaryFile() as context, log_path.open("w") as log:
                spec.write_context(context)
                context.seek(0)
                stream = self._api().build(
                    fileobj=context, custom_context=True, tag=spec.tag, rm=True, forcerm=True,
                    pull=False, nocache=nocache, decode=True,
                    buildargs=dict(spec.buildargs) or None)
                for chunk in stream:
                    text = chunk.get("stream") or chunk.get("status") or ""
                    if "error" in chunk:
                        error = str(chunk.get("error")).strip()
                        text = f"ERROR: {error}\n"
                    if not text:
                        continue
                    log.write(text)
                    tail.extend(text.splitlines())
                    step = _STEP_RE.match(text.strip())
                    if step:
                        steps.append(text.strip())
                        self._show_step(bar, spec, int(step[1]), int(step[2]), step[3])
        except (docker_errors.DockerException, requests.exceptions.RequestException,
                OSError) as err:
            error = f"{type(err).__name__}: {_first_line(err)}"
            tail.append(error)
        finally:
            if bar is not None:
                bar.close()
        seconds = round(time.perf_counter() - started, 1)
        found = None if error else self._inspect(spec.tag)
        if found is None:
            reason = f"image build failed: {error or 'no image was tagged'}"
            return BuildResult(spec.stack, spec, False, seconds=seconds, reason=reason,
                               log_tail=_tail("\n".join(tail)), log_path=log_path, steps=steps)
        return BuildResult(spec.stack, spec, True, seconds=seconds, log_path=log_path, steps=steps,
                           **self._facts(found, spec))

    def _bar(self, spec: images.ImageSpec):
        if not self.progress:
            print(f"[runner] build {spec.stack}: {spec.tag}", flush=True)
            return None
        from tqdm import tqdm

        steps = sum(1 for line in spec.dockerfile.splitlines()
                    if re.match(r"^[A-Z]+\s", line) and not line.startswith("#"))
        return tqdm(total=steps, desc=f"build {spec.stack}", unit="step", file=sys.stderr,
                    dynamic_ncols=True)

    @staticmethod
    def _show_step(bar, spec: images.ImageSpec, step: int, total: int, what: str) -> None:
        if bar is None:
            print(f"[runner] build {spec.stack}: step {step}/{total}: {what[:100]}", flush=True)
            return
        bar.total = total
        bar.update(step - bar.n)
        bar.set_postfix_str(what[:60])

    def remove_image(self, tag: str) -> None:
        """Remove an image by tag (tests, and ``build --force`` clean-ups)."""
        try:
            self._api().remove_image(tag, force=True)
        except docker_errors.ImageNotFound:
            pass

    def import_rootfs(self, tar_path: Path, ref: str, *, changes: Sequence[str] = ()) -> str:
        """``docker import``: an image ``ref`` from a root file system tar. Returns its id."""
        repository, tag = ref.rsplit(":", 1)
        try:
            self._api().import_image_from_file(str(tar_path), repository=repository, tag=tag,
                                               changes=list(changes) or None)
        except docker_errors.DockerException as err:
            raise ImageError(f"docker import of {tar_path} as {ref} failed: "
                             f"{_first_line(err)}") from err
        found = self._inspect(ref)
        if found is None:
            raise ImageError(f"docker import of {tar_path} gave no image {ref}")
        return found["Id"]

    def image_id(self, ref: str) -> str | None:
        """The id of image ``ref`` on the engine, or None when it has no such image."""
        found = self._inspect(ref)
        return found["Id"] if found else None

    # --- cells -----------------------------------------------------------------------
    def run(self, matrix, cell, cases, *, matrix_path: Path, reports_dir: Path, run_id: str,
            timeout_s: float) -> dict:
        """Run one cell in a container; always returns its report (also written)."""
        started = time.perf_counter()
        try:
            spec = self.spec(matrix, cell.stack)
        except ImageError as err:
            return self._failed(matrix, cell, cases, run_id, reports_dir, "build_error",
                                str(err), image=None, started=started)
        built = self.ensure_image(spec)
        if not built.ok:
            log = f"(full log: {built.log_path})\n{built.log_tail}" if built.log_path else None
            return self._failed(matrix, cell, cases, run_id, reports_dir, "build_error",
                                f"{spec.tag}: {built.reason}", log_tail=log,
                                image=image_record(spec), started=started)
        image = image_record(spec, image_id=built.image_id, digest=built.digest,
                             base_id=built.base_id)
        stage = Path(reports_dir) / f".docker-{run_id}"
        stage.mkdir(parents=True)
        try:
            os.chmod(stage, 0o777)  # the image's user (uid 10001) writes the report here
            config = container_config(
                built.image_id or spec.tag,
                cell_command(cell, [str(case_key(c)) for c in cases], run_id),
                cell=cell, run_id=run_id, mode_env=matrix.modes[cell.mode].env,
                matrix_path=matrix_path, stage_dir=stage, project=self._project_state(),
                gpus=self.gpus)
            exit_code, log, timed_out, oom = self._run_container(config, timeout_s)
            path = stage / f"{cell.id}.json"
            loaded = report_io.read_report(path) if path.exists() else None
            if loaded and loaded.data and loaded.data.get("run_id") == run_id:
                report = loaded.data
                report["cell"]["backend"] = self.name
                report["image"] = image
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

    def _run_container(self, config: ContainerConfig, timeout_s: float,
                       ) -> tuple[int | None, str, bool, bool]:
        """Create, start, wait (killing at ``timeout_s``), collect logs, always remove.

        Returns (exit code, log text, timed out, OOM-killed).
        """
        api = self._api()
        host_config = api.create_host_config(
            **{k: v for k, v in config.host.items() if k != "device_requests"},
            device_requests=[DeviceRequest(**r) for r in config.host["device_requests"]])
        container = api.create_container(host_config=host_config, **config.create)["Id"]
        timed_out = False
        try:
            api.start(container)
            try:
                api.wait(container, timeout=timeout_s)
            except requests.exceptions.RequestException:  # read timeout: the cell ran over
                timed_out = True
                try:
                    api.kill(container)
                except docker_errors.APIError:
                    pass  # it ended between the timeout and the kill
                api.wait(container, timeout=60)
            state = api.inspect_container(container)["State"]
            log = api.logs(container, stdout=True, stderr=True).decode("utf-8", "replace")
            return state.get("ExitCode"), log, timed_out, bool(state.get("OOMKilled"))
        finally:
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


def build_stacks(matrix_path: Path, *, stacks: Sequence[str] | None = None, force: bool = False,
                 backend: DockerBackend | None = None) -> list[BuildResult]:
    """Build the images of the docker stacks of ``matrix_path`` (those named, or all).

    Images the engine has are kept (``force``: rebuilt without the layer cache). Prints a
    table (stack, tag, result, seconds, size) and returns one :class:`BuildResult` a stack;
    a failed build is a result, not an exception. Raises ConfigError / SelectionError for a
    bad matrix or a name that is not a docker stack, BackendError when no engine answers.

    Example::

        >>> [r.ok for r in build_stacks(Path("matrix.yaml"), stacks=["cpu-torch2.13"])]
        [True]
    """
    from tabulate import tabulate

    from runner import implementations
    from runner.config import load_matrix
    from runner.errors import SelectionError

    matrix = load_matrix(matrix_path, known_implementations=implementations.KNOWN)
    known = [n for n, s in matrix.stacks.items() if isinstance(s, DockerStack)]
    for name in stacks or ():
        if name not in known:
            raise SelectionError(f"--stack: {name!r} is not a docker stack of {matrix_path}; "
                                 f"choose from {', '.join(known) or 'none'}")
    backend = backend or DockerBackend(matrix_dir=Path(matrix_path).parent)
    why = backend.available()
    if why:
        raise BackendError(f"build: {why}")
    results = []
    for name in [n for n in known if not stacks or n in stacks]:
        try:
            spec = backend.spec(matrix, name)
        except ImageError as err:
            results.append(BuildResult(name, None, False, reason=str(err)))
            continue
        results.append(backend.ensure_image(spec, force=force))
    rows = [(r.stack, r.spec.tag if r.spec else "—",
             "cached" if r.cached else "built" if r.ok else "FAILED",
             f"{r.seconds:.1f}", f"{r.size_bytes / 1e9:.2f}" if r.size_bytes else "—",
             r.reason or (str(r.log_path) if r.log_path else "")) for r in results]
    print(tabulate(rows, headers=("stack", "image", "result", "seconds", "GB", "log / reason")))
    return results


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
