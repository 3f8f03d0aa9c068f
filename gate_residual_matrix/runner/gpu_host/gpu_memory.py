"""The most GPU memory in use while a block runs, as ``nvidia-smi`` reports it (every process
on the GPU, MiB; on a host of several GPUs, the fullest one's), sampled every
:data:`MEMORY_EVERY_S` seconds in a daemon thread and once more at the end. The ``modes``
step records it in its timeline: several cells at once share one GPU's memory.

Example::

    with PeakMemory() as memory:
        run_the_cells()
    memory.peak   # MiB, or None without nvidia-smi or a reading
"""

from __future__ import annotations

import shutil
import subprocess
import threading

MEMORY_EVERY_S = 2.0


class PeakMemory:
    """The most GPU memory in use (MiB, all processes) while it runs: ``nvidia-smi`` every
    :data:`MEMORY_EVERY_S`; ``peak`` stays None without ``nvidia-smi`` or a reading."""

    def __init__(self) -> None:
        self.peak: int | None = None
        self._done = threading.Event()
        self._tool = shutil.which("nvidia-smi")
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self._tool:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _watch(self) -> None:
        while True:
            stop = self._done.wait(MEMORY_EVERY_S)
            readings = per_gpu_mib("memory.used", self._tool)
            used = max(readings) if readings else None
            if used is not None:
                self.peak = used if self.peak is None else max(self.peak, used)
            if stop:
                return


def per_gpu_mib(field: str, tool: str | None = None) -> list[int] | None:
    """``nvidia-smi``'s ``field`` (``memory.used``, ``memory.total``: MiB) of every GPU, or
    None without ``nvidia-smi`` or a reading. ``tool``: its path, when already looked up."""
    tool = tool or shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        text = subprocess.run([tool, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout
        return [int(v) for v in text.split()] or None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
