"""A tensor whose rows are computed when they are read, never held whole.

The CPU cells' memory peak was the accuracy reference: at N = 32768 gate_residual's float64
``out``, ``grad_residual`` and ``grad_y`` are 1.4 GB each, held for the whole case while
every implementation runs twice on clones of the inputs (12.2 GB for the CPU main job at
3784642). Each row of those outputs depends on the same row of the inputs alone, so an
accuracy reference may return a :class:`RowBlocks` instead: the inputs it reads and a
function of a range of rows. :func:`contract.compare.accuracy` and
:func:`contract.compare.tensor_sha256` read it block by block (the same figures and the same
sha256 as the whole tensor's: tests/test_row_blocks.py), and :func:`runner.cell.case.call`
points it at the case's own inputs once the call is known to have left its clones' bits as
they were, so neither the outputs nor the clones stay in memory.

Example::

    >>> import torch
    >>> x = {"a": torch.arange(6.0).reshape(3, 2)}
    >>> doubled = RowBlocks((3, 2), torch.float64, x, lambda t, i, j: t["a"][i:j].double() * 2,
    ...                     block_rows=2)
    >>> doubled.rows(1, 3).tolist(), [b.shape[0] for _, b in doubled.blocks()]
    ([[4.0, 6.0], [8.0, 10.0]], [2, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class RowBlocks:
    """A tensor of ``shape`` (rows first) and ``dtype`` given by ``compute(inputs, start,
    stop)``, which returns rows ``[start, stop)`` as a tensor of ``(stop - start, *shape[1:])``
    (any layout, on the inputs' device). ``compute`` must be a pure function of the inputs'
    bits and the row range, so that any block has the same bits whenever it is computed.
    ``block_rows``: rows per block of :meth:`blocks` (> 0)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    inputs: Mapping[str, torch.Tensor]
    compute: Callable[[Mapping[str, torch.Tensor], int, int], torch.Tensor]
    block_rows: int = 1024

    def __post_init__(self) -> None:
        if not self.shape or self.block_rows <= 0:
            raise ValueError(f"RowBlocks needs at least one dimension and block_rows > 0, got "
                             f"shape {self.shape} and block_rows {self.block_rows}")

    @property
    def device(self) -> torch.device:
        """Where the rows are computed: the inputs' device (the CPU without inputs)."""
        return next((t.device for t in self.inputs.values()), torch.device("cpu"))

    def numel(self) -> int:
        """Elements in the whole tensor."""
        count = 1
        for size in self.shape:
            count *= size
        return count

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` (clipped to the tensor), contiguous.

        Raises:
            ValueError: ``compute`` returned another shape or dtype.
        """
        stop = min(stop, self.shape[0])
        got = self.compute(self.inputs, start, stop)
        want = (max(stop - start, 0), *self.shape[1:])
        if tuple(got.shape) != want or got.dtype != self.dtype:
            raise ValueError(f"RowBlocks: rows {start}:{stop} came back as {tuple(got.shape)} "
                             f"{got.dtype}, not {want} {self.dtype}")
        return got.contiguous()

    def blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first row, rows)`` of every block of :attr:`block_rows` rows, in order."""
        for start in range(0, self.shape[0], self.block_rows):
            yield start, self.rows(start, start + self.block_rows)

    def materialize(self) -> torch.Tensor:
        """The whole tensor (tests, and callers that need one)."""
        if self.shape[0] == 0:
            return self.rows(0, 0)
        return torch.cat([block for _, block in self.blocks()])

    def reading(self, inputs: Mapping[str, torch.Tensor]) -> RowBlocks:
        """The same rows read from ``inputs`` instead (tensors of the same bits)."""
        return replace(self, inputs=inputs)
