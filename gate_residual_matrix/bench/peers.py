"""The benchmark's peers: the rows of an op's matrix file, each called through its contract.

Every row of the op's matrix (:func:`runner.cell.catalog.rows`: library rows expanded per
version, kernel-only from the wheelhouse where not installed; ``rl_kernel_h3`` on its source
tree) is a peer, called as the matrix cell calls it when it times it
(:func:`runner.cell.timing_pass.timings`): ``impl.run(inputs, backward=False)`` for the
forward and ``impl.run(inputs, backward=True)`` for forward+backward (rows with a
backward). Nothing here names an op or a tensor.

A row that cannot run is not a peer: :func:`peers` returns it as :class:`Skipped` with the
reason, named once in the output (the accuracy reference, which computes in float64; a
test-only fault injector; a row whose library is missing or that does not run on this
target; ``--no-compile``, ``--skip`` or ``--peer`` leaving it out).

The copy peer (:func:`copy_peer`) is the floor: a device copy of the bytes the op must move
(:attr:`ops.spec.OpSpec.bytes_moved`), timed with the peers in the same rounds.

Example::

    table, skipped = peers("rms_norm", matrix, "cuda")
    [p.name for p in table][:3]     # ['eager', 'eager_functional', 'numba']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gate_residual_matrix.contract.base import Implementation

#: the name of the copy peer's rows
COPY = "copy"


@dataclass(frozen=True)
class Peer:
    """One implementation as the bench calls it.

    ``forward`` / ``forward_backward``: one call on an input set (a dict of tensors), None
    where the peer has no such mode. ``dtypes``: the storage dtypes it takes (None: all).
    ``sets``: input sets of its own (the copy's buffers, or clones for a peer that writes
    its inputs), rotated over instead of the case's. ``impl``: the row it calls (None for
    the copy). ``mutates``: the inputs its forward writes (its own ``sets`` then)."""

    name: str
    ran: str
    forward: Callable[[dict], object] | None
    forward_backward: Callable[[dict], object] | None = None
    dtypes: tuple[str, ...] | None = None
    sets: list[dict] | None = None
    impl: Implementation | None = None
    mutates: tuple[str, ...] = ()

    def takes(self, dtype: str) -> bool:
        """Whether it runs ``dtype`` cases."""
        return self.dtypes is None or dtype in self.dtypes


@dataclass(frozen=True)
class Skipped:
    """A row of the matrix that is not timed, and why (one line)."""

    name: str
    reason: str


def peer_of(impl: Implementation) -> Peer:
    """``impl`` as a peer: its ``run`` without and with the backward."""
    def forward(x: dict) -> object:
        return impl.run(x, backward=False)

    def forward_backward(x: dict) -> object:
        return impl.run(x, backward=True)

    return Peer(impl.name, impl.ran(), forward,
                forward_backward if impl.has_backward else None,
                dtypes=getattr(impl, "dtypes", None) or None, impl=impl)


def skip_reason(impl: Implementation, target: str, *, compile: bool = True,
                skip: Sequence[str] = ()) -> str | None:
    """Why ``impl`` is not a peer on ``target``, or None (see the module docstring)."""
    if impl.name in skip or impl.name.rsplit("-", 1)[0] in skip:
        return "left out by --skip"
    if impl.role == "accuracy_reference":
        return "the accuracy reference (computes in float64): not a peer"
    if impl.run.__module__.rsplit(".", 1)[-1] == "faulty":
        return "a test-only fault injector"
    if impl.compiles_per_shape and not compile:
        return "compiles per shape: left out by --no-compile"
    return impl.unavailable_reason(target)


def peers(op: str, matrix, device: str, *, only: Sequence[str] | None = None,
          skip: Sequence[str] = (), compile: bool = True) -> tuple[list[Peer], list[Skipped]]:
    """The peers of ``op``'s ``matrix`` rows on ``device`` ("cuda" or "cpu"), in the
    matrix's order, and the rows left out with their reasons.

    ``only``: names to keep (a versioned row's base name keeps every version; the others
    are not even asked whether they can run: RL-Kernel's row builds its extension when
    asked); None keeps all. ``skip``: names to leave out (the same matching).
    """
    from gate_residual_matrix.runner.cell import catalog

    table: list[Peer] = []
    skipped: list[Skipped] = []
    for impl in catalog.rows(matrix):
        if only is not None and not ({impl.name, impl.name.rsplit("-", 1)[0]} & set(only)):
            skipped.append(Skipped(impl.name, "left out by --peer"))
            continue
        why = skip_reason(impl, device, compile=compile, skip=skip)
        if why:
            skipped.append(Skipped(impl.name, why))
        else:
            table.append(peer_of(impl))
    return table, skipped


def copy_peer(nbytes: tuple[int, int], device: str, count: int) -> Peer:
    """The copy floor: ``dst.copy_(src)`` of ``nbytes[0] // 2`` bytes as the forward and of
    ``nbytes[1] // 2`` as forward+backward (a copy reads and writes each byte: the bytes
    moved are the op's), over ``count`` buffer pairs of each, rotated as the inputs are."""
    def pair(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        src = torch.empty(max(size // 2, 1), dtype=torch.uint8, device=device)
        return src, torch.empty_like(src)

    sets = [{"forward": pair(nbytes[0]), "forward_backward": pair(nbytes[1])}
            for _ in range(count)]

    def forward(x: dict) -> object:
        return x["forward"][1].copy_(x["forward"][0])

    def forward_backward(x: dict) -> object:
        return x["forward_backward"][1].copy_(x["forward_backward"][0])

    return Peer(COPY, f"torch: dst.copy_(src) on {device}, the bytes the op must move",
                forward, forward_backward, sets=sets)


__all__ = ["COPY", "Peer", "Skipped", "copy_peer", "peer_of", "peers", "skip_reason"]
