"""One benchmark case's inputs and bytes: the op's deterministic inputs, rotated over the L2.

The inputs are the matrix cell's (:func:`contract.inputs.build` of the op's spec with the
matrix's problem sizes, index dtype and seed, keyed by N as the cell keys a case without
special values): the same bits as the matrix's case of that N. They are built once on the
CPU, moved to the device, and cloned into enough sets that one pass over them touches more
than 3x the device's L2 cache (:func:`set_count`), so no timed call finds its inputs there.

Example::

    sets = input_sets(ops.get("rms_norm"), matrix, 4096, "bfloat16", "cuda")
    moved = bytes_moved(ops.get("rms_norm"), matrix, 4096, "bfloat16")  # (fwd, fwd+bwd)
"""

from __future__ import annotations

import math

import torch

from gate_residual_matrix.contract.inputs import TORCH_DTYPES, build

L2_FALLBACK = 60 * 2**20
"""The L2 size assumed where the device does not say (the CPU rehearsal): an H200's."""
MAX_SETS = 64


def l2_bytes(device: str) -> int:
    """The L2 cache of the current CUDA device in bytes; :data:`L2_FALLBACK` on the CPU."""
    if device == "cuda":
        size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                       "L2_cache_size", 0)
        if size:
            return int(size)
    return L2_FALLBACK


def set_count(per_set: int, l2: int) -> int:
    """Input sets whose total is more than 3x ``l2`` bytes (1 to :data:`MAX_SETS`).
    ``set_count(352 << 20, 60 << 20) == 1``, ``set_count(1 << 20, 60 << 20) == 64``."""
    return max(1, min(MAX_SETS, math.ceil(3 * l2 / max(per_set, 1))))


def input_sets(spec, matrix, n: int, dtype: str, device: str, *,
               l2: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The case's inputs on ``device`` (module docstring), as :func:`set_count` sets.

    ``spec``: the op's :class:`ops.spec.OpSpec`; ``matrix``: its matrix
    (``problem.sizes``, ``index_dtype``, ``seed``); ``dtype``: bfloat16, float16 or float32.
    """
    p = matrix.problem
    x = build(spec, n=n, sizes=p.sizes, dtype=dtype, index_dtype=p.index_dtype, seed=p.seed)
    first = {k: v.to(device) for k, v in x.tensors.items()}
    per_set = sum(t.numel() * t.element_size() for t in first.values())
    count = set_count(per_set, l2 if l2 is not None else l2_bytes(device))
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(count - 1)]


def bytes_moved(spec, matrix, n: int, dtype: str) -> tuple[int, int]:
    """The bytes the op must move for ``n`` rows of ``dtype``: (forward, forward+backward),
    its spec's formula (:attr:`ops.spec.OpSpec.bytes_moved`)."""
    itemsize = torch.empty(0, dtype=TORCH_DTYPES[dtype]).element_size()
    return spec.bytes_moved(n, matrix.problem.sizes, itemsize)


def clone_sets(sets: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """A copy of every set (for a peer that writes its inputs: the others keep theirs)."""
    return [{k: v.clone() for k, v in x.items()} for x in sets]


__all__ = ["L2_FALLBACK", "MAX_SETS", "bytes_moved", "clone_sets", "input_sets", "l2_bytes",
           "set_count"]
