"""The Docker engine through docker-py: is one there, and the images (build, prune, import).

:meth:`Engine.ensure_image` builds the image named by content
(:func:`runner.backends.docker.images.render`)
only when the engine lacks it, streaming the build log with a progress display (tqdm on a
terminal, one line per step otherwise) and keeping the whole log in
``build/logs/<stack>.build.log``. The base image is never pulled: a missing one is a failed
build whose reason says how to get it. A failed build is a :class:`BuildResult`, not an
exception; the cells of that stack report it as ``build_error``.
"""

from __future__ import annotations

import collections
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gate_residual_matrix.runner.backends.docker import images
from gate_residual_matrix.runner.backends.failure import log_tail
from gate_residual_matrix.runner.config.matrix import DockerStack
from gate_residual_matrix.runner.errors import BackendError, ImageError

try:  # docker-py is an optional dependency: pip install '.[docker]'
    import docker
    import requests
    from docker import errors as docker_errors
    from docker.types import DeviceRequest
except ImportError:  # pragma: no cover - exercised where docker-py is absent
    # available() says so; every other use comes after it said None (docker-py is there)
    docker = docker_errors = requests = DeviceRequest = None  # type: ignore[assignment]

__all__ = ["DEFAULT_LOGS_DIR", "BuildResult", "Engine", "build_stacks", "docker_errors"]

DEFAULT_LOGS_DIR = Path("build/logs")
NO_ENGINE = "no Docker engine: start one, or run `nox -s matrix -- --backend host`"
"""Why docker cells cannot run when no engine answers: a sentence, not docker-py's text."""
ENGINE_REFUSES = ("the Docker engine refuses this user: join the docker group (or run as "
                  "root), or run `nox -s matrix -- --backend host`")
"""Why not, when the engine's socket is there but this user may not open it."""


def _no_engine(err: BaseException) -> str:
    """:data:`ENGINE_REFUSES` when ``err`` (or an error it wraps) is a permission error, else
    :data:`NO_ENGINE`: what docker-py raises says neither in words a person reads."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, PermissionError) or "PermissionError" in str(seen):
            return ENGINE_REFUSES
        seen = seen.__cause__ or seen.__context__
    return NO_ENGINE
_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)")


@dataclass
class BuildResult:
    """How getting one image went: ``ok``; ``cached`` when the engine had it already.

    ``spec`` is None when the stack could not even be rendered (``reason`` says why).
    ``missing_base``: the build did not start because the base image is not on the engine
    (it is never pulled); ``--backend auto`` reports such a stack's cells ``skipped``.
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
    missing_base: bool = False


