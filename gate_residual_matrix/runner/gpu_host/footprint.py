"""How much GPU memory a cell takes, roughly: its peak, which the ``modes`` step records in
its timeline (the cells share the memory case by case: :mod:`contract.gpu_budget`), and the
budget the cells of the step share.

A cell runs as one process per shard (:mod:`runner.backends.shards`). At its fullest a shard
holds its largest case's inputs and, beside them, the outputs and gradients of every
implementation that it keeps for hashing, comparisons and pairs, and the clones each call
takes: about :data:`COPIES` times that case's input bytes. Every CUDA process keeps besides
its context, the caching allocator's slack and the libraries' workspaces: :data:`SHARD_BASE_MIB`.
Both figures are :mod:`contract.gpu_budget`'s, which shares the memory out case by case.

Example::

    >>> cell_mib(matrix, cases, shards=6)   # doctest: +SKIP
    105216
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gate_residual_matrix.contract import gpu_budget

SHARD_BASE_MIB = gpu_budget.BASE_MIB
"""What a shard process takes on the GPU whatever its cases (MiB)."""
COPIES = gpu_budget.COPIES
"""A shard's peak in multiples of its largest case's input bytes."""
PRECOMPILE_WORKER_MIB = gpu_budget.WORKER_MIB
"""What a compile-ahead worker holds on the GPU at most (MiB)."""
USABLE = 0.95
"""The share of the GPU's memory the running cells' estimates may add up to."""


def case_bytes(matrix, case) -> int:
    """Bytes of one case's inputs on the device: every input of the op's spec at the case's
    N and the problem's sizes, in the case's dtypes (the index in its index dtype)."""
    from gate_residual_matrix import ops
    from gate_residual_matrix.contract.inputs import INDEX_DTYPES, TORCH_DTYPES

    spec = ops.get(matrix.op)
    dtype, index_dtype = matrix.case_dtypes(case)
    sizes = matrix.problem.sizes
    names = [*spec.inputs, *([spec.index] if spec.index else [])]
    return sum(int(np.prod(spec.shape(name, n=case.n, sizes=sizes), dtype=np.int64))
               * (INDEX_DTYPES[index_dtype] if name == spec.index else TORCH_DTYPES[dtype]).itemsize
               for name in names)


def cell_mib(matrix, cases: Sequence, shards: int) -> int:
    """The estimated GPU memory (MiB) of a cell of ``cases`` run in ``shards`` processes (as
    :func:`runner.backends.shards.split` parts them): per shard :data:`SHARD_BASE_MIB` and
    :data:`COPIES` times its largest case's :func:`case_bytes`; 0 without cases."""
    from gate_residual_matrix.runner.backends import shards as sharding

    if not cases:
        return 0
    parts = sharding.split(matrix, list(cases), shards) if shards > 1 else [list(cases)]
    return sum(SHARD_BASE_MIB + COPIES * max(case_bytes(matrix, c) for c in part) // 2**20
               for part in parts)


def capacity_mib() -> int | None:
    """:data:`USABLE` of the smallest GPU's memory (MiB, ``nvidia-smi``), or None where it
    cannot be read (the queue then counts no memory)."""
    from gate_residual_matrix.runner.gpu_host.gpu_memory import per_gpu_mib

    totals = per_gpu_mib("memory.total")
    return int(min(totals) * USABLE) if totals else None
