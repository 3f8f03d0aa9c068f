"""Batch invariance: does a row's result depend on what else is in the batch?

Three checks for an implementation with a backward, on one case's inputs (the checks its
users rely on):

The op's spec (:class:`ops.spec.OpSpec`) says which tensors have N rows: its row inputs are
sliced, its row outputs (the forward output and the gradients of row inputs) compared row by
row, its group outputs (sums over the rows that share an index value) compared whole.

- ``row_alone``: a few rows (first, second, middle, last but one, last), each run alone,
  give the same bits as in the full batch, in every row output.
- ``sub_batches``: sub-batches that cover the batch (boundaries at 1, 8 and N/2 + 1), run
  one by one and concatenated, give the full batch's row outputs.
- ``size_sweep``: for every size ``s`` of :func:`sweep_sizes` up to ``M = min(N,
  max_size)``, the first ``s`` rows run alone give the row outputs of the first ``M`` rows
  run together; and each group output of the ``s`` rows equals that of the ``M`` rows with
  rows ``s..M`` made to contribute exact zeros (the spec's ``zero_rows`` inputs zeroed
  there), i.e. the reduction does not depend on how many rows surround it. That second
  comparison is made only where zeroed rows add exact zeros: not when an input without N
  rows holds Inf or NaN (a case with specials in a weight), where ``0 * Inf`` is NaN.
  ``first_failing_size`` is the smallest ``s`` that fails (None when none does).

An implementation with a ``run_dynamic`` (``torch.compile`` rows: one graph with N dynamic,
as vLLM compiles) runs all three checks through it, the whole batch they compare with
included, so they ask whether that one graph gives a row the same bits at every batch size
(the cases and the timings call ``run``: a static graph of the case's size). Before, only
the sweep did, and ``row_alone`` and ``sub_batches`` compiled a static graph for each of
their sizes: about a third of every graph a cell compiled, for sizes that are no case's.
The record says which graph each check used (``graphs``, for implementations that compile
per shape).

Bits are compared as integers (:func:`contract.compare.bits`), NaN payloads included.

Example::

    >>> sweep_sizes(40)
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 31, 33]
"""

from __future__ import annotations

import itertools

import torch

from gate_residual_matrix.contract import compare, gpu_lock


def sweep_sizes(limit: int, extra: tuple[int, ...] = ()) -> list[int]:
    """1..9, then 2^k - 1 and 2^k + 1 for k >= 4, and the ``extra`` sizes, all <= ``limit``,
    ascending."""
    sizes = set(range(1, 10)) | set(extra)
    k = 4
    while (1 << k) - 1 <= limit:
        sizes.update({(1 << k) - 1, (1 << k) + 1})
        k += 1
    return sorted(s for s in sizes if s <= limit)


