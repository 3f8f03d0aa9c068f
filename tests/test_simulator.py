"""The numba.cuda kernels' code path under the CUDA simulator, against the CPU path.

The simulator runs the kernels' Python source thread by thread with numpy stand-ins for the
rounding intrinsics (kernels/rounding.py): it checks indexing, the chunked summation order
and that two launch configurations give the same bits. The CPU path must match it bit for
bit, NaN encodings included (both canonicalise NaN as the GPU does).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_bitwise

from gate_residual_matrix.kernels.gate_residual_cpu import (
    gate_residual_backward_cpu,
    gate_residual_cpu,
)

WORKER = Path(__file__).with_name("sim_worker.py")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    import secrets

    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(32)))
    out = tmp_path_factory.mktemp("sim") / "sim.npz"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, str(WORKER), str(out), str(seed)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"simulator worker failed (seed {seed}):\n{done.stderr[-3000:]}"
    sys.path.insert(0, str(WORKER.parent))
    import sim_worker

    return sim_worker, dict(np.load(out)), seed


def _tensor(arr, dtype):
    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def test_simulator_matches_cpu_path_bit_for_bit(simulated):
    worker, saved, seed = simulated
    cases = worker.CASES
    assert any(len(worker.launches(c)) > 2 for c in range(len(cases))), "no vector-kernel case"
    for c, (_n, _d, _g, dtype, _ix) in enumerate(cases):
        x = {k: _tensor(saved[f"{c}/in/{k}"], dtype) for k in ("residual", "gate", "y",
                                                                 "grad_out")}
        index = torch.from_numpy(saved[f"{c}/in/index"])
        out = gate_residual_cpu(x["residual"], x["gate"], x["y"], index)
        grad_y, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], index)
        for li in worker.launches(c):
            where = f"case {cases[c]} launch {li} seed {seed}"
            assert_bitwise(_tensor(saved[f"{c}/{li}/out"], dtype), out, f"out, {where}")
            assert_bitwise(_tensor(saved[f"{c}/{li}/grad_y"], dtype), grad_y, f"grad_y, {where}")
            assert_bitwise(_tensor(saved[f"{c}/{li}/grad_gate"], dtype), grad_gate,
                           f"grad_gate, {where}")


def test_fused_backward_leaves_its_tickets_at_zero(simulated):
    """backward_fused's last block per column block resets its ticket, so the next launch on
    the same tickets (the worker launches each fused case twice) starts from zero."""
    worker, saved, _ = simulated
    fused = [(c, li) for c in range(len(worker.CASES)) for li in worker.launches(c)
             if f"{c}/{li}/tickets" in saved
             and worker.VEC_LAUNCHES[li - len(worker.LAUNCHES)][1].get("fused")]
    assert any(worker.CASES[c][0] > 2 * worker.K.CHUNK_ROWS for c, _ in fused), "no tail case"
    for c, li in fused:
        assert not saved[f"{c}/{li}/tickets"].any(), f"tickets left set: case {worker.CASES[c]}"


def test_launch_configuration_does_not_move_bits(simulated):
    worker, saved, _ = simulated
    for c in range(len(worker.CASES)):
        for li in worker.launches(c)[1:]:
            for name in ("out", "grad_y", "grad_gate"):
                assert saved[f"{c}/0/{name}"].tobytes() == saved[f"{c}/{li}/{name}"].tobytes(), (
                    f"{name}: launch {li} of case {worker.CASES[c]}")
