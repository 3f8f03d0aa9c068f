"""Backends run one cell somewhere and return its report: ``available()``, ``run(...)``.

Listed in :data:`BACKENDS`. Every subprocess call lives in :mod:`runner.backends.host`,
every docker-py call in :mod:`runner.backends.docker`.

Which backend runs a cell (:func:`route`): a ``kind: host`` stack always runs on the host;
a ``kind: docker`` stack runs in the docker backend, and is ``skipped`` (with the reason)
when the run uses the host backend. ``--backend auto`` (:func:`resolve`) is docker when an
engine answers, else host. Before any cell runs, :func:`prepare_stacks` decides which docker
stacks cannot run here (no engine, no image: a matrix run never builds one unless told to
with ``--build``, which builds the missing images first) and names them once.
"""

from __future__ import annotations

from collections.abc import Iterable

from runner.backends.docker import DockerBackend, build_command
from runner.backends.host import HostBackend
from runner.errors import BackendError, ConfigError, ImageError

BACKENDS = {"host": HostBackend, "docker": DockerBackend}
CHOICES = ("auto", *BACKENDS)

__all__ = ["BACKENDS", "CHOICES", "DockerBackend", "HostBackend", "prepare_stacks", "resolve",
           "route"]


def resolve(name: str, docker: DockerBackend | None = None) -> tuple[str, str | None]:
    """The backend a run uses for ``--backend name``, and a note when ``auto`` chose host.

    Raises ConfigError for an unknown name and BackendError for ``docker`` when no engine
    answers (nothing is run then).

    Example::

        >>> resolve("host")
        ('host', None)
    """
    if name not in CHOICES:
        raise ConfigError(f"--backend: unknown backend {name!r}; choose from "
                          f"{', '.join(CHOICES)}")
    if name == "host":
        return "host", None
    why = (docker or DockerBackend()).available()
    if name == "docker" and why:
        raise BackendError(f"--backend docker: {why}")
    if why:
        return "host", f"--backend auto: host, since {why}"
    return "docker", None


def route(stack_kind: str, backend: str, fallback: str | None = None,
          ) -> tuple[str | None, str | None]:
    """(backend name, None) for a cell of a ``stack_kind`` stack in a ``backend`` run,
    or (None, why it is skipped). ``fallback``: why ``--backend auto`` chose the host
    (:func:`resolve`'s note), which then heads the reason with what to do about it.

    Example::

        >>> route("docker", "host")[1]
        'stack kind docker runs only in a container: this run uses the host backend (--backend docker or auto with a Docker engine)'
    """  # noqa: E501
    if stack_kind == "host":
        return "host", None
    if backend == "docker":
        return "docker", None
    if fallback:
        return None, (f"stack kind {stack_kind} runs only in a container: {fallback}; start "
                      "a Docker engine (e.g. bash .ci/install-docker.sh, as root) and make "
                      "the base image once (nox -s base_image)")
    return None, (f"stack kind {stack_kind} runs only in a container: this run uses the "
                  "host backend (--backend docker or auto with a Docker engine)")


def prepare_stacks(matrix, cells: Iterable, backend: str, chosen: str, note: str | None,
                   docker: DockerBackend) -> dict[str, str]:
    """Which docker stacks of ``cells`` are skipped: named once, here, before any cell runs.

    ``backend``: the ``--backend`` asked for; ``chosen``, ``note``: :func:`resolve`'s
    answer; ``docker``: the run's backend (its ``build`` is ``--build``). Returns {stack:
    the reason each of its cells' reports gets}, and prints one line per shared reason
    (``[runner] skipped docker stack(s) a, b: ...``). A stack is skipped when the run uses the host
    backend (:func:`route`), or under ``auto`` when :meth:`DockerBackend.unready` names what
    it lacks: its image above all, never built without ``--build``; the line then gives the
    command that builds them all. With ``--build`` the images still missing are built here,
    before any cell runs (a failed build: the stack's cells end ``build_error``). Under
    ``--backend docker`` only a missing image stops the run, and before anything runs; the
    cells of a stack that lacks something else end ``build_error``.

    Raises:
        BackendError: ``--backend docker`` without ``--build`` and a stack has no image,
            e.g. ``--backend docker: no image for docker stacks a, b (the matrix never
            builds one): `nox -s build -- --stack a --stack b`, or add --build``.
    """
    skips: dict[str, str] = {}
    unbuilt: dict[str | None, list[str]] = {}
    stacks = dict.fromkeys(c.stack for c in cells if matrix.stacks[c.stack].kind == "docker")
    for stack in stacks:
        name, why = route("docker", chosen, note)
        if name is None:
            skips[stack] = why
            continue
        unready = docker.unready(matrix, stack)
        if unready is not None and unready.unbuilt:
            unbuilt.setdefault(unready.base, []).append(stack)
            skips[stack] = unready.reason
        elif unready is not None and backend == "auto":
            skips[stack] = unready.reason
    if unbuilt and backend == "docker":
        names = [s for group in unbuilt.values() for s in group]
        bases = "; ".join(f"first, their {base}" for base in unbuilt if base)
        raise BackendError(f"--backend docker: no image for docker stack(s) {', '.join(names)} "
                           f"(the matrix never builds one): `{build_command(names)}`, or add "
                           "--build" + (f"; {bases}" if bases else ""))
    lines = [f"skipped docker stack(s) {', '.join(group)}: no image, and the matrix never "
             f"builds one: `{build_command(group)}`, or add --build"
             + (f"; first, their {base}" if base else "") for base, group in unbuilt.items()]
    by_reason: dict[str, list[str]] = {}
    for stack, reason in skips.items():
        if not any(stack in group for group in unbuilt.values()):
            by_reason.setdefault(reason, []).append(stack)
    lines += [f"skipped docker stack(s) {', '.join(group)}: {reason}"
              for reason, group in by_reason.items()]
    for line in lines:
        print(f"[runner] {line}", flush=True)
    if docker.build and chosen == "docker":
        for stack in stacks:
            if stack not in skips and docker.unready(matrix, stack) is None:
                try:
                    docker.ensure_image(docker.spec(matrix, stack))
                except ImageError:
                    pass  # not renderable: the cells say so (build_error)
    return skips
