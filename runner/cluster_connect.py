"""Connecting to a Ray cluster for ``--cluster ADDRESS`` (issue 17): :func:`connect`.

The address is ``ray://HOST:PORT`` (Ray Client: the driver anywhere), ``HOST:PORT`` (the
driver on a node) or ``auto`` (``RAY_ADDRESS``): :func:`parse_address`. Ray is the optional
extra ``.[ray]``; without it ``--cluster`` is a :class:`ConfigError` (exit 2) that gives
:data:`INSTALL`; a cluster that does not answer is a :class:`BackendError` (exit 4). The
command line's signal handlers survive ``ray.init``. What runs the cells once connected:
:class:`runner.cluster.Cluster`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType

from runner.cluster import Cluster, _first_line
from runner.errors import BackendError, ConfigError

__all__ = ["DEFAULT_RETRIES", "INSTALL", "connect", "parse_address"]

INSTALL = "pip install -e '.[ray]'"
"""How to get Ray into this project's environment (the ``ray`` extra of pyproject.toml)."""
DEFAULT_RETRIES = 2
CONNECT_TRIES = 3
"""Tries to connect through Ray Client: its proxy starts a server per driver, and when that
fails (seen under load, with a driver that reconnects at once) the next try usually works."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The command line's handlers (runner.__main__), which ``ray.init`` would replace."""


def parse_address(value: str, environ: dict | None = None) -> str:
    """The Ray address of ``--cluster value``: ``ray://HOST:PORT`` (Ray Client, the driver
    anywhere), ``HOST:PORT`` (the driver on a node of the cluster) or ``auto`` (the value
    of ``RAY_ADDRESS``, in either form).

    Raises:
        ConfigError: e.g. ``--cluster: expected ray://HOST:PORT, HOST:PORT or auto, got
            'http://x'``, or ``auto`` without ``RAY_ADDRESS``.

    Example::

        >>> parse_address("auto", {"RAY_ADDRESS": "ray://10.0.0.1:10001"})
        'ray://10.0.0.1:10001'
    """
    env = os.environ if environ is None else environ
    given = value
    if value == "auto":
        value = env.get("RAY_ADDRESS", "").strip()
        if not value:
            raise ConfigError("--cluster auto: RAY_ADDRESS is not set; set it or give "
                              "--cluster ray://HOST:PORT")
    rest = value[len("ray://"):] if value.startswith("ray://") else value
    host, _, port = rest.rpartition(":")
    if not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        where = f" (from RAY_ADDRESS, for {given})" if given == "auto" else ""
        raise ConfigError(f"--cluster: expected ray://HOST:PORT, HOST:PORT or auto, got "
                          f"{value!r}{where}")
    return value


def _ray() -> ModuleType:
    """The ``ray`` module, or a ConfigError with the install command."""
    try:
        import ray
    except ImportError as err:
        raise ConfigError(f"--cluster: Ray is not installed ({err.msg}): {INSTALL}") from err
    return ray


def _no_sigterm_note(record: logging.LogRecord) -> bool:
    """Drop Ray's "SIGTERM handler is not set" (Ray Client's server connects in a thread of
    its own, and at level WARNING streams that line back; the command line's handlers are
    kept anyway, see :data:`_SIGNALS`)."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


def connect(address: str, *, gpu_model: str | None = None, retries: int = DEFAULT_RETRIES,
            build: bool = False, matrix_dir: Path = Path(".")) -> Cluster:
    """Connect to the Ray cluster at ``address`` (:func:`parse_address`'s forms).

    Raises:
        ConfigError: a malformed address, a negative ``retries``, an empty ``gpu_model``,
            or Ray not installed (the message gives :data:`INSTALL`).
        BackendError: the cluster does not answer (nothing is run or written).
    """
    address = parse_address(address)
    if gpu_model is not None and not gpu_model.strip():
        raise ConfigError("--gpu-model: expected a GPU name like 'NVIDIA H200', got ''")
    if retries < 0:
        raise ConfigError(f"--retries: expected a number >= 0, got {retries}")
    ray = _ray()
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS} if main else {}
    quiet = logging.getLogger("ray._private.worker")
    quiet.addFilter(_no_sigterm_note)
    try:
        for attempt in range(CONNECT_TRIES):
            try:
                ray.init(address=address, log_to_driver=False, logging_level=(
                    logging.ERROR if address.startswith("ray://") else logging.WARNING))
                break
            except ConnectionError as err:  # Ray Client: its server side failed to start
                if attempt + 1 == CONNECT_TRIES or not address.startswith("ray://"):
                    raise BackendError(f"--cluster {address}: cannot connect: "
                                       f"{_first_line(err)}") from err
                time.sleep(2.0)
            except Exception as err:
                raise BackendError(f"--cluster {address}: cannot connect: "
                                   f"{_first_line(err)}") from err
    finally:
        quiet.removeFilter(_no_sigterm_note)
        for sig, handler in handlers.items():  # ray.init sets its own SIGTERM handler
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return Cluster(ray, address, gpu_model=gpu_model, retries=retries, build=build,
                   matrix_dir=matrix_dir)
