"""A cell process hashes its outputs in as many threads as its share of the CPUs."""

from __future__ import annotations

import pytest

from gate_residual_matrix.runner.cell import environment


@pytest.mark.parametrize(("value", "cpus", "want"), [
    ("2", 16, 2),        # the GPU host's queue gives each cell process two
    ("64", 16, 8),       # never more than HASH_THREADS_MAX
    (None, 16, 8), (None, 3, 3), (None, None, 1),   # unset: the CPUs available
    ("0", 4, 4), ("two", 4, 4), ("", 4, 4),         # not a share: the CPUs available
])
def test_hash_threads_follow_the_process_share(monkeypatch, value, cpus, want):
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr(environment, "available_cpus", lambda: cpus)
    assert environment.hash_threads() == want
