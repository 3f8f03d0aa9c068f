"""Backends run one cell somewhere and return its report: ``available()``, ``run(...)``.

Listed in :data:`BACKENDS`. Every subprocess call lives in :mod:`runner.backends.host`
(every docker-py call will live in ``runner.backends.docker``).
"""

from __future__ import annotations

from runner.backends.host import HostBackend

BACKENDS = {"host": HostBackend}

__all__ = ["BACKENDS", "HostBackend"]
