"""The benchmark's timing of one case: every peer interleaved over rounds, the order rotated.

At small N the calls are host-bound (tens of µs) and a peer timed in its own stretch of
time carries that stretch's GPU clock and host state (docs/performance.md: two runs of one
case that disagreed). So :func:`time_peers` gives each case ``rounds`` rounds; in each round
every peer, in turn, gets ``warmup`` untimed calls then its share of ``iters`` timed calls
(forward, then forward+backward), with one harness (:func:`contract.timing.median_ms`: CUDA
events around each call, or ``perf_counter`` on the CPU); round r starts at peer r mod P and
goes on in table order, so no peer is always first or always after the same one. A peer's
figure is the median of all its samples from all rounds; its 25th and 75th percentiles are
kept beside it.

The input sets are rotated: each peer's calls of one mode go on through the sets from where
its previous round stopped (``sets[k % len(sets)]``, k counting every call of that peer and
mode, warm-up included), so that one pass over them touches > 3x the L2. A peer with sets of
its own (:attr:`bench.peers.Peer.sets`) rotates over those.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gate_residual_matrix.bench.peers import Peer
from gate_residual_matrix.contract.timing import median_ms, percentile

#: the timed modes, in the order each turn runs them (the row keys' prefixes)
MODES = ("forward", "forward_backward")


def round_order(count: int, r: int) -> list[int]:
    """The peers' order in round ``r`` (0-based) of ``count`` peers: starting at peer
    ``r mod count``, then on in table order, wrapping. ``round_order(3, 1) == [1, 2, 0]``."""
    start = r % count if count else 0
    return [(start + k) % count for k in range(count)]


def split_iters(iters: int, rounds: int) -> list[int]:
    """``iters`` timed calls spread over ``rounds`` rounds, the earlier rounds taking the
    remainder: ``split_iters(100, 5) == [20] * 5``, ``split_iters(7, 3) == [3, 2, 2]``.
    Raises ValueError unless 1 <= rounds <= iters."""
    if not 1 <= rounds <= iters:
        raise ValueError(f"rounds: expected 1 <= rounds <= iters ({iters}), got {rounds}")
    return [iters // rounds + (r < iters % rounds) for r in range(rounds)]


@dataclass
class _Peer:
    """One peer's state over a case's rounds: its callables per mode (None: not run, or
    stopped by an error), its samples (ms) and calls so far per mode, its first error."""

    peer: Peer
    calls: dict[str, Callable[[dict], object] | None]
    samples: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    made: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    error: str | None = None


def _prepare(peer: Peer) -> _Peer:
    return _Peer(peer, {"forward": peer.forward, "forward_backward": peer.forward_backward})


def _turn(state: _Peer, sets: list[dict], device: str, *, iters: int, warmup: int) -> None:
    """One peer's turn in a round: each mode still running, ``warmup`` + ``iters`` calls.
    An exception stops the mode that raised (a forward's stops the peer) and is kept."""
    mode = MODES[0]
    sets = state.peer.sets or sets
    try:
        for mode in MODES:
            call = state.calls[mode]
            if call is None:
                continue
            offset = state.made[mode]

            def fn(i: int, call=call, offset=offset) -> object:
                return call(sets[(offset + i) % len(sets)])

            t = median_ms(fn, device=device, warmup=warmup, iters=iters, samples=True)
            state.made[mode] += warmup + t["iters"]
            state.samples[mode] += t["samples_ms"]
    except Exception as err:  # one peer's failure is a row, not the end of the run
        if state.error is None:
            first = (str(err).strip().splitlines() or [""])[0]
            state.error = f"{type(err).__name__}: {first}"[:300]
        stopped = MODES if mode == "forward" else (mode,)
        state.calls.update(dict.fromkeys(stopped))


def _row(state: _Peer) -> dict:
    out: dict = {}
    for mode in MODES:
        taken = state.samples[mode]
        if taken:
            out[f"{mode}_ms"] = statistics.median(taken)
            out[f"{mode}_p25_ms"] = percentile(taken, 25)
            out[f"{mode}_p75_ms"] = percentile(taken, 75)
    if state.error is not None:
        out["error"] = state.error
    return out


def time_peers(table: list[Peer], sets: list[dict], device: str, *,
               iters: int, warmup: int, rounds: int,
               seconds: dict[str, float] | None = None) -> list[dict]:
    """Time every peer of ``table`` on one case, interleaved (the module docstring).

    Args:
        table: the peers to run, in table order (each able to run the case).
        sets: the case's input sets (the op's inputs by name), rotated over.
        iters: timed calls per peer and mode over all rounds (:func:`split_iters`).
        warmup: untimed calls before each peer's timed calls, in every round.
        rounds: 1 <= rounds <= iters; round r runs the peers in :func:`round_order`.
        seconds: when given, each peer's wall seconds (warm-up, compilation and timed
            calls) are added to ``seconds[peer.name]``.

    Returns one dict per peer, in ``table``'s order: ``forward_ms`` (the median of all
    samples, ms), ``forward_p25_ms``, ``forward_p75_ms`` and, for peers with a backward, the
    same for ``forward_backward``; ``error`` (one line) where a call raised (the mode that
    raised stops; a forward's error stops the peer). Raises ValueError on bad ``rounds``.

    Example::

        rows = time_peers(table, sets, "cuda", iters=100, warmup=10, rounds=5)
    """
    shares = split_iters(iters, rounds)
    states = [_prepare(peer) for peer in table]
    for r, share in enumerate(shares):
        for k in round_order(len(states), r):
            t0 = time.perf_counter()
            _turn(states[k], sets, device, iters=share, warmup=warmup)
            if seconds is not None:
                name = states[k].peer.name
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
    return [_row(s) for s in states]


def time_peer(peer: Peer, sets: list[dict], device: str, *, iters: int, warmup: int,
              rounds: int = 1) -> dict:
    """One peer alone: :func:`time_peers` of ``[peer]`` (``forward_ms``, the percentiles,
    ``forward_backward_*`` where it has a backward, ``error`` where a call raised)."""
    return time_peers([peer], sets, device, iters=iters, warmup=warmup, rounds=rounds)[0]


__all__ = ["MODES", "round_order", "split_iters", "time_peer", "time_peers"]
