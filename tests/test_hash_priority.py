"""A cell's hashing threads run at a lower CPU priority than its main thread."""

from __future__ import annotations

import concurrent.futures as futures
import os
import sys
import threading

import pytest

from gate_residual_matrix.runner.cell.run import HASH_NICE, hash_in_background


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_hashing_threads_are_niced_and_the_main_thread_is_not():
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def niceness():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with futures.ThreadPoolExecutor(max_workers=2, initializer=hash_in_background) as pool:
        got = {pool.submit(niceness).result() for _ in range(4)}
    assert got == {max(main_before, min(19, HASH_NICE + main_before))} or \
        got == {max(main_before, HASH_NICE)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before
