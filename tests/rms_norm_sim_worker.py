"""Runs the RMSNorm numba.cuda kernels under the CUDA simulator; used by
tests/test_simulator.py.

Invoked as ``NUMBA_ENABLE_CUDASIM=1 python tests/rms_norm_sim_worker.py OUT.npz SEED`` (the
variable must be set before numba is imported, hence a separate process). For each case it
saves the inputs' bits and the kernels' outputs for two launch grids (one block per row or
chunk, and one block walking every row or chunk).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).parent)]

from gate_residual_matrix.kernels.rms_norm_backward import backward_kernel, n_chunks, reduce_kernel  # noqa: E402
from gate_residual_matrix.kernels.rms_norm_forward import ITEMSIZE, forward_kernel, layout_for  # noqa: E402
from gate_residual_matrix.kernels.rms_norm_order import omni_layout  # noqa: E402
from gate_residual_matrix.kernels.rms_norm_ptx import SIMULATOR  # noqa: E402
from gate_residual_matrix.kernels.rms_norm_rows import vector_mode  # noqa: E402

G = 3
# (op, N, D, dtype): vector loads where D allows (the vLLM layout from D * itemsize % 16 == 0;
# vllm-omni's from D > 1024), element loads otherwise. Several chunks are the CPU and GPU
# tests' business: the simulator runs every thread in Python.
CASES = [
    ("rms_norm", 3, 64, "bfloat16"),
    ("rms_norm", 2, 24, "float32"),
    ("rms_norm", 3, 37, "float16"),
    ("rms_norm", 4, 1040, "bfloat16"),  # backward: vector loads, the next row prefetched
    ("add_rms_norm", 3, 1040, "float16"),
    ("add_rms_norm", 2, 13, "float32"),
    ("rms_norm_scale_shift", 3, 48, "bfloat16"),
    ("rms_norm_scale_shift", 2, 1040, "bfloat16"),
    ("rms_norm_scale_shift", 4, 20, "float32"),
]
STORAGE = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}


def storage_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> storage bits, nearest even (what the tests' inputs hold)."""
    import rms_norm_oracle as O

    return O.storage_bits(values.astype(np.float32), dtype)


def arrays(bits: np.ndarray, dtype: str, vector: bool) -> np.ndarray:
    """Kernel array of storage bits (rows, D): uint32 words or elements."""
    bits = np.ascontiguousarray(bits.reshape(-1, bits.shape[-1]))
    if vector:
        return bits.view(np.uint32).copy()
    return bits.view({"bfloat16": np.int16, "float16": np.float16,
                      "float32": np.float32}[dtype]).copy()


def back(arr: np.ndarray, dtype: str, d: int) -> np.ndarray:
    return np.ascontiguousarray(arr).view(STORAGE[dtype]).reshape(-1, d)


def make_inputs(n: int, d: int, dtype: str, rng) -> dict:
    x = rng.standard_normal((n, d)).astype(np.float32)
    if n > 1:
        x[1, d // 2] = np.nan
    return {
        "x": storage_bits(x, dtype),
        "residual": storage_bits(rng.standard_normal((n, d)), dtype),
        "weight": storage_bits(rng.standard_normal((1, d)), dtype),
        "scale": storage_bits(0.5 * rng.standard_normal((G, d)), dtype),
        "shift": storage_bits(rng.standard_normal((G, d)), dtype),
        "grad_out": storage_bits(rng.standard_normal((n, d)), dtype),
        "grad_h": storage_bits(rng.standard_normal((n, d)), dtype),
        "index": rng.integers(0, G, n).astype(np.int64),
    }


def run_case(op: str, n: int, d: int, dtype: str, ins: dict, grid_rows: int) -> dict:
    itemsize = ITEMSIZE[dtype]
    layout = layout_for(op, d, dtype)
    vec = vector_mode(layout, itemsize)
    a = {k: arrays(v, dtype, vec) for k, v in ins.items() if k != "index"}
    out = np.zeros_like(a["x"])
    kernel = forward_kernel(op, d, dtype, 1e-6, vec)
    grid = min(n, grid_rows)
    result = {}
    if op == "rms_norm":
        kernel[grid, layout.threads](out, a["x"], a["weight"])
    elif op == "add_rms_norm":
        h = np.zeros_like(out)
        kernel[grid, layout.threads](out, h, a["x"], a["residual"], a["weight"])
        result["h"] = back(h, dtype, d)
    else:
        flag = np.ones(1, np.uint8)
        kernel[grid, layout.threads](out, a["x"], a["weight"], a["scale"], a["shift"],
                                     ins["index"], flag)
    result["out"] = back(out, dtype, d)

    blay = omni_layout(d, itemsize)
    bvec = vector_mode(blay, itemsize)
    b = {k: arrays(v, dtype, bvec) for k, v in ins.items() if k != "index"}
    n_params = 1 + (2 * G if op == "rms_norm_scale_shift" else 0)
    chunks = n_chunks(op, n)
    partial = np.zeros((chunks, n_params, d), np.float32)
    grad_x = np.zeros_like(b["x"])
    kernel = backward_kernel(op, d, dtype, 1e-6, bvec)
    grid = min(chunks, grid_rows)
    if op == "rms_norm":
        kernel[grid, blay.threads](grad_x, partial, b["grad_out"], b["x"], b["weight"])
    elif op == "add_rms_norm":
        h_bits = result["h"]  # the forward's h, as the autograd Function saves it
        kernel[grid, blay.threads](grad_x, partial, b["grad_out"], b["grad_h"],
                                   arrays(h_bits, dtype, bvec), b["weight"])
    else:
        kernel[grid, blay.threads](grad_x, partial, b["grad_out"], b["x"], b["weight"],
                                   b["scale"], ins["index"], np.ones(1, np.uint8))
    params = arrays(np.zeros((n_params, d), STORAGE[dtype]), dtype, False)
    reduce_kernel(dtype)[-(-n_params * d // 256), 256](params, partial)
    result["grad_x"] = back(grad_x, dtype, d)
    result["params"] = back(params, dtype, d)
    return result


def main() -> None:
    assert SIMULATOR, "run with NUMBA_ENABLE_CUDASIM=1"
    out, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    saved = {}
    for c, (op, n, d, dtype) in enumerate(CASES):
        t0 = time.time()
        ins = make_inputs(n, d, dtype, rng)
        for k, v in ins.items():
            saved[f"{c}/in/{k}"] = v
        for launch, grid_rows in enumerate((1 << 20, 1)):
            for k, v in run_case(op, n, d, dtype, ins, grid_rows).items():
                saved[f"{c}/{launch}/{k}"] = v
        print(f"{op} {n}x{d} {dtype}: {time.time() - t0:.1f} s", flush=True)
    np.savez(out, **saved)


if __name__ == "__main__":
    main()
