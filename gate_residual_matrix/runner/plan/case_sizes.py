"""Whether the selected cases fit in a host's memory, checked before anything runs.

A case needs at least its tensors at once (:func:`case_bytes_at_least`, by the op's spec);
:func:`check_case_sizes` refuses a selected case that could never fit in this host's (or a
cluster node's) memory as a bad matrix (exit 2), naming the key to lower.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from gate_residual_matrix.runner.config.matrix import Case, Matrix
from gate_residual_matrix.runner.errors import ConfigError

__all__ = ["case_bytes_at_least", "check_case_sizes", "host_memory_bytes"]

_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "int64": 8, "int32": 4}


def case_bytes_at_least(matrix: Matrix, case: Case) -> tuple[int, str, int]:
    """A lower bound on the host memory of ``case``, and the key to blame when it is too big.

    Counts every tensor the case must hold at once, by the op's spec: its floating-point
    inputs (the upstream gradient among them) in the case's dtype, 8 bytes per element of the
    forward output when the matrix has an accuracy reference (the float64 reference's forward
    output on a GPU; on the CPU, where the reference is read by blocks of rows, the call's
    clones of the inputs and the baseline's outputs, held at once, weigh at least as much)
    and the index (N in the index dtype). Tensors of one shape add up into one term; returns
    ``(bytes, key, value)``: the key is the largest size of the term that dominates (``"n"``
    for the case's N, else ``"problem.<size>"``; the first of equal sizes).

    Example::

        >>> m = load_matrix("matrix.yaml"); case_bytes_at_least(m, m.cases[0])[1:]
        ('problem.D', 5376)
    """
    from gate_residual_matrix import ops
    spec, sizes = ops.get(matrix.op), {**matrix.problem.sizes, "N": case.n}
    dtype, index_dtype = matrix.case_dtypes(case)
    terms: dict[tuple[str, ...], int] = {}

    def add(shape: tuple[str, ...], itemsize: int) -> None:
        terms[shape] = terms.get(shape, 0) + math.prod(sizes[s] for s in shape) * itemsize

    for shape in spec.inputs.values():
        add(tuple(shape), _ITEMSIZE[dtype])
    if matrix.accuracy_reference:
        for forward in spec.forwards:
            add(tuple(spec.outputs[forward].shape), 8)
    rows = next(iter(s for s in spec.inputs.values() if s[0] == "N"), ("N",))
    add(tuple(rows), 0)
    if spec.index:
        terms[tuple(rows)] += case.n * _ITEMSIZE[index_dtype]
    shape = max(terms, key=terms.__getitem__)
    symbol = max(shape, key=lambda s: (sizes[s], -shape.index(s)))
    key = "n" if symbol == "N" else f"problem.{symbol}"
    return sum(terms.values()), key, sizes[symbol]


def host_memory_bytes() -> int | None:
    """This host's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_case_sizes(matrix: Matrix, cases: Iterable[Case], matrix_path: Path,
                     memory: int | None) -> None:
    """Refuse a case that cannot fit in this host's memory, before anything runs.

    ``memory``: the host's bytes (:func:`host_memory_bytes`); None skips the check. The
    bound is :func:`case_bytes_at_least` (every tensor: N, D, G and the dtypes), so a
    refused case could never have run here (N = 10**11 or G = 10**12 needs petabytes); one
    that passes may still end ``oom`` in its cell. The message names the key to lower.

    Raises:
        ConfigError: e.g. ``matrix.yaml: cases[5].n: expected a size whose inputs fit in
            this host's memory, got 100000000000 (...)``.
    """
    if not memory:
        return
    index = {c.id: i for i, c in enumerate(matrix.cases)}
    for case in cases:
        need, key, value = case_bytes_at_least(matrix, case)
        if need > memory:
            key = f"cases[{index[case.id]}].n" if key == "n" else key
            p = matrix.problem
            raise ConfigError(
                f"{matrix_path.name}: {key}: expected a size whose tensors fit in this host's "
                f"memory, got {value} (case {case.id}: N = {case.n}, "
                + "".join(f"{k} = {v}, " for k, v in p.sizes.items()) +
                f"{'/'.join(matrix.case_dtypes(case))}: at least {_bytes(need)} for the "
                f"inputs, the upstream gradient and the reference's output; "
                f"this host has {_bytes(memory)})")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"  # pragma: no cover
