"""Connecting to a Ray cluster for ``--cluster ADDRESS``: :func:`connect`.

The address is ``ray://HOST:PORT`` (Ray Client: the driver anywhere), ``HOST:PORT`` (the
driver on a node) or ``auto`` (``RAY_ADDRESS``), HOST a name, an IPv4 address or an IPv6
address in brackets: :func:`parse_address` refuses anything else in one line. Ray is the
optional extra ``.[ray]``; without it ``--cluster`` is a :class:`ConfigError` (exit 2) that
gives :data:`INSTALL`. Before Ray is asked, a TCP connection to HOST:PORT must open within
:data:`PROBE_TIMEOUT_S` (a dead address is one line, exit 4, in seconds: Ray's own retries
took about 100 s); Ray Client's own waits are bounded by :data:`CLIENT_TIMEOUT_S`; Ray's
warnings and log lines during the connect are kept out of the terminal. SIGINT and SIGTERM
during the connect end the run with 130 and 143 and one line, like everywhere else (the
command line's handlers survive ``ray.init``). What runs the cells once connected:
:class:`runner.backends.ray.cluster.Cluster`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from gate_residual_matrix import settings
from gate_residual_matrix.runner.backends.ray.cluster import Cluster, _first_line
from gate_residual_matrix.runner.errors import BackendError, ConfigError, Interrupted

__all__ = ["CLIENT_TIMEOUT_S", "DEFAULT_RETRIES", "INSTALL", "PROBE_TIMEOUT_S", "connect",
           "parse_address", "probe"]

INSTALL = "pip install -e '.[ray]'"
"""How to get Ray into this project's environment (the ``ray`` extra of pyproject.toml)."""
DEFAULT_RETRIES = 2
CONNECT_TRIES = 3
"""Tries to connect through Ray Client: its proxy starts a server per driver, and when that
fails (seen under load, with a driver that reconnects at once) the next try usually works."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The command line's handlers (runner.__main__), which ``ray.init`` would replace."""
PROBE_TIMEOUT_S = 5.0
"""Seconds a TCP connection to the cluster's address may take to open before Ray is asked."""
CLIENT_TIMEOUT_S = settings.SETTINGS["RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S"].default
"""Ray Client's wait for its server per try, and between tries (its defaults: 5 s growing to
30 s, which with its retries and ours made a dead address take about 100 s)."""
_ADDRESS_RE = re.compile(r"(?:ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)"
                         r":(?P<port>[0-9]{1,5})")


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
    given = value
    if value == "auto":
        value = (settings.raw("RAY_ADDRESS", environ) or "").strip()
        if not value:
            raise ConfigError("--cluster auto: RAY_ADDRESS is not set; set it or give "
                              "--cluster ray://HOST:PORT")
    found = _ADDRESS_RE.fullmatch(value)
    ok = found is not None and 0 < int(found["port"]) < 65536 and len(found["host"]) <= 253
    if ok and found["host"].startswith("["):
        try:
            ipaddress.IPv6Address(found["host"][1:-1])
        except ValueError:
            ok = False
    if not ok:
        where = f" (from RAY_ADDRESS, for {given})" if given == "auto" else ""
        raise ConfigError(f"--cluster: expected ray://HOST:PORT, HOST:PORT or auto (HOST a "
                          f"name, an IPv4 address or [an IPv6 address]), got {value!r}{where}")
    return value


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Open and close a TCP connection to ``address``'s HOST:PORT (a parsed address); for a
    GCS address (no ``ray://``), also a gRPC (HTTP/2) handshake: Ray's own GCS client waits
    in C++, where no signal is handled, for minutes on a port where no gRPC server answers.

    Raises:
        BackendError: nothing accepts a connection there within ``timeout_s`` seconds (the
            name does not resolve, the connection is refused or times out), or no gRPC
            server answers a GCS address within ``timeout_s`` seconds.
    """
    found = _ADDRESS_RE.fullmatch(address)
    if found is None:  # pragma: no cover - parse_address made it
        raise ConfigError(f"--cluster: cannot parse {address!r}")
    host, port = found["host"].strip("[]"), int(found["port"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise BackendError(f"--cluster {address}: cannot connect: {why} at {found['host']}:"
                           f"{port} within {timeout_s:g} s (is the cluster up, and the port "
                           "its Ray Client or GCS port?)") from err
    if address.startswith("ray://"):
        return  # Ray Client's own handshake is bounded (CLIENT_TIMEOUT_S)
    import grpc  # a dependency of Ray

    channel = grpc.insecure_channel(f"{found['host']}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError as err:
        raise BackendError(f"--cluster {address}: cannot connect: no gRPC server (Ray's GCS) "
                           f"answers at {found['host']}:{port} within {timeout_s:g} s") from err
    finally:
        channel.close()


@contextlib.contextmanager
def _stderr_aside() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the block: Ray's C++ core logs its retries
    there, line after line, beside the one-line error (a no-op where fd 2 cannot be
    duplicated)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray's Python warnings and log lines below ERROR kept out of the terminal for the
    block (they repeat, in many lines, what the one-line error says)."""
    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    ray_logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        ray_logger.setLevel(level)


def _ray() -> ModuleType:
    """The ``ray`` module, or a ConfigError with the install command. Ray Client's waits
    are bounded by :data:`CLIENT_TIMEOUT_S` (read when Ray Client is imported) unless the
    environment sets them."""
    for name in ("RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S",
                 "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S"):
        settings.setdefault(name)
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
        BackendError: the cluster does not answer (nothing is run or written); nothing
            accepts a TCP connection at its address within :data:`PROBE_TIMEOUT_S`.
        Interrupted: SIGINT or SIGTERM while connecting (Ray's own SIGTERM handler, which
            exits with code 15, is turned back into the command line's).
    """
    address = parse_address(address)
    if gpu_model is not None and not gpu_model.strip():
        raise ConfigError("--gpu-model: expected a GPU name like 'NVIDIA H200', got ''")
    if retries < 0:
        raise ConfigError(f"--retries: expected a number >= 0, got {retries}")
    ray = _ray()
    probe(address)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS} if main else {}
    quiet = logging.getLogger("ray._private.worker")
    quiet.addFilter(_no_sigterm_note)
    try:
        for attempt in range(CONNECT_TRIES):
            try:
                with _quiet_ray(), _stderr_aside():
                    ray.init(address=address, log_to_driver=False, logging_level=(
                        logging.ERROR if address.startswith("ray://") else logging.WARNING))
                break
            except SystemExit as err:  # Ray's SIGTERM handler (sys.exit(15)) fired in init
                if err.code == signal.SIGTERM:
                    raise Interrupted(signal.SIGTERM) from None
                raise
            except ConnectionError as err:  # Ray Client: its server side failed to start
                if (attempt + 1 == CONNECT_TRIES or not address.startswith("ray://")
                        or "timeout" in str(err)):  # no server answered: bounded once
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