class Engine:
    """The Docker engine (docker-py's low-level client, made on first use) and the images.

    ``logs_dir`` receives the full build logs; ``progress`` shows a progress bar (default:
    when stderr is a terminal).
    """

    def __init__(self, *, logs_dir: Path = DEFAULT_LOGS_DIR,
                 progress: bool | None = None) -> None:
        self.logs_dir = logs_dir
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._client = None
        self._builds: dict[str, BuildResult] = {}
        self._asked = False
        self._why_not: str | None = None

    # --- the engine ------------------------------------------------------------------
    def available(self) -> str | None:
        """None when a Docker engine answers; otherwise one line saying why not (asked once)."""
        if not self._asked:
            self._why_not, self._asked = self._ask_engine(), True
        return self._why_not

    def _ask_engine(self) -> str | None:
        if docker is None:
            return "docker-py is not installed (pip install '.[docker]')"
        try:
            self._api().ping()
        except BackendError as err:  # already says what is missing
            return str(err)
        except (docker_errors.DockerException, requests.exceptions.RequestException) as err:
            return _no_engine(err)
        return None

    def _api(self):
        if docker is None:
            raise BackendError("docker-py is not installed (pip install '.[docker]')")
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=120).api
            except docker_errors.DockerException as err:
                raise BackendError(_no_engine(err)) from err
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

    # --- images ---------------------------------------------------------------------
    def find_image(self, spec: images.ImageSpec) -> BuildResult | None:
        """The engine's image of ``spec`` (``cached``), this run's attempt at building it,
        or None when neither exists. Never builds: see :meth:`ensure_image` for that."""
        if spec.tag in self._builds:
            return self._builds[spec.tag]
        found = self._inspect(spec.tag)
        if found is None:
            return None
        self._builds[spec.tag] = BuildResult(spec.stack, spec, True, cached=True,
                                             **self._facts(found, spec))
        return self._builds[spec.tag]

    def base_image_missing(self, spec: images.ImageSpec) -> str | None:
        """One line saying that ``spec``'s base image is not on the engine and how to get
        it (it is never pulled), or None when it is there."""
        if self._inspect(spec.base_image) is not None:
            return None
        return (f"base image {spec.base_image} is not on this Docker engine and is never "
                f"pulled: `docker pull {spec.base_image}` where a registry is reachable, "
                "or make one with `nox -s base_image`")

    def ensure_image(self, spec: images.ImageSpec, *, force: bool = False) -> BuildResult:
        """Build ``spec`` unless the engine has its tag (``force``: build anyway, no cache).

        One attempt per tag and run: a failed build is remembered, not retried for each
        cell of the stack. Never raises for a failed build: see :class:`BuildResult`.
        """
        found = None if force else self.find_image(spec)
        if found is not None:
            return found
        self._builds[spec.tag] = self._build(spec, nocache=force)
        return self._builds[spec.tag]

    def _facts(self, found: dict, spec: images.ImageSpec) -> dict:
        base = self._inspect(spec.base_image)
        digests = found.get("RepoDigests") or []
        return {"image_id": found["Id"], "digest": digests[0] if digests else None,
                "base_id": base["Id"] if base else None, "size_bytes": found.get("Size")}

    def _build(self, spec: images.ImageSpec, *, nocache: bool) -> BuildResult:
        started = time.perf_counter()
        no_base = self.base_image_missing(spec)
        if no_base:
            return BuildResult(spec.stack, spec, False, missing_base=True, reason=no_base)
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
                               log_tail=log_tail("\n".join(tail)), log_path=log_path, steps=steps)
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

    def prune(self, spec: images.ImageSpec) -> list[str]:
        """Remove the other tags of ``spec``'s stack (images of older content); their layers
        shared with ``spec``'s image stay. Returns the tags removed.

        Only tags ``gate-residual-matrix:<stack>-<16 hex>`` whose stack label is this stack
        are touched. Call it after ``spec`` was built: removing a tag also removes its
        untagged parents that nothing else uses, the layer cache of the next build included.
        """
        pattern = re.compile(rf"^{re.escape(images.REPOSITORY)}:{re.escape(spec.stack)}"
                             r"-[0-9a-f]{16}$")
        removed = []
        for image in self._api().images(name=images.REPOSITORY):
            labels = image.get("Labels") or {}
            if labels.get(f"{images.LABEL_PREFIX}stack") != spec.stack:
                continue
            for tag in image.get("RepoTags") or []:
                if tag != spec.tag and pattern.match(tag):
                    self.remove_image(tag)
                    removed.append(tag)
        return removed

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


def build_stacks(matrix_path: Path, *, stacks: Sequence[str] | None = None, force: bool = False,
                 prune: bool = False, engine: Engine | None = None) -> list[BuildResult]:
    """Build the images of the docker stacks of ``matrix_path`` (those named, or all).

    Images the engine has are kept (``force``: rebuilt without the layer cache; ``prune``:
    then remove the stack's images of older content, see :meth:`Engine.prune`). Prints a
    table (stack, tag, result, seconds, size) and returns one :class:`BuildResult` a stack;
    a failed build is a result, not an exception. Raises ConfigError / SelectionError for a
    bad matrix or a name that is not a docker stack, BackendError when no engine answers.

    Example::

        >>> [r.ok for r in build_stacks(Path("matrix.yaml"), stacks=["cpu-torch2.13"])]
        [True]
    """
    from tabulate import tabulate

    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.errors import SelectionError

    matrix = load_matrix(matrix_path, known_implementations=implementations.known)
    known = [n for n, s in matrix.stacks.items() if isinstance(s, DockerStack)]
    for name in stacks or ():
        if name not in known:
            raise SelectionError(f"--stack: {name!r} is not a docker stack of {matrix_path}; "
                                 f"choose from {', '.join(known) or 'none'}")
    engine = engine or Engine()
    why = engine.available()
    if why:
        raise BackendError(f"build: {why}")
    results = []
    for name in [n for n in known if not stacks or n in stacks]:
        try:
            spec = images.render(matrix, name, matrix_dir=Path(matrix_path).parent)
        except ImageError as err:
            results.append(BuildResult(name, None, False, reason=str(err)))
            continue
        results.append(engine.ensure_image(spec, force=force))
        if prune and results[-1].ok:
            for tag in engine.prune(spec):
                print(f"[runner] build {name}: removed {tag} (older content)", flush=True)
    rows = [(r.stack, r.spec.tag if r.spec else "—",
             "cached" if r.cached else "built" if r.ok else "FAILED",
             f"{r.seconds:.1f}", f"{r.size_bytes / 1e9:.2f}" if r.size_bytes else "—",
             r.reason or (str(r.log_path) if r.log_path else "")) for r in results]
    print(tabulate(rows, headers=("stack", "image", "result", "seconds", "GB", "log / reason")))
    return results


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
