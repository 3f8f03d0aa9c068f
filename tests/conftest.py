"""Shared fixtures: fresh random inputs (new seed each run, printed on failure).

torch is imported where a fixture or helper needs it, not here: the config, report and table
tests run without it (tests/test_ops.py checks those modules import without torch).
"""

from __future__ import annotations

import os
import secrets

import pytest

# Cells in tests compile a handful of graphs: compile worker processes (one per CPU on a
# 2-CPU machine, runner/cell/precompile.py) would cost more than they save. Tests of the pool set
# the variable themselves; cells started as subprocesses inherit it.
os.environ.setdefault("GATE_RESIDUAL_PRECOMPILE", "0")

DTYPES = ("bfloat16", "float16", "float32")
INDEX_DTYPES = ("int64", "int32")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped where torch sees no CUDA device (CI); on a GPU host the
    ``tests`` step of ``gpu-host`` runs them."""
    if not any("gpu" in item.keywords for item in items) or _cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA device: on a GPU host, python -m "
                                   "gate_residual_matrix gpu-host --steps tests")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh_seed(request):
    """A new seed per test run (``GATE_RESIDUAL_TEST_SEED`` pins one), shown in the test id log."""
    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(32)))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return seed


def inputs(n, d, g, dtype, index_dtype, seed, specials=True):
    """Inputs for one test case, with special values planted by default."""
    from gate_residual_matrix.ops.gate_residual.inputs import make_inputs

    return make_inputs(n=n, d=d, g=g, dtype=dtype, index_dtype=index_dtype, seed=seed,
                       specials=specials).tensors


def assert_bitwise(a, b, what: str, nan_payload_ok: bool = False):
    """Assert equal bits of two tensors; with ``nan_payload_ok``, NaN on both sides may differ
    in payload."""
    import torch

    int_view = {torch.bfloat16: torch.int16, torch.float16: torch.int16,
                torch.float32: torch.int32}
    assert a.shape == b.shape and a.dtype == b.dtype, what
    ia, ib = a.view(int_view[a.dtype]), b.view(int_view[b.dtype])
    differ = ia != ib
    if nan_payload_ok:
        differ &= ~(torch.isnan(a) & torch.isnan(b))
    n = int(differ.sum())
    if n:
        where = torch.nonzero(differ)[0].tolist()
        raise AssertionError(f"{what}: {n} of {a.numel()} elements differ in bits; first at "
                             f"{where}: {a[tuple(where)].item()!r} vs {b[tuple(where)].item()!r}")
