"""How gate_residual's backward entry points launch its kernels: the backward plan.

A :class:`_BackwardPlan` holds, for one key (shapes, dtypes, devices and index mode of
``grad_out``, ``gate``, ``y``, ``index``), the packed launches (kernels/launch.py) of:

* ``fused``: up to :data:`~kernels.gate_residual_kernels.FUSED_MAX_CHUNKS` chunks of rows
  that are whole 16-byte vectors, one launch of ``backward_fused`` (kernels/gate_residual_vec.py):
  its last block per column block sums the chunks' partials into ``grad_gate``. With one
  chunk (N <= CHUNK_ROWS) it needs neither partial sums nor tickets: the launch is all;
* otherwise the chunk kernel (vector; element; element with global accumulators for G beyond
  shared memory) then ``reduce_chunks``.

Both paths run the same float32 operations in the same order (``SUMMATION_ORDER``): the
choice moves no bit. The partial sums (float32, chunks * G * D) and the fused kernel's
tickets (one uint32 per column block, zero between launches) are kept per (device, stream)
and their addresses remembered in the plan, checked against the stream and
:data:`_GENERATION` on each call; under CUDA graph capture both are made per call.

The Python of a call (``run``), for the figures in docs/performance.md "Host overhead": two
allocations (``grad_y``, ``grad_gate``), the stream, five data pointers, one alignment test,
one ``cuLaunchKernelEx``.
"""

from __future__ import annotations

import torch

from gate_residual_matrix.kernels.device_assert import FLAG_ASSERT
from gate_residual_matrix.kernels.gate_residual_kernels import (
    FUSED_MAX_CHUNKS,
    backward_vec_geometry,
    n_chunks,
)
from gate_residual_matrix.kernels.gate_residual_plans import (
    _capturing,
    _flags,
    _launcher,
    _p1,
    _p2,
    _p3,
    _raw_stream,
)
from gate_residual_matrix.kernels.geometry import (
    backward_geometry,
    forward_geometry,
    reduce_geometry,
    shared_fits,
)
from gate_residual_matrix.kernels.launch import PackedLaunch
from gate_residual_matrix.kernels.rounding import LANE_CODECS

#: Largest float32 partial-sum workspace kept between backward calls (per device and
#: stream), bytes; larger ones are allocated per call (the kernel time dwarfs it there).
WORKSPACE_CACHE_BYTES = 64 << 20
_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}
#: the fused backward's tickets per (device, stream): int32 zeros (the kernel reads uint32),
#: one per column block; each launch leaves them zero (kernels/gate_residual_vec.py)
_TICKETS: dict[tuple[int, int], torch.Tensor] = {}
#: bumped whenever a kept workspace or ticket buffer is replaced (the old one may be freed):
#: a plan's remembered addresses hold only with the generation they were read at
_GENERATION = [0]


def _kept(table: dict, key: tuple, numel: int, dtype: torch.dtype, device: torch.device,
          zeros: bool) -> torch.Tensor:
    """The buffer of ``table`` for ``key`` ((device, stream)) with at least ``numel``
    elements, made (zero-filled with ``zeros``) when missing or too small; a replacement
    bumps :data:`_GENERATION`."""
    kept = table.get(key)
    if kept is None or kept.numel() < numel:
        kept = table[key] = (torch.zeros if zeros else torch.empty)(numel, dtype=dtype,
                                                                    device=device)
        _GENERATION[0] += 1
    return kept


def clear_scratch() -> None:
    """Forget the kept partial sums and tickets (each plan's remembered addresses with them)."""
    _WORKSPACES.clear()
    _TICKETS.clear()
    _GENERATION[0] += 1


