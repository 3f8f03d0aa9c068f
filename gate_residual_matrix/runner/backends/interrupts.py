"""Hold SIGINT and SIGTERM while a backend starts a cell, so that none is left running unseen.

Between "ask the OS for a process (or the engine for a container)" and "have its id in
hand" an interruption would leave a cell nobody knows to kill. :func:`deferred` records the
signals that arrive in that window and delivers the first one, through the handler that was
in place, once the window is closed (the caller's ``try``/``finally`` then owns the cell).

Only signals whose handler is a Python callable are held (the command line installs
:func:`runner.__main__` handlers that raise :class:`runner.errors.Interrupted`; Python's own
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

__all__ = ["HELD", "deferred"]

HELD = (signal.SIGINT, signal.SIGTERM)
"""The signals :func:`deferred` holds."""


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
