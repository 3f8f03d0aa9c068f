"""Inputs whose bits are a pure function of (seed, case, tensor name), on any platform.

torch's and numpy's random generators are not promised to be stable across releases, so
the bits come from SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014) over a counter, in numpy uint64 integer arithmetic. Each 64-bit
word becomes one value: the sum of its four 16-bit fields, each / 65536, is an Irwin-Hall(4)
variate computed exactly in float64; ``(s - 2) * sqrt(3)`` (one correctly rounded multiply)
has mean 0 and variance 1. Rounding to the storage dtype is numpy's IEEE conversion to
float32, then float16 (numpy) or bfloat16 (round to nearest even on the bits, below). No
library's random generator, no libm call: the same bits everywhere.

With ``specials=True``, about 1 element in 61 of every floating-point input is replaced by
one of :func:`special_values` (NaN, +-Inf, +-0.0, subnormals, the largest finite values,
...), at positions drawn from the same stream.

The values of large tensors may come from a folder that the processes of one host share
(:mod:`contract.input_cache`, ``GATE_RESIDUAL_INPUT_CACHE``): computed once, the same bits.

Which tensors, of which shapes, is the op's (:class:`ops.spec.OpSpec`): :func:`build` makes
each of its ``inputs`` from the stream keyed by the tensor's name, and its ``index`` (N,) in
[0, ``groups``).

Example::

    >>> from gate_residual_matrix import ops
    >>> from gate_residual_matrix.contract.inputs import build
    >>> x = build(ops.get("indexed_scale_shift"), n=257, sizes={"D": 64, "G": 9},
    ...           dtype="bfloat16", index_dtype="int64", seed=1)
    >>> sorted(x.tensors), x.tensors["scale"].shape
    (['grad_out', 'index', 'scale', 'shift', 'x'], torch.Size([9, 64]))
"""

from __future__ import annotations

import concurrent.futures as futures
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gate_residual_matrix.contract import input_cache
from gate_residual_matrix.contract.compare import tensor_sha256

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SPECIAL_EVERY = 61

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}


_BLOCK = 1 << 22
"""Elements built at a time (each value depends on its position only): at N = 32768 a tensor
has 176M elements, and whole-tensor uint64/float64 temporaries (1.4 GB each) cost more in page
faults than in arithmetic."""


def splitmix64(key: int, count: int, start: int = 0) -> np.ndarray:
    """``count`` uint64 words of the SplitMix64 stream that starts at state ``key``, from word
    ``start`` on.

    Word i is mix(key + (i + 1) * 0x9E3779B97F4A7C15), mix being SplitMix64's finaliser.
    """
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(start + 1, start + count + 1, dtype=np.uint64) * _GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def stream_key(seed: int, case_id: str, name: str) -> int:
    """64-bit stream key for one tensor: the first 8 bytes of sha256("seed/case/name")."""
    digest = hashlib.sha256(f"{seed}/{case_id}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def standard_values(words: np.ndarray) -> np.ndarray:
    """float64 values with mean 0 and variance 1, one per uint64 word (Irwin-Hall of 4)."""
    total = np.zeros(words.shape, dtype=np.float64)
    for shift in (0, 16, 32, 48):
        total += ((words >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.float64) / 65536.0
    return (total - 2.0) * np.sqrt(3.0)


def bf16_bits(values32: np.ndarray) -> np.ndarray:
    """float32 array -> bfloat16 bits (uint16), round to nearest even, NaN -> 0x7FC0 | sign."""
    u = np.ascontiguousarray(values32, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    rounded = rounded.astype(np.uint16)  # NaN words may wrap above; they are fixed next
    nan = np.isnan(values32)
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)).astype(np.uint16) & 0x8000) | 0x7FC0
    return rounded


def to_storage(values: np.ndarray, dtype: str) -> torch.Tensor:
    """float64/float32 numpy values -> a CPU tensor of the storage dtype, rounded as documented."""
    with np.errstate(over="ignore", invalid="ignore"):
        v32 = values.astype(np.float32, copy=False)
    if dtype == "bfloat16":  # in blocks: whole-tensor uint32 temporaries cost gigabytes
        out = np.empty(v32.shape, dtype=np.int16)
        flat_in, flat_out = v32.reshape(-1), out.reshape(-1)
        kernel = _bf16_kernel() if flat_in.size >= _PARALLEL_AT_LEAST else None
        if kernel is not None:
            kernel(np.ascontiguousarray(flat_in).view(np.uint32), flat_out.view(np.uint16))
            return torch.from_numpy(out).view(torch.bfloat16)
        for start in range(0, flat_in.size, _BLOCK):
            flat_out[start:start + _BLOCK] = bf16_bits(flat_in[start:start + _BLOCK]).view(
                np.int16)
        return torch.from_numpy(out).view(torch.bfloat16)
    if dtype == "float16":  # numpy's cast, block by block on threads (it drops the GIL)
        out16 = np.empty(v32.shape, dtype=np.float16)
        flat_in, flat_out16 = v32.reshape(-1), out16.reshape(-1)

        def cast(start: int) -> None:
            with np.errstate(over="ignore"):
                flat_out16[start:start + _BLOCK] = flat_in[start:start + _BLOCK]

        with futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            list(pool.map(cast, range(0, flat_in.size, _BLOCK)))
        return torch.from_numpy(out16)
    if dtype == "float32":
        return torch.from_numpy(v32)
    raise ValueError(f"unknown storage dtype {dtype!r}; choose from bfloat16, float16, float32")


