"""Every backend by name (:data:`BACKENDS`), which one a run uses (:func:`resolve`) and
which one runs a cell (:func:`route`)."""


from __future__ import annotations

from collections.abc import Callable

from gate_residual_matrix.runner.backends.base import Backend
from gate_residual_matrix.runner.backends.docker.cells import DockerBackend
from gate_residual_matrix.runner.backends.host import HostBackend
from gate_residual_matrix.runner.errors import BackendError, ConfigError

BACKENDS: dict[str, Callable[[], Backend]] = {"host": HostBackend, "docker": DockerBackend}
"""Every backend by name, made with its defaults (the pipeline makes the docker backend
with the run's options)."""
CHOICES = ("auto", *BACKENDS)


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
