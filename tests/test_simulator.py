"""Every op's numba.cuda kernels under the CUDA simulator, against the op's CPU twin.

The simulator runs the kernels' Python source thread by thread, with stand-ins for the
rounding intrinsics (kernels/rounding.py) and the hardware approximations
(kernels/rms_norm_ptx.py): it checks the kernels' indexing, their summation order and that
two launch configurations give the same bits. The CPU twin must match it bit for bit, NaN
encodings included (both canonicalise NaN as the GPU does).

A worker per kernel family runs the kernels in a subprocess (``NUMBA_ENABLE_CUDASIM=1``
must be set before numba is imported) and saves the inputs' and outputs' bits:
tests/sim_worker.py (gate_residual), tests/scale_shift_sim_worker.py (indexed_scale_shift),
tests/rms_norm_sim_worker.py (the three RMSNorm ops). :data:`TWINS` says, per registered op,
which worker runs it, which of its cases are the op's and what the CPU twin gives for them;
each worker runs once per session.
"""

from __future__ import annotations

import importlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_bitwise

from gate_residual_matrix import ops
from gate_residual_matrix.kernels import rms_norm_cpu as R
from gate_residual_matrix.kernels.gate_residual_cpu import (
    gate_residual_backward_cpu,
    gate_residual_cpu,
)
from gate_residual_matrix.kernels.indexed_scale_shift_cpu import (
    indexed_scale_shift_backward_cpu,
    indexed_scale_shift_cpu,
)

HERE = Path(__file__).parent
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """The storage bits a worker saved (elements or unsigned bits) as a tensor of ``dtype``."""
    arr = np.ascontiguousarray(arr)
    ints = torch.from_numpy(arr.view({2: np.int16, 4: np.int32}[arr.itemsize]))
    return ints.view(TORCH[dtype])


# --------------------------------------------------------------- per op: cases and CPU twin


class GateResidual:
    worker = "sim_worker"

    @staticmethod
    def cases(w) -> list[int]:
        return list(range(len(w.CASES)))

    @staticmethod
    def launches(w, c: int) -> list[int]:
        return w.launches(c)

    @staticmethod
    def dtype(w, c: int) -> str:
        return w.CASES[c][3]

    @staticmethod
    def cpu(w, saved: dict, c: int) -> dict[str, torch.Tensor]:
        dtype = w.CASES[c][3]
        x = {k: tensor(saved[f"{c}/in/{k}"], dtype) for k in ("residual", "gate", "y",
                                                                "grad_out")}
        index = torch.from_numpy(saved[f"{c}/in/index"])
        grad_y, grad_gate = gate_residual_backward_cpu(x["grad_out"], x["gate"], x["y"], index)
        return {"out": gate_residual_cpu(x["residual"], x["gate"], x["y"], index),
                "grad_y": grad_y, "grad_gate": grad_gate}


class IndexedScaleShift:
    worker = "scale_shift_sim_worker"

    @staticmethod
    def cases(w) -> list[int]:
        return list(range(len(w.CASES)))

    @staticmethod
    def launches(w, c: int) -> list[int]:
        return list(range(len(w.LAUNCHES)))

    @staticmethod
    def dtype(w, c: int) -> str:
        return w.CASES[c][3]

    @staticmethod
    def cpu(w, saved: dict, c: int) -> dict[str, torch.Tensor]:
        dtype = w.CASES[c][3]
        x = {k: tensor(saved[f"{c}/in/{k}"], dtype) for k in ("x", "scale", "shift",
                                                                "grad_out")}
        index = torch.from_numpy(saved[f"{c}/in/index"])
        got = (indexed_scale_shift_cpu(x["x"], x["scale"], x["shift"], index),
               *indexed_scale_shift_backward_cpu(x["grad_out"], x["x"], x["scale"], index))
        return dict(zip(w.OUTPUTS, got, strict=True))


class RMSNormFamily:
    """One of the three RMSNorm ops: their worker runs all three (its cases name the op)."""

    worker = "rms_norm_sim_worker"

    def __init__(self, op: str) -> None:
        self.op = op

    def cases(self, w) -> list[int]:
        return [c for c, case in enumerate(w.CASES) if case[0] == self.op]

    @staticmethod
    def launches(w, c: int) -> list[int]:
        return [0, 1]  # one block per row or chunk; one block walking every row or chunk

    @staticmethod
    def dtype(w, c: int) -> str:
        return w.CASES[c][3]

    def cpu(self, w, saved: dict, c: int) -> dict[str, torch.Tensor]:
        dtype = w.CASES[c][3]
        ins = {k.split("/")[-1]: v for k, v in saved.items() if k.startswith(f"{c}/in/")}
        t = {k: (tensor(v, dtype) if k != "index" else torch.from_numpy(v))
             for k, v in ins.items()}
        wt = t["weight"][0]
        if self.op == "rms_norm":
            grad_x, grad_w = R.rms_norm_backward_cpu(t["grad_out"], t["x"], wt)
            return {"out": R.rms_norm_cpu(t["x"], wt), "grad_x": grad_x, "params": grad_w[None]}
        if self.op == "add_rms_norm":
            out, h = R.add_rms_norm_cpu(t["x"], t["residual"], wt)
            grad_x, grad_w = R.add_rms_norm_backward_cpu(t["grad_out"], t["grad_h"], h, wt)
            return {"out": out, "h": h, "grad_x": grad_x, "params": grad_w[None]}
        out = R.rms_norm_scale_shift_cpu(t["x"], wt, t["scale"], t["shift"], t["index"])
        grad_x, grad_w, grad_s, grad_h = R.rms_norm_scale_shift_backward_cpu(
            t["grad_out"], t["x"], wt, t["scale"], t["index"])
        return {"out": out, "grad_x": grad_x,
                "params": torch.cat([grad_w[None], grad_s, grad_h])}


