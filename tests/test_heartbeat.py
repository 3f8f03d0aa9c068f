"""runner/cell/heartbeat.py: a line while a stretch runs, none once it has ended."""

from __future__ import annotations

import time

from gate_residual_matrix.runner.cell.heartbeat import Heartbeat


def test_a_long_stretch_says_what_it_is_doing_and_a_short_one_says_nothing():
    lines: list[str] = []
    with Heartbeat("op case 257", every=0.05, say=lines.append) as beat:
        beat.doing = "compiled"
        time.sleep(0.3)
    assert lines and all(line.startswith("[cell] op case 257: compiled, ") for line in lines)
    said = len(lines)
    time.sleep(0.15)
    assert len(lines) == said  # stopped with the block
    quiet: list[str] = []
    with Heartbeat("op case 1", every=5.0, say=quiet.append):
        pass
    assert quiet == []


def test_silence_is_counted_from_the_last_line_of_any_stage():
    """Other lines of the cell (precompile, case progress) push the next beat back, and a
    stretch that starts late in a silence speaks when the silence reaches ``every``, not
    ``every`` after its own start."""
    from gate_residual_matrix.runner.cell.heartbeat import said

    lines: list[str] = []
    with Heartbeat("busy", every=1.0, say=lines.append):
        for _ in range(15):  # a line of another stage every 0.1 s: never silent for 1 s
            said()
            time.sleep(0.1)
    assert lines == []
    said()
    time.sleep(0.8)  # the previous stage went quiet 0.8 s ago
    started = time.perf_counter()
    first: list[float] = []
    with Heartbeat("next", every=1.0, say=lambda line: first.append(time.perf_counter())):
        time.sleep(0.9)
    assert first and first[0] - started < 0.8, first  # about 0.2 s in, not 1 s
