"""Runs indexed_scale_shift's numba.cuda kernels under the CUDA simulator; used by
tests/test_simulator.py.

Invoked as ``NUMBA_ENABLE_CUDASIM=1 python tests/scale_shift_sim_worker.py OUT.npz SEED`` (the
variable must be set before numba is imported, hence a separate process). For each case it
saves the inputs' bits and the kernels' outputs for each launch configuration.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_shift_cases import make_case, storage

from gate_residual_matrix.kernels import indexed_scale_shift as K
from gate_residual_matrix.kernels.rounding import CODECS, SIMULATOR

CASES = [  # (n, d, g, dtype, index_dtype, kind)
    (1, 3, 1, "bfloat16", "int64", "normal"),
    (K.CHUNK_ROWS + 3, 13, 5, "bfloat16", "int32", "bits"),
    (K.CHUNK_ROWS + 3, 13, 5, "float16", "int64", "bits"),
    (K.CHUNK_ROWS + 3, 13, 5, "float32", "int64", "normal"),
    (0, 4, 2, "float32", "int64", "normal"),
    (9, 0, 2, "float16", "int32", "normal"),
    (K.CHUNK_ROWS + 3, 3, 200, "bfloat16", "int64", "normal"),  # 2G = 400: global sums
]
LAUNCHES = [dict(block_cols=128, max_grid_y=65535), dict(block_cols=32, max_grid_y=2)]
OUTPUTS = ("out", "grad_x", "grad_scale", "grad_shift")


def main(out_path: str, seed: int) -> None:
    assert SIMULATOR, "set NUMBA_ENABLE_CUDASIM=1"
    saved = {}
    for c, (n, d, g, dtype, index_dtype, kind) in enumerate(CASES):
        x = make_case(n, d, g, dtype, index_dtype, seed + c, specials=True, kind=kind)
        a = {k: storage(v) for k, v in x.items()}
        for name, arr in a.items():
            saved[f"{c}/in/{name}"] = arr
        npdt = CODECS[dtype][2]
        poison = 0x5A5A if npdt == np.int16 else 7
        for li, launch in enumerate(LAUNCHES):
            out, grad_x = (np.full((n, d), poison, dtype=npdt) for _ in range(2))
            grad_scale, grad_shift = (np.full((g, d), poison, dtype=npdt) for _ in range(2))
            partial = np.full((K.n_chunks(n), 2 * g, d), np.nan, dtype=np.float32)
            K.launch_forward(out, a["x"], a["scale"], a["shift"], a["index"], dtype, **launch)
            K.launch_backward(grad_x, grad_scale, grad_shift, partial, a["grad_out"], a["x"],
                              a["scale"], a["index"], dtype, **launch)
            for name, arr in zip(OUTPUTS, (out, grad_x, grad_scale, grad_shift), strict=True):
                saved[f"{c}/{li}/{name}"] = arr
    np.savez(out_path, **saved)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