def _cuts(n: int) -> list[int]:
    """Boundaries of :func:`sub_batches`' parts: 0, 1, 8, N/2 + 1 and N (as far as N goes)."""
    return sorted({0, min(1, n), min(8, n), n // 2 + 1 if n > 1 else n, n})


def row_counts(n: int, max_size: int, extra: tuple[int, ...] = ()) -> set[int]:
    """Every batch size (rows) :func:`check` calls the implementation with on an N-row case:
    what a compiler that specialises on shapes compiles for it (runner/cell/precompile.py)."""
    return checked_row_counts(n) | set(sweep_row_counts(n, max_size, extra))


def checked_row_counts(n: int) -> set[int]:
    """The batch sizes of :func:`row_alone` and :func:`sub_batches` on an N-row case (for an
    implementation without a ``run_dynamic``, a static graph per size)."""
    parts = {b - a for a, b in itertools.pairwise(_cuts(n)) if b > a}
    return {s for s in ({1} | parts) if s > 0}


def sweep_row_counts(n: int, max_size: int, extra: tuple[int, ...] = ()) -> list[int]:
    """The batch sizes of :func:`size_sweep` on an N-row case, in the order of its calls:
    ``M = min(N, max_size)`` first, then the sweep sizes."""
    m = min(n, max_size)
    return [m] + [s for s in sweep_sizes(m, extra) if s != m] if m > 0 else []


def _rows(inputs: dict, start: int, stop: int, spec) -> dict:
    """The inputs of rows ``start:stop`` (inputs without N rows whole), contiguous copies."""
    per_row = spec.row_inputs()
    return {k: (v[start:stop] if k in per_row else v).clone().contiguous()
            for k, v in inputs.items()}


def _run(impl, inputs: dict, *, dynamic: bool = False) -> dict:
    """One call on clones of ``inputs``; ``dynamic``: through ``impl.run_dynamic`` where it
    has one."""
    run = impl.run_dynamic if dynamic and impl.run_dynamic is not None else impl.run
    got = run({k: v.clone() for k, v in inputs.items()}, backward=impl.has_backward)
    return {k: v.detach() for k, v in got.items()}


def graphs(impl) -> dict[str, str] | None:
    """Which graph each check of :func:`check` calls, for an implementation that compiles
    per shape: ``{"row_alone", "sub_batches", "size_sweep"}`` each ``"dynamic"`` (it has a
    ``run_dynamic``) or ``"static"``; None for the others."""
    if not getattr(impl, "compiles_per_shape", False):
        return None
    kind = "dynamic" if _dynamic(impl) else "static"
    return {"row_alone": kind, "sub_batches": kind, "size_sweep": kind}


def _dynamic(impl) -> bool:
    return getattr(impl, "run_dynamic", None) is not None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(compare.bits(a), compare.bits(b))


def _rows_equal(part: dict, whole: dict, start: int, stop: int, spec) -> bool:
    return all(_same(part[k], whole[k][start:stop]) for k in spec.row_outputs() if k in part)


def _n(inputs: dict, spec) -> int:
    """The case's rows: the length of the op's first row input (its index, else its first
    floating input with N rows)."""
    return inputs[spec.index or spec.row_inputs()[0]].shape[0]


# Each call with its comparison is one stretch of shared GPU work (contract/gpu_lock.py): a
# cell waiting to time waits for one call of this one, not for the whole check.


def row_alone(impl, inputs: dict, full: dict, spec) -> bool:
    """Whether each sampled row run alone equals that row within ``full`` (see module;
    through ``run_dynamic`` where the implementation has one)."""
    n = _n(inputs, spec)
    for r in sorted({r for r in (0, 1, n // 2, n - 2, n - 1) if 0 <= r < n}):
        with gpu_lock.shared():
            alone = _run(impl, _rows(inputs, r, r + 1, spec), dynamic=True)
            if not _rows_equal(alone, full, r, r + 1, spec):
                return False
    return True


def sub_batches(impl, inputs: dict, full: dict, spec) -> bool:
    """Whether sub-batches covering the batch, concatenated, equal ``full`` (see module;
    through ``run_dynamic`` where the implementation has one)."""
    parts = []
    for a, b in itertools.pairwise(_cuts(_n(inputs, spec))):
        if b > a:
            with gpu_lock.shared():
                parts.append(_run(impl, _rows(inputs, a, b, spec), dynamic=True))
    with gpu_lock.shared():
        return all(_same(torch.cat([p[k] for p in parts]), full[k])
                   for k in spec.row_outputs() if k in full)


def padding_is_exact(inputs: dict, spec) -> bool:
    """Whether rows with the spec's ``zero_rows`` zeroed add exact zeros to every group
    output: not when an input without N rows (a weight, an AdaLN row) holds Inf or NaN,
    since ``0 * Inf`` is NaN (e.g. ``grad_scale`` sums ``grad_out * (n * weight)``).
    :func:`size_sweep` checks the padded runs only when it is.

    ``inputs``: the op's inputs by their spec names (tensors); ``spec``: its
    :class:`ops.spec.OpSpec`.

    Example::

        >>> padding_is_exact(build(spec, n=20, ...).tensors, spec)  # doctest: +SKIP
        True
    """
    per_row = set(spec.row_inputs())
    return all(bool(torch.isfinite(v).all()) for k, v in inputs.items()
               if k not in per_row and v.is_floating_point())


def size_sweep(impl, inputs: dict, max_size: int, spec,
               extra: tuple[int, ...] = ()) -> int | None:
    """The smallest sweep size that breaks the size sweep (see module), or None. Every call
    goes through ``impl.run_dynamic`` where it has one."""
    m = min(_n(inputs, spec), max_size)
    with gpu_lock.shared():
        top = _rows(inputs, 0, m, spec)
        whole = _run(impl, top, dynamic=True)
        padded_exact = padding_is_exact(top, spec)
    for s in sweep_sizes(m, extra):
        with gpu_lock.shared():
            prefix = _run(impl, _rows(inputs, 0, s, spec), dynamic=True)
            if not _rows_equal(prefix, whole, 0, s, spec):
                return s
        groups = [k for k in spec.group_outputs() if k in prefix] if padded_exact else []
        if groups:
            with gpu_lock.shared():
                padded = dict(top)
                for k in spec.zero_rows:
                    padded[k] = top[k].clone()
                    padded[k][s:] = 0
                again = _run(impl, padded, dynamic=True)
                if not all(_same(prefix[k], again[k]) for k in groups):
                    return s
    return None


def check(impl, inputs: dict, spec, *, max_size: int = 1025, full: dict | None = None,
          extra: tuple[int, ...] = ()) -> dict:
    """The three checks for one case: ``{"row_alone": bool, "sub_batches": bool,
    "size_sweep": bool, "first_failing_size": int | None, "max_size": M}``, and ``graphs``
    (:func:`graphs`) for an implementation that compiles per shape.

    ``impl`` is called with its backward when it has one (else its forward outputs alone are
    compared); ``inputs`` as :meth:`Implementation.run` takes them; ``extra``: sweep sizes
    besides :func:`sweep_sizes`' own;
    ``spec``: the op's :class:`ops.spec.OpSpec`.
    ``full``: the outputs of one forward+backward call of ``impl`` on the whole of
    ``inputs`` (fresh clones) when the caller has them already (the cell's first repeat);
    else that call is made here. An implementation with a ``run_dynamic`` ignores it: its
    checks compare with the whole batch through that graph.
    """
    first = size_sweep(impl, inputs, max_size, spec, extra)  # first: it builds the graph
    if full is None or _dynamic(impl):
        with gpu_lock.shared():
            full = _run(impl, inputs, dynamic=True)
    used = graphs(impl)
    return {"row_alone": row_alone(impl, inputs, full, spec),
            "sub_batches": sub_batches(impl, inputs, full, spec),
            "size_sweep": first is None, "first_failing_size": first,
            "max_size": min(_n(inputs, spec), max_size),
            **({"graphs": used} if used else {})}
