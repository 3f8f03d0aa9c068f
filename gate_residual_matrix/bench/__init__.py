"""The benchmark: any registered op's implementations timed as peers on one GPU (CUDA events,
interleaved rounds, medians), against a copy of the bytes its spec says it must move.

``python -m gate_residual_matrix.bench`` (``nox -s bench``; :mod:`bench.cli`). Stages:
:mod:`bench.peers` (the op's matrix rows as peers, and the copy), :mod:`bench.cases` (inputs,
bytes), :mod:`bench.rounds` (interleaved timing), :mod:`bench.run` (one op, case by case),
:mod:`bench.precompile` (compile ahead), :mod:`bench.report` (JSON and Markdown).
:mod:`bench.host` is gate_residual's own extra: the host time of its CUDA entry points.
"""