def special_values(dtype: str) -> np.ndarray:
    """The special values planted by ``specials=True``, as float64 (exact in ``dtype``).

    NaN, +Inf, -Inf, +0.0, -0.0, the smallest and largest subnormals, the smallest normal,
    +-the largest finite value, and 2**k values whose products overflow or underflow.
    """
    info = torch.finfo(TORCH_DTYPES[dtype])
    tiny = float(info.tiny)
    smallest_sub = float(info.smallest_normal) * float(info.eps)
    return np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, smallest_sub, tiny - smallest_sub, tiny,
         float(info.max), -float(info.max), 2.0 ** (int(np.log2(info.max)) // 2 + 1),
         -(2.0 ** -(int(np.log2(info.max)) // 2 + 1))],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class CaseInputs:
    """One case's inputs as CPU tensors, by the op's input names (``index``: the name of its
    integer index input, shape (N,); None for an op without one)."""

    case_id: str
    n: int
    specials: bool
    tensors: dict[str, torch.Tensor]
    index: str | None = "index"

    def sha256(self) -> dict[str, str]:
        """sha256 of each tensor's bytes (row-major, little-endian storage)."""
        return {name: tensor_sha256(t) for name, t in self.tensors.items()}

    def index_counts(self, g: int) -> list[int]:
        """Rows per index value, length ``g`` (a sum over the rows that share an index value
        has an error that grows with the count); ``[n]`` for an op without an index (its
        parameter gradients sum every row)."""
        if self.index is None:
            return [self.n]
        return torch.bincount(self.tensors[self.index].long(), minlength=g).tolist()


_PARALLEL_AT_LEAST = 1 << 16
"""Tensors of at least this many elements are built by :func:`_values32_parallel`; smaller
ones (and every tensor when numba cannot compile here) by the numpy path, block by block."""


def _values32_numpy(key: int, pick_key: int, count: int, table: np.ndarray | None,
                    start: int = 0) -> np.ndarray:
    """float32 values of stream words ``start .. start + count``: the numpy definition."""
    values = standard_values(splitmix64(key, count, start))
    if table is not None:
        pick = splitmix64(pick_key, count, start)
        chosen = (pick % np.uint64(_SPECIAL_EVERY)) == 0
        values[chosen] = table[(pick[chosen] >> np.uint64(32)) % np.uint64(len(table))]
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float32)


_PARALLEL_KERNEL: list = []


def _parallel_kernel():
    """The numba (CPU, parallel) twin of :func:`_values32_numpy`, compiled on first use and
    cached on disk; None where numba cannot compile here."""
    if not _PARALLEL_KERNEL:
        try:
            from numba import njit, prange

            golden, mix1, mix2 = _GOLDEN, _MIX1, _MIX2
            ffff, every = np.uint64(0xFFFF), np.uint64(_SPECIAL_EVERY)
            s30, s27, s31, s16, s32 = (np.uint64(k) for k in (30, 27, 31, 16, 32))
            root3 = np.sqrt(3.0)

            @njit(inline="always")
            def mix(key, i):
                z = key + (i + np.uint64(1)) * golden
                z = (z ^ (z >> s30)) * mix1
                z = (z ^ (z >> s27)) * mix2
                return z ^ (z >> s31)

            @njit(parallel=True, cache=True)
            def kernel(key, pick_key, count, table, specials, out):
                for j in prange(count):
                    i = np.uint64(j)
                    w = mix(key, i)
                    total = 0.0  # the four fields in numpy's order: the same float64 sums
                    total += np.float64(w & ffff) / 65536.0
                    total += np.float64((w >> s16) & ffff) / 65536.0
                    total += np.float64((w >> s32) & ffff) / 65536.0
                    total += np.float64((w >> (s32 + s16)) & ffff) / 65536.0
                    v = (total - 2.0) * root3
                    if specials:
                        p = mix(pick_key, i)
                        if p % every == 0:
                            v = table[(p >> s32) % np.uint64(table.shape[0])]
                    out[j] = np.float32(v)

            _PARALLEL_KERNEL.append(kernel)
        except Exception:  # no compiler backend, read-only cache: the numpy path serves
            _PARALLEL_KERNEL.append(None)
    return _PARALLEL_KERNEL[0]


_BF16_KERNEL: list = []


def _bf16_kernel():
    """The numba (CPU, parallel) twin of :func:`bf16_bits` (float32 bits in, bfloat16 bits
    out, the same integer arithmetic), compiled on first use and cached on disk; None where
    numba cannot compile here (tests/test_inputs.py checks the two against each other)."""
    if not _BF16_KERNEL:
        try:
            from numba import njit, prange

            @njit(parallel=True, cache=True)
            def kernel(u, out):
                for j in prange(u.shape[0]):
                    w = u[j]
                    if (w & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN
                        out[j] = np.uint16(((w >> np.uint32(16)) & np.uint32(0x8000))
                                           | np.uint32(0x7FC0))
                    else:
                        out[j] = np.uint16((w + np.uint32(0x7FFF)
                                            + ((w >> np.uint32(16)) & np.uint32(1)))
                                           >> np.uint32(16))

            _BF16_KERNEL.append(kernel)
        except Exception:  # no compiler backend, read-only cache: the numpy path serves
            _BF16_KERNEL.append(None)
    return _BF16_KERNEL[0]


def _values32(key: int, pick_key: int, count: int, table: np.ndarray | None) -> np.ndarray:
    """float32 values of one tensor's stream (words 0 .. count): the same bits by either
    path (tests/test_inputs.py checks them against each other)."""
    kernel = _parallel_kernel() if count >= _PARALLEL_AT_LEAST else None
    if kernel is not None:
        out = np.empty(count, dtype=np.float32)
        specials = table is not None
        kernel(np.uint64(key), np.uint64(pick_key), count,
               table if specials else np.zeros(1), specials, out)
        return out
    blocks = [_values32_numpy(key, pick_key, min(_BLOCK, count - start), table, start)
              for start in range(0, count, _BLOCK)]
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


@functools.cache
def _source() -> bytes:
    """This module's code: part of the name of every cached value file
    (:mod:`contract.input_cache`), so a change here never reads values made before it."""
    return Path(__file__).read_bytes()


def make_tensors(*, shapes: dict[str, tuple[int, ...]], index: str | None, n: int,
                 groups: int | None,
                 dtype: str, index_dtype: str, seed: int, specials: bool = False,
                 grouped: bool = False, case_id: str | None = None) -> CaseInputs:
    """Build one case's inputs (CPU tensors); bits depend only on the arguments.

    ``shapes``: floating-point input name -> shape, built in this order from the stream
    keyed by (seed, case_id, name); ``index``: the name of the (n,) index input, values in
    [0, ``groups``) (None: the op has no index, ``groups`` is ignored). ``dtype`` one of
    bfloat16/float16/float32, ``index_dtype`` int64/int32, ``seed`` >= 0. ``case_id`` defaults
    to ``str(n)`` (``f"{n}-specials"`` with specials) and keys the streams; the runner passes
    the case id without its dtypes, so one N has the same float64 values (each rounded to its
    dtype) and the same index in every dtype. ``grouped``: the index values sorted, so the
    rows that share a value are contiguous (each value keeps its count).
    Raises ``ValueError`` for an unknown dtype.
    """
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f"unknown index dtype {index_dtype!r}; choose from int64, int32")
    case_id = case_id or "-".join([str(n), *(["specials"] if specials else []),
                                   *(["grouped"] if grouped else [])])
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        count = int(np.prod(shape, dtype=np.int64))
        key = stream_key(seed, case_id, name)
        pick_key = stream_key(seed, case_id, name + "/specials")
        table = special_values(dtype) if specials else None
        values32 = input_cache.cached(
            key, pick_key, count, table, _values32, _source,
            lambda start, n, k=key, pk=pick_key, t=table: _values32_numpy(k, pk, n, t, start))
        tensors[name] = to_storage(values32, dtype).reshape(shape)
    if index is None:
        return CaseInputs(case_id=case_id, n=n, specials=specials, tensors=tensors, index=None)
    if not groups:
        raise ValueError(f"index {index!r} needs groups >= 1, got {groups!r}")
    index_words = splitmix64(stream_key(seed, case_id, index), n)
    values = ((index_words >> np.uint64(32)) % np.uint64(groups)).astype(np.int64)
    if grouped:
        values = np.sort(values, kind="stable")
    tensors[index] = torch.from_numpy(values).to(INDEX_DTYPES[index_dtype])
    return CaseInputs(case_id=case_id, n=n, specials=specials, tensors=tensors, index=index)


def build(spec, *, n: int, sizes: dict[str, int], dtype: str, index_dtype: str, seed: int,
          specials: bool = False, grouped: bool = False,
          case_id: str | None = None) -> CaseInputs:
    """One case's inputs for op ``spec`` (:class:`ops.spec.OpSpec`) with the problem's
    ``sizes``: :func:`make_tensors` of the spec's inputs and index."""
    shapes = {name: spec.shape(name, n=n, sizes=sizes) for name in spec.inputs}
    groups = sizes[spec.groups] if spec.groups else None
    return make_tensors(shapes=shapes, index=spec.index, n=n, groups=groups,
                        dtype=dtype, index_dtype=index_dtype, seed=seed, specials=specials,
                        grouped=grouped, case_id=case_id)
