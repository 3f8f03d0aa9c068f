"""Runs the numba.cuda kernels under the CUDA simulator; used by tests/test_simulator.py.

Invoked as ``NUMBA_ENABLE_CUDASIM=1 python tests/sim_worker.py OUT.npz SEED`` (the variable
must be set before numba is imported, hence a separate process). For each case it saves the
inputs' bits and the kernels' outputs for two different launch configurations.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_residual_matrix.kernels import gate_residual as K
from gate_residual_matrix.kernels.rounding import CODECS, SIMULATOR
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs

CASES = [  # (n, d, g, dtype, index_dtype): d * itemsize % 16 == 0 also runs the vector kernels
    (1, 3, 1, "bfloat16", "int64"),
    (K.CHUNK_ROWS + 3, 37, 5, "bfloat16", "int32"),
    (K.CHUNK_ROWS + 3, 37, 5, "float16", "int64"),
    (K.CHUNK_ROWS + 3, 37, 5, "float32", "int64"),
    (K.CHUNK_ROWS + 3, 24, 5, "bfloat16", "int64"),
    (K.CHUNK_ROWS + 3, 24, 5, "float16", "int32"),
    (K.CHUNK_ROWS + 3, 28, 3, "float32", "int64"),
    (0, 4, 2, "float32", "int64"),
    (K.CHUNK_ROWS + 3, 5, 400, "bfloat16", "int64"),  # G beyond shared memory: global sums
    (3 * K.CHUNK_ROWS + 5, 16, 3, "float32", "int32"),  # 4 chunks: the fused kernel's tail
    (2 * K.CHUNK_ROWS + 1, 8, 2, "bfloat16", "int64"),  # 3 chunks, one vector per row
]
LAUNCHES = [dict(block_cols=128, max_grid_y=65535), dict(block_cols=32, max_grid_y=2)]
VEC_LAUNCHES = [  # (forward launch, backward launch)
    (dict(block_cols=None, max_grid_y=65535), dict(block_cols=None)),
    (dict(block_cols=32, max_grid_y=3), dict(block_cols=32, max_grid_y=3)),
    (dict(block_cols=32, max_grid_y=2), dict(block_cols=32, max_grid_y=1)),
    # one launch (backward_fused): a block per chunk, then one block walking every chunk
    (dict(block_cols=None, max_grid_y=65535), dict(block_cols=None, fused=True)),
    (dict(block_cols=32, max_grid_y=3), dict(block_cols=32, max_grid_y=1, fused=True)),
]


def storage(t):
    """numpy array of the storage elements as the kernels take them (bfloat16 as int16)."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy()
    return t.numpy().copy()


def main(out_path: str, seed: int) -> None:
    assert SIMULATOR, "set NUMBA_ENABLE_CUDASIM=1"
    saved = {}
    for c, (n, d, g, dtype, index_dtype) in enumerate(CASES):
        x = make_inputs(n=n, d=d, g=g, dtype=dtype, index_dtype=index_dtype, seed=seed,
                        specials=True).tensors
        a = {k: storage(v) for k, v in x.items()}
        for name, arr in a.items():
            saved[f"{c}/in/{name}"] = arr
        npdt = CODECS[dtype][2]
        for li, launch in enumerate(LAUNCHES):
            out = np.full((n, d), 0x5A5A if npdt == np.int16 else 7, dtype=npdt)  # poisoned
            grad_y = np.full((n, d), 0x5A5A if npdt == np.int16 else 7, dtype=npdt)
            grad_gate = np.full((g, d), 0x5A5A if npdt == np.int16 else 7, dtype=npdt)
            partial = np.full((K.n_chunks(n), g, d), np.nan, dtype=np.float32)
            K.launch_forward(out, a["residual"], a["gate"], a["y"], a["index"], dtype, **launch)
            K.launch_backward(grad_y, grad_gate, partial, a["grad_out"], a["gate"], a["y"],
                              a["index"], dtype, **launch)
            saved[f"{c}/{li}/out"] = out
            saved[f"{c}/{li}/grad_y"] = grad_y
            saved[f"{c}/{li}/grad_gate"] = grad_gate
        if (d * np.dtype(npdt).itemsize) % 16 == 0:
            words = {k: v.view(np.uint32) for k, v in a.items() if k != "index"}
            for li, (fwd, bwd) in enumerate(VEC_LAUNCHES, start=len(LAUNCHES)):
                out = np.full((n, d), 7, dtype=npdt).view(np.uint32)  # poisoned
                grad_y = np.full((n, d), 7, dtype=npdt).view(np.uint32)
                grad_gate = np.full((g, d), 7, dtype=npdt)
                partial = np.full((K.n_chunks(n), g, d), np.nan, dtype=np.float32)
                K.launch_forward_vec(out, words["residual"], words["gate"], words["y"],
                                     a["index"], dtype, **fwd)
                tickets = np.zeros(64, dtype=np.uint32)
                for _ in range(2 if bwd.get("fused") else 1):  # tickets back to 0: reusable
                    K.launch_backward_vec(grad_y, grad_gate, partial, words["grad_out"],
                                          words["gate"], words["y"], a["index"], dtype,
                                          tickets=tickets, **bwd)
                saved[f"{c}/{li}/tickets"] = tickets
                saved[f"{c}/{li}/out"] = out.view(npdt)
                saved[f"{c}/{li}/grad_y"] = grad_y.view(npdt)
                saved[f"{c}/{li}/grad_gate"] = grad_gate
    np.savez(out_path, **saved)


def launches(c: int) -> list[int]:
    """Indices of the launches case ``c`` ran (vector launches only where rows are whole
    16-byte vectors)."""
    _, d, _, dtype, _ = CASES[c]
    itemsize = np.dtype(CODECS[dtype][2]).itemsize
    extra = len(VEC_LAUNCHES) if (d * itemsize) % 16 == 0 else 0
    return list(range(len(LAUNCHES) + extra))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
