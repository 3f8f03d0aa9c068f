"""The RMSNorm numba.cuda kernels' code path under the CUDA simulator, against the CPU twin.

The simulator runs the kernels' Python source thread by thread (tests/rms_norm_sim_worker.py),
with correctly rounded stand-ins for the hardware approximations (kernels/rms_norm_ptx.py)
and the warp shuffles exchanged through shared memory: it checks the kernels' indexing,
their summation order and that two launch grids give the same bits. The CPU twin must match
it bit for bit, forward and backward.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gate_residual_matrix.kernels import rms_norm_cpu as C

WORKER = Path(__file__).with_name("rms_norm_sim_worker.py")
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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
    import rms_norm_sim_worker

    return rms_norm_sim_worker, dict(np.load(out)), seed


def tensor(bits: np.ndarray, dtype: str) -> torch.Tensor:
    view = {"bfloat16": np.int16, "float16": np.float16, "float32": np.float32}[dtype]
    t = torch.from_numpy(np.ascontiguousarray(bits).view(view))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def bits(t: torch.Tensor) -> np.ndarray:
    unsigned = np.uint32 if t.element_size() == 4 else np.uint16
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16).numpy(
    ).view(unsigned)


def cpu_outputs(op: str, dtype: str, ins: dict) -> dict:
    t = {k: (tensor(v, dtype) if k != "index" else torch.from_numpy(v)) for k, v in ins.items()}
    w = t["weight"][0]
    if op == "rms_norm":
        grad_x, grad_w = C.rms_norm_backward_cpu(t["grad_out"], t["x"], w)
        return {"out": C.rms_norm_cpu(t["x"], w), "grad_x": grad_x, "params": grad_w[None]}
    if op == "add_rms_norm":
        out, h = C.add_rms_norm_cpu(t["x"], t["residual"], w)
        grad_x, grad_w = C.add_rms_norm_backward_cpu(t["grad_out"], t["grad_h"], h, w)
        return {"out": out, "h": h, "grad_x": grad_x, "params": grad_w[None]}
    out = C.rms_norm_scale_shift_cpu(t["x"], w, t["scale"], t["shift"], t["index"])
    grad_x, grad_w, grad_s, grad_h = C.rms_norm_scale_shift_backward_cpu(
        t["grad_out"], t["x"], w, t["scale"], t["index"])
    return {"out": out, "grad_x": grad_x, "params": torch.cat([grad_w[None], grad_s, grad_h])}


def test_simulator_matches_cpu_twin_bit_for_bit(simulated):
    worker, saved, seed = simulated
    for c, (op, _n, _d, dtype) in enumerate(worker.CASES):
        ins = {k.split("/")[-1]: v for k, v in saved.items() if k.startswith(f"{c}/in/")}
        want = cpu_outputs(op, dtype, ins)
        for launch in (0, 1):
            for name, t in want.items():
                got = saved[f"{c}/{launch}/{name}"]
                differ = int((got.ravel() != bits(t).ravel()).sum())
                assert differ == 0, (f"seed {seed}, case {c} ({op} {dtype}), launch {launch}, "
                                     f"{name}: {differ} elements differ")


def test_cases_cover_both_load_paths(simulated):
    worker, _, _ = simulated
    from gate_residual_matrix.kernels.rms_norm_backward import backward_layout
    from gate_residual_matrix.kernels.rms_norm_forward import ITEMSIZE, layout_for
    from gate_residual_matrix.kernels.rms_norm_rows import vector_mode

    modes = {vector_mode(layout_for(op, d, dt), ITEMSIZE[dt]) for op, _, d, dt in worker.CASES}
    assert modes == {True, False}
    prefetched = {op for op, _, d, dt in worker.CASES if op != "rms_norm_scale_shift"
                  and ITEMSIZE[dt] == 2 and vector_mode(backward_layout(d, 2), 2)}
    assert prefetched == {"rms_norm", "add_rms_norm"}