class _BackwardPlan:
    """The backward launches of one key (module docstring): ``fused`` (or None), ``vec`` (the
    vector chunk kernel, or None), the element chunk kernel (:meth:`elements`, made on first
    use) and ``reduce``. ``tickets``: column blocks of the fused launch (0 without one)."""

    __slots__ = (
        "_args",
        "_elements",
        "_scratch",
        "chunks",
        "device",
        "empty",
        "fused",
        "n_rows",
        "reduce",
        "tickets",
        "vec",
        "workspace_bytes",
    )

    def __init__(self, grad_out, gate, index, mode: int) -> None:
        n_rows, width = grad_out.shape
        n_gate = gate.shape[0]
        self.device, self.n_rows = grad_out.get_device(), n_rows
        self.empty = width == 0 or n_gate == 0
        self.chunks = chunks = n_chunks(n_rows)
        self.workspace_bytes = chunks * n_gate * width * 4
        itemsize = grad_out.element_size()
        checked, sink = _flags(grad_out.device)
        flag = (checked if mode == FLAG_ASSERT else sink).data_ptr()
        self._args = (n_rows, width, n_gate, itemsize, index.element_size(), flag,
                      grad_out.dtype, index.dtype)
        self.vec = self._elements = self.reduce = self.fused = self._scratch = None
        self.tickets = 0
        if self.empty:
            return
        if chunks and self._vector_fits():
            if chunks <= FUSED_MAX_CHUNKS:
                grid, block, shared = self._vector_geometry()
                self.tickets = grid[0]
                self.fused = _launcher("vec", 2, grad_out.dtype, index.dtype).packed(
                    self.device, grid, block, shared, self._fused_params())
            else:
                self.vector_chunks()
        grid, block = reduce_geometry(n_gate * width)
        self.reduce = _launcher("elements", 2, grad_out.dtype, index.dtype).packed(
            self.device, (grid, 1), block, 0,
            [*_p2(None, n_gate, width, itemsize), *_p3(None, chunks, n_gate, width)])

    def _lanes(self) -> int:
        return 4 * LANE_CODECS[str(self._args[6]).removeprefix("torch.")][3]

    def _vector_fits(self) -> bool:
        """Rows of whole 16-byte vectors, and G * lanes accumulators in shared memory."""
        _, width, n_gate, itemsize, *_ = self._args
        return shared_fits(n_gate * self._lanes()) and (width * itemsize) % 16 == 0

    def _vector_geometry(self) -> tuple:
        _, width, n_gate, itemsize, *_ = self._args
        return backward_vec_geometry(self.chunks, width * itemsize // 16, n_gate,
                                     self._lanes())

    def _chunk_params(self, vec: bool) -> list:
        n_rows, width, n_gate, itemsize, index_size, flag, _, _ = self._args
        cols, size = (width * itemsize // 4, 4) if vec else (width, itemsize)
        return [*_p2(None, n_rows, cols, size), *_p3(None, self.chunks, n_gate, width),
                *_p2(None, n_rows, cols, size), *_p2(None, n_gate, cols, size),
                *_p2(None, n_rows, cols, size), *_p1(None, n_rows, index_size),
                *_p1(flag, 1, 1)]

    def _fused_params(self) -> list:
        """backward_fused's: grad_y, grad_gate (words), partial (chunks * G, D words),
        tickets (grid.x,), grad_out, gate, y (words), index, flag."""
        n_rows, width, n_gate, itemsize, index_size, flag, _, _ = self._args
        words = width * itemsize // 4
        return [*_p2(None, n_rows, words, 4), *_p2(None, n_gate, words, 4),
                *_p2(None, self.chunks * n_gate, width, 4), *_p1(None, self.tickets, 4),
                *_p2(None, n_rows, words, 4), *_p2(None, n_gate, words, 4),
                *_p2(None, n_rows, words, 4), *_p1(None, n_rows, index_size),
                *_p1(flag, 1, 1)]

    def vector_chunks(self) -> PackedLaunch:
        """The vector chunk kernel of the two-launch path (made on first use where the plan
        fuses; the bench and the tests compare the two paths). Needs :meth:`_vector_fits`."""
        if self.vec is None:
            grid, block, shared = self._vector_geometry()
            self.vec = _launcher("vec", 1, self._args[6], self._args[7]).packed(
                self.device, grid, block, shared, self._chunk_params(vec=True))
        return self.vec

    def elements(self) -> PackedLaunch:
        """The element chunk kernel (unaligned inputs, D * itemsize % 16, or G beyond what
        the vector kernel's shared memory holds)."""
        if self._elements is None:
            _, width, n_gate, _, _, _, dtype, index_dtype = self._args
            if shared_fits(n_gate):
                grid, block, shared = backward_geometry(self.chunks, width, n_gate)
                launcher = _launcher("elements", 1, dtype, index_dtype)
            else:  # accumulators in global memory (same order, same bits)
                (grid, block), shared = forward_geometry(self.chunks, width), 0
                launcher = _launcher("elements", 3, dtype, index_dtype)
            self._elements = launcher.packed(self.device, grid, block, shared,
                                             self._chunk_params(vec=False))
        return self._elements

    def scratch(self, stream: int, device: torch.device) -> tuple[int, int, object]:
        """(address of the float32 partial sums, address of the tickets (0 where the plan
        has no fused launch), what owns them when they are not kept). Kept per (device,
        stream) (partial sums up to WORKSPACE_CACHE_BYTES), and remembered in the plan,
        outside CUDA graph capture: a graph must not hold memory a later call may free, so
        under capture both are made per call (the tickets by ``torch.zeros``, which the
        graph replays)."""
        nbytes = self.workspace_bytes
        if _capturing():
            owner = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            zeros = (torch.zeros(self.tickets, dtype=torch.int32, device=device)
                     if self.tickets else None)
            return owner.data_ptr(), 0 if zeros is None else zeros.data_ptr(), (owner, zeros)
        key = (self.device, stream)
        owner = None
        if nbytes <= WORKSPACE_CACHE_BYTES:
            partial = _kept(_WORKSPACES, key, max(nbytes, 1 << 20), torch.uint8, device,
                            zeros=False).data_ptr()
        else:
            owner = torch.empty(nbytes, dtype=torch.uint8, device=device)
            partial = owner.data_ptr()
        ticket = (_kept(_TICKETS, key, max(self.tickets, 256), torch.int32, device,
                        zeros=True).data_ptr() if self.tickets else 0)
        if owner is None:
            self._scratch = (stream, _GENERATION[0], partial, ticket)
        return partial, ticket, owner

    def workspace(self, stream: int, device: torch.device) -> tuple[int, torch.Tensor | None]:
        """(address of the float32 partial sums, what owns it when it is not kept)."""
        partial, _, owner = self.scratch(stream, device)
        return partial, owner

    def run(self, grad_out, gate, y, index) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad_y, grad_gate) for dense inputs of this plan's key."""
        grad_y = torch.empty_like(grad_out)
        grad_gate = torch.empty_like(gate)
        if self.empty:
            return grad_y, grad_gate
        stream = _raw_stream(self.device)
        gy, go, g, yp, gg = (grad_y.data_ptr(), grad_out.data_ptr(), gate.data_ptr(),
                             y.data_ptr(), grad_gate.data_ptr())
        fused = self.fused
        if fused is not None and not (gy | go | g | yp | gg) & 15:
            if self.chunks == 1:  # the kernel touches neither partial sums nor tickets
                fused.fast(stream, gy, gg, 0, 0, go, g, yp, index.data_ptr())
                return grad_y, grad_gate
            kept = self._scratch
            if (kept is not None and kept[0] == stream and kept[1] == _GENERATION[0]
                    and not _capturing()):
                fused.fast(stream, gy, gg, kept[2], kept[3], go, g, yp, index.data_ptr())
                return grad_y, grad_gate
            partial, ticket, owner = self.scratch(stream, grad_out.device)
            fused.fast(stream, gy, gg, partial, ticket, go, g, yp, index.data_ptr())
            del owner  # the caching allocator orders its reuse after the launch (same stream)
            return grad_y, grad_gate
        self.two_launches(stream, grad_out, y, index, (gy, go, g, yp, gg))
        return grad_y, grad_gate

    def two_launches(self, stream: int, grad_out, y, index, ptrs: tuple) -> None:
        """The chunk kernel, then the reduction, on ``ptrs`` = (grad_y, grad_out, gate, y,
        grad_gate) addresses: more than FUSED_MAX_CHUNKS chunks, rows not whole 16-byte
        vectors, an unaligned pointer, G beyond the vector kernel's shared memory, or N = 0
        (the reduction of no chunks writes +0.0)."""
        gy, go, g, yp, gg = ptrs
        kept = self._scratch
        if (kept is not None and kept[0] == stream and kept[1] == _GENERATION[0]
                and not _capturing()):
            partial, owner = kept[2], None
        else:
            partial, _, owner = self.scratch(stream, grad_out.device)
        if self.chunks:
            vector = (self.vec is not None or self.fused is not None) and not (
                (gy | go | g | yp) & 15)
            launch = self.vector_chunks() if vector else self.elements()
            launch.fast(stream, gy, partial, go, g, yp, index.data_ptr())
        self.reduce.fast(stream, gg, partial)
        del owner  # the caching allocator orders its reuse after these launches (same stream)


__all__ = ["WORKSPACE_CACHE_BYTES", "clear_scratch"]