TWINS = {"gate_residual": GateResidual(), "indexed_scale_shift": IndexedScaleShift(),
         "rms_norm": RMSNormFamily("rms_norm"), "add_rms_norm": RMSNormFamily("add_rms_norm"),
         "rms_norm_scale_shift": RMSNormFamily("rms_norm_scale_shift")}


@pytest.fixture(scope="session")
def simulate(tmp_path_factory):
    """``simulate(worker)`` -> (worker module, saved arrays, seed); each worker runs once."""
    runs: dict[str, tuple] = {}

    def run(worker: str) -> tuple:
        if worker not in runs:
            seed = int(os.environ.get("GATE_RESIDUAL_TEST_SEED", secrets.randbits(31)))
            out = tmp_path_factory.mktemp("sim") / f"{worker}.npz"
            env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
            done = subprocess.run([sys.executable, str(HERE / f"{worker}.py"), str(out),
                                   str(seed)], env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, (f"{worker} failed (seed {seed}):\n"
                                          f"{done.stderr[-3000:]}")
            sys.path.insert(0, str(HERE))
            runs[worker] = (importlib.import_module(worker), dict(np.load(out)), seed)
        return runs[worker]

    return run


def test_every_registered_op_runs_under_the_simulator():
    assert list(TWINS) == list(ops.OPS)


@pytest.mark.parametrize("op", TWINS)
def test_simulator_matches_cpu_twin_bit_for_bit(op, simulate):
    twin = TWINS[op]
    w, saved, seed = simulate(twin.worker)
    cases = twin.cases(w)
    assert cases, f"the worker has no {op} case"
    for c in cases:
        want = twin.cpu(w, saved, c)
        dtype = twin.dtype(w, c)
        for li in twin.launches(w, c):
            where = f"{op} case {w.CASES[c]} launch {li} seed {seed}"
            for name, t in want.items():
                assert_bitwise(tensor(saved[f"{c}/{li}/{name}"], dtype), t, f"{name}, {where}")


@pytest.mark.parametrize("op", TWINS)
def test_launch_configuration_does_not_move_bits(op, simulate):
    twin = TWINS[op]
    w, saved, _ = simulate(twin.worker)
    for c in twin.cases(w):
        names = [k.split("/")[-1] for k in saved if k.startswith(f"{c}/0/")]
        launches = twin.launches(w, c)
        assert names and len(launches) > 1, (op, c)
        for li in launches[1:]:
            for name in names:
                assert saved[f"{c}/0/{name}"].tobytes() == saved[f"{c}/{li}/{name}"].tobytes(), (
                    f"{op} {name}: launch {li} of case {w.CASES[c]}")


@pytest.mark.parametrize(("op", "rows_per_gate"), [("gate_residual", 1),
                                                   ("indexed_scale_shift", 2)])
def test_cases_cover_both_accumulator_kernels(op, rows_per_gate, simulate):
    """The shared-memory backward and the global one (G accumulator rows per gate row beyond
    shared memory) both ran."""
    from gate_residual_matrix.kernels.geometry import shared_fits

    w, _, _ = simulate(TWINS[op].worker)
    fits = {shared_fits(rows_per_gate * g) for n, d, g, *_ in w.CASES if n and d}
    assert fits == {True, False}


# ------------------------------------------------------------------ gate_residual only


def test_gate_residual_cases_run_the_vector_kernels(simulate):
    w, _, _ = simulate("sim_worker")
    assert any(len(w.launches(c)) > 2 for c in range(len(w.CASES))), "no vector-kernel case"


def test_gate_residual_fused_backward_leaves_its_tickets_at_zero(simulate):
    """backward_fused's last block per column block resets its ticket, so the next launch on
    the same tickets (the worker launches each fused case twice) starts from zero."""
    w, saved, _ = simulate("sim_worker")
    fused = [(c, li) for c in range(len(w.CASES)) for li in w.launches(c)
             if f"{c}/{li}/tickets" in saved
             and w.VEC_LAUNCHES[li - len(w.LAUNCHES)][1].get("fused")]
    assert any(w.CASES[c][0] > 2 * w.K.CHUNK_ROWS for c, _ in fused), "no tail case"
    for c, li in fused:
        assert not saved[f"{c}/{li}/tickets"].any(), f"tickets left set: case {w.CASES[c]}"


# --------------------------------------------------------------------- RMSNorm ops only


def test_rms_norm_cases_cover_both_load_paths(simulate):
    from gate_residual_matrix.kernels.rms_norm_backward import backward_layout
    from gate_residual_matrix.kernels.rms_norm_forward import ITEMSIZE, layout_for
    from gate_residual_matrix.kernels.rms_norm_rows import vector_mode

    w, _, _ = simulate("rms_norm_sim_worker")
    modes = {vector_mode(layout_for(op, d, dt), ITEMSIZE[dt]) for op, _, d, dt in w.CASES}
    assert modes == {True, False}
    prefetched = {op for op, _, d, dt in w.CASES if op != "rms_norm_scale_shift"
                  and ITEMSIZE[dt] == 2 and vector_mode(backward_layout(d, 2), 2)}
    assert prefetched == {"rms_norm", "add_rms_norm"}
