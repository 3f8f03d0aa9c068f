"""indexed_scale_shift's numba.cuda kernels under the CUDA simulator, against the CPU twin.

The simulator runs the kernels' Python source thread by thread with numpy stand-ins for the
rounding intrinsics (kernels/rounding.py): it checks indexing, the chunked summation order
(shared and global accumulators) and that two launch configurations give the same bits. The
CPU twin must match it bit for bit, NaN encodings included (both canonicalise NaN as the GPU).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_bitwise
from scale_shift_cases import from_storage

from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
    indexed_scale_shift_backward_cpu,
    indexed_scale_shift_cpu,
)

WORKER = Path(__file__).with_name("scale_shift_sim_worker.py")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(31)))
    out = tmp_path_factory.mktemp("sim") / "sim.npz"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, str(WORKER), str(out), str(seed)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"simulator worker failed (seed {seed}):\n{done.stderr[-3000:]}"
    sys.path.insert(0, str(WORKER.parent))
    import scale_shift_sim_worker

    return scale_shift_sim_worker, dict(np.load(out)), seed


def test_simulator_matches_cpu_twin_bit_for_bit(simulated):
    worker, saved, seed = simulated
    for c, (_n, _d, _g, dtype, _ix, _kind) in enumerate(worker.CASES):
        x = {k: from_storage(saved[f"{c}/in/{k}"], dtype)
             for k in ("x", "scale", "shift", "grad_out")}
        index = from_storage(saved[f"{c}/in/index"], "int")
        cpu = (indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], index),
               *indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], index))
        for li in range(len(worker.LAUNCHES)):
            where = f"case {worker.CASES[c]} launch {li} seed {seed}"
            for name, want in zip(worker.OUTPUTS, cpu, strict=True):
                assert_bitwise(from_storage(saved[f"{c}/{li}/{name}"], dtype), want,
                               f"{name}, {where}")


def test_launch_configuration_does_not_move_bits(simulated):
    worker, saved, _ = simulated
    for c in range(len(worker.CASES)):
        for li in range(1, len(worker.LAUNCHES)):
            for name in worker.OUTPUTS:
                assert saved[f"{c}/0/{name}"].tobytes() == saved[f"{c}/{li}/{name}"].tobytes(), (
                    f"{name}: launch {li} of case {worker.CASES[c]}")


def test_cases_cover_both_accumulator_kernels(simulated):
    """The shared-memory kernel and the global one (2G beyond shared memory) both ran."""
    from gate_residual_matrix.kernels.geometry import shared_fits

    worker, _, _ = simulated
    fits = {shared_fits(2 * g) for n, d, g, *_ in worker.CASES if n and d}
    assert fits == {True, False}
