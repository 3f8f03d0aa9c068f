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
