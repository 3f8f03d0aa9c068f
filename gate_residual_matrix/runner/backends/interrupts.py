"""Hold SIGINT and SIGTERM while a backend starts a cell, so that none is left running unseen.

Between "ask the OS for a process (or the engine for a container)" and "have its id in
hand" an interruption would leave a cell nobody knows to kill. :func:`deferred` records the
signals that arrive in that window and delivers the first one, through the handler that was
in place, once the window is closed (the caller's ``try``/``finally`` then owns the cell).

Only signals whose handler is a Python callable are held (the command line installs, with
:func:`signals_interrupt`, handlers that raise :class:`runner.errors.Interrupted`; Python's own
Ctrl-C handler raises ``KeyboardInterrupt``); a default or ignored signal is left alone, and
outside the main thread this is a no-op.

Example::

    >>> with deferred():
    ...     proc = subprocess.Popen(argv, start_new_session=True)
    >>> # a SIGTERM that landed inside the block is raised here, proc is known
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from gate_residual_matrix.runner.errors import Interrupted

__all__ = ["HELD", "deferred", "fired", "signals_interrupt"]

HELD = (signal.SIGINT, signal.SIGTERM)
"""The signals :func:`deferred` holds."""

_FIRED: list[int] = []
"""The signal :func:`signals_interrupt` raised for in the block running now, if any."""


def fired() -> int | None:
    """The signal that has interrupted the :func:`signals_interrupt` block running now, or
    None. A wait loop around library code that may swallow the exception (a client's own
    ``except BaseException``) checks it and raises :class:`runner.errors.Interrupted` again:
    later signals are ignored, so a swallowed first one must not be lost."""
    return _FIRED[0] if _FIRED else None


@contextlib.contextmanager
def deferred(signals: tuple[int, ...] = HELD) -> Iterator[None]:
    """Record ``signals`` for the duration; then call the previous handler of the first one.

    The previous handlers are back in place before that call, so what it raises (for
    instance :class:`runner.errors.Interrupted`) goes to the caller as if the signal had
    come just after the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    held = {s: handler for s, handler in previous.items() if callable(handler)}
    caught: list[int] = []
    for s in held:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
    if caught:
        held[caught[0]](caught[0], None)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or SSH session) raise
    :class:`runner.errors.Interrupted` for the duration of the block (the first one only:
    later ones are ignored, so that the clean-up the first one started is not cut short;
    :func:`fired` says which one came);
    the handlers before it are put back after it. A signal the process was started with
    ignored stays ignored (``nohup``, ``&``); outside the main thread this is a no-op. The
    command line runs every command inside it (:func:`runner.__main__.main`).

    Example::

        >>> with signals_interrupt():  # doctest: +SKIP
        ...     run_matrix(Path("matrix.yaml"), reports_dir=Path("reports"))  # Ctrl-C: Interrupted
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _FIRED.clear()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if _FIRED:
            return
        _FIRED.append(signum)
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        _FIRED.clear()
