"""gate_residual on the GPU with numba.cuda: kernels, launchers, autograd Function.

    out = residual + gate.index_select(0, index) * y

Shapes: ``residual``, ``y``, ``out``: (N, D); ``gate``: (G, D); ``index``: (N,) int64 or int32
in [0, G). Storage dtypes: bfloat16, float16, float32. Backward, for upstream ``grad_out``
(N, D): ``grad_residual = grad_out`` (the same tensor, as autograd passes it through an add);
``grad_y = gate[index] * grad_out``; ``grad_gate[k] = sum over rows i with index[i] == k of
grad_out[i] * y[i]``.

Bits (see ``kernels/rounding.py`` and ``../shared/NOTES.md``):

* forward and ``grad_y`` follow eager PyTorch: the product is rounded to the storage dtype,
  then the sum is computed in float32 and rounded again. No FMA contraction.
* ``grad_gate`` is accumulated in float32 in the fixed order of :data:`SUMMATION_ORDER`,
  then rounded once to the storage dtype. The order depends only on N and
  :data:`CHUNK_ROWS` (a constant of the algorithm), never on the GPU, the block size, the
  grid or timing; there are no atomics. ``kernels/gate_residual_cpu.py`` runs the same
  order on the CPU and gives the same bits.

Example::

    >>> out = gate_residual(residual, gate, y, index)            # doctest: +SKIP
    >>> out = GateResidual.apply(residual, gate, y, index)       # doctest: +SKIP
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import cuda, float32

from kernels.rounding import CODECS, LANE_CODECS, add_rn, mul_rn

#: Rows per chunk of the grad_gate reduction. Part of the algorithm (it fixes the summation
#: order), not a launch parameter.
CHUNK_ROWS = 128

SUMMATION_ORDER = (
    "grad_gate[k, d]: rows are split into consecutive chunks of CHUNK_ROWS=128; within a "
    "chunk, s = +0.0 then s = fadd_rn(s, fmul_rn(grad_out[i, d], y[i, d])) for rows i with "
    "index[i] == k in increasing i; then t = +0.0 and t = fadd_rn(t, s_c) over chunks c in "
    "increasing c; float32 throughout; t rounded once to the storage dtype."
)

#: Threads per block along the columns.
BLOCK_COLS = 128
#: Dynamic shared memory per block for the grad_gate accumulators, bytes (portable limit).
MAX_SHARED_BYTES = 48 * 1024
#: Largest grid.y: the hardware limit is 65535; rows (or chunks) beyond it are looped.
MAX_GRID_Y = 65535


def _make_kernels(load, store):
    """Build the three kernels for one storage dtype's ``load``/``store`` device functions."""

    @cuda.jit
    def forward(out, residual, gate, y, index):
        # grid: x over column blocks, y over rows (strided when N > MAX_GRID_Y)
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col >= out.shape[1]:
            return
        row = cuda.blockIdx.y
        while row < out.shape[0]:
            k = index[row]
            if k < 0 or k >= gate.shape[0]:  # only reachable with check_index=False
                out[row, col] = store(add_rn(float32(np.nan), float32(0.0)))
            else:
                product = store(mul_rn(load(gate[k, col]), load(y[row, col])))
                out[row, col] = store(add_rn(load(residual[row, col]), load(product)))
            row += cuda.gridDim.y

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index):
        # grid: x over column blocks, y over chunks of CHUNK_ROWS rows (strided).
        # Shared memory: acc[k * blockDim.x + threadIdx.x], one float32 per gate row per
        # thread; each thread owns its slots, so no barrier is needed.
        acc = cuda.shared.array(0, dtype=float32)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        col = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        if col >= grad_out.shape[1]:
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            for k in range(n_gate):
                acc[k * width + tx] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            for i in range(start, stop):
                k = index[i]
                if k < 0 or k >= n_gate:  # only reachable with check_index=False
                    grad_y[i, col] = store(add_rn(float32(np.nan), float32(0.0)))
                    continue
                go = load(grad_out[i, col])
                grad_y[i, col] = store(mul_rn(go, load(gate[k, col])))
                slot = k * width + tx
                acc[slot] = add_rn(acc[slot], mul_rn(go, load(y[i, col])))
            for k in range(n_gate):
                partial[chunk, k, col] = acc[k * width + tx]
            chunk += cuda.gridDim.y

    @cuda.jit
    def reduce_chunks(grad_gate, partial):
        # one thread per (k, d) element of grad_gate; chunks summed in increasing order
        flat = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n_gate = grad_gate.shape[0]
        width = grad_gate.shape[1]
        if flat >= n_gate * width:
            return
        k = flat // width
        col = flat - k * width
        total = float32(0.0)
        for c in range(partial.shape[0]):
            total = add_rn(total, partial[c, k, col])
        grad_gate[k, col] = store(total)

    return forward, backward_chunks, reduce_chunks


def _make_word_kernels(get, put, rnd, half_lanes):
    """The vectorised kernels: each thread moves 8-byte words (int64 views of the tensors).

    Same operations in the same order as :func:`_make_kernels`. A word splits into two
    uint32 halves of ``half_lanes`` lanes each (kernels/rounding.py); word lane
    ``h * half_lanes + j`` is column ``word * lanes + h * half_lanes + j``. Needs
    D * itemsize % 8 == 0 and 8-byte aligned storage.
    """
    lanes = 2 * half_lanes
    nan_word = 0x7FFF7FFF7FFF7FFF if half_lanes == 2 else 0x7FFFFFFF7FFFFFFF  # canonical NaN

    @cuda.jit(device=True, inline="always")
    def forward_half(rh, gh, yh):
        o = np.uint32(0)
        for j in range(half_lanes):
            product = rnd(mul_rn(get(gh, j), get(yh, j)))
            o |= put(add_rn(get(rh, j), product), j)
        return o

    @cuda.jit(device=True, inline="always")
    def forward_word(rw, gw, yw):
        lo = forward_half(np.uint32(rw & 0xFFFFFFFF), np.uint32(gw & 0xFFFFFFFF),
                          np.uint32(yw & 0xFFFFFFFF))
        hi = forward_half(np.uint32((rw >> 32) & 0xFFFFFFFF), np.uint32((gw >> 32) & 0xFFFFFFFF),
                          np.uint32((yw >> 32) & 0xFFFFFFFF))
        return np.int64(lo) | (np.int64(hi) << 32)

    @cuda.jit(device=True, inline="always")
    def backward_half(goh, gh, yh, acc, base, width, tx):
        o = np.uint32(0)
        for j in range(half_lanes):
            go = get(goh, j)
            o |= put(mul_rn(go, get(gh, j)), j)
            slot = (base + j) * width + tx
            acc[slot] = add_rn(acc[slot], mul_rn(go, get(yh, j)))
        return o

    @cuda.jit
    def forward(out, residual, gate, y, index):
        # grid: x over pairs of word blocks, y over rows (strided). Each thread loads two
        # words of residual, y and gate (coalesced: c0 and c0 + blockDim) before storing.
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        c0 = cuda.blockIdx.x * 2 * width + tx
        c1 = c0 + width
        words = out.shape[1]
        row = cuda.blockIdx.y
        n_gate = gate.shape[0]
        while row < out.shape[0]:
            k = index[row]
            if k < 0 or k >= n_gate:  # only reachable with check_index=False: NaN, no read
                if c0 < words:
                    out[row, c0] = nan_word
                if c1 < words:
                    out[row, c1] = nan_word
            elif c1 < words:
                r0 = residual[row, c0]
                y0 = y[row, c0]
                g0 = gate[k, c0]
                r1 = residual[row, c1]
                y1 = y[row, c1]
                g1 = gate[k, c1]
                out[row, c0] = forward_word(r0, g0, y0)
                out[row, c1] = forward_word(r1, g1, y1)
            elif c0 < words:
                out[row, c0] = forward_word(residual[row, c0], gate[k, c0], y[row, c0])
            row += cuda.gridDim.y

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index):
        # grid: x over word blocks, y over chunks (strided). Shared memory:
        # acc[(k * lanes + j) * blockDim.x + threadIdx.x]; each thread owns its slots.
        # The next row's index and words are loaded before the current row is processed.
        acc = cuda.shared.array(0, dtype=float32)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        col = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        if col >= grad_out.shape[1]:
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            for slot in range(n_gate * lanes):
                acc[slot * width + tx] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            k_next = index[start]
            go_next = grad_out[start, col]
            y_next = y[start, col]
            for i in range(start, stop):
                k = k_next
                gow = go_next
                yw = y_next
                if i + 1 < stop:
                    k_next = index[i + 1]
                    go_next = grad_out[i + 1, col]
                    y_next = y[i + 1, col]
                if k < 0 or k >= n_gate:  # only reachable with check_index=False
                    grad_y[i, col] = nan_word
                    continue
                gw = gate[k, col]
                lo = backward_half(np.uint32(gow & 0xFFFFFFFF), np.uint32(gw & 0xFFFFFFFF),
                                   np.uint32(yw & 0xFFFFFFFF), acc, k * lanes, width, tx)
                hi = backward_half(np.uint32((gow >> 32) & 0xFFFFFFFF),
                                   np.uint32((gw >> 32) & 0xFFFFFFFF),
                                   np.uint32((yw >> 32) & 0xFFFFFFFF), acc,
                                   k * lanes + half_lanes, width, tx)
                grad_y[i, col] = np.int64(lo) | (np.int64(hi) << 32)
            for k in range(n_gate):
                for j in range(lanes):
                    partial[chunk, k, col * lanes + j] = acc[(k * lanes + j) * width + tx]
            chunk += cuda.gridDim.y

    return forward, backward_chunks


_KERNELS: dict[str, tuple] = {}
_WORD_KERNELS: dict[str, tuple] = {}


def word_kernels_for(dtype: str):
    """The (forward, backward_chunks) 8-byte-word numba.cuda kernels for a storage dtype."""
    if dtype not in _WORD_KERNELS:
        _WORD_KERNELS[dtype] = _make_word_kernels(*LANE_CODECS[dtype])
    return _WORD_KERNELS[dtype]


def pick_width(units: int, cap: int) -> int:
    """Threads per block (a multiple of 32, at most ``cap``) that covers ``units`` with the
    fewest idle threads; ties go to the larger block. Launch shape only: bits never depend
    on it."""
    best, best_waste = 32, None
    for width in range(32, cap + 1, 32):
        waste = -(-units // width) * width - units
        if best_waste is None or waste <= best_waste:
            best, best_waste = width, waste
    return best


def kernels_for(dtype: str):
    """The (forward, backward_chunks, reduce_chunks) numba.cuda kernels for a storage dtype.

    ``dtype`` is ``"bfloat16"``, ``"float16"`` or ``"float32"``; kernels are built once per
    process and compiled by numba on first launch for each argument type signature.
    Raises ``KeyError`` for any other dtype.
    """
    if dtype not in _KERNELS:
        load, store, _ = CODECS[dtype]
        _KERNELS[dtype] = _make_kernels(load, store)
    return _KERNELS[dtype]


def n_chunks(n_rows: int) -> int:
    """Number of CHUNK_ROWS-row chunks the grad_gate reduction splits N rows into."""
    return -(-n_rows // CHUNK_ROWS)


def block_cols_for(n_gate: int) -> int:
    """Threads per block for backward_chunks so that G float32 accumulators fit in shared memory.

    Raises ``ValueError`` when G > MAX_SHARED_BYTES / (4 * 32) = 384 gate rows.
    """
    width = BLOCK_COLS
    while width > 32 and n_gate * width * 4 > MAX_SHARED_BYTES:
        width //= 2
    if n_gate * width * 4 > MAX_SHARED_BYTES:
        raise ValueError(
            f"{n_gate} float32 accumulators per thread (gate rows x lanes) exceed the "
            f"{MAX_SHARED_BYTES // (4 * 32)} that fit in shared memory"
        )
    return width


# --------------------------------------------------------------------------- launch geometry
# Grid and block shapes change which thread computes what, never an operation or its order.


def forward_words_geometry(n_rows: int, words: int, block_cols: int | None = None,
                           max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int]:
    """(grid, block) of the word forward: two words per thread, one row per grid.y step."""
    width = block_cols or pick_width(-(-words // 2), 256)
    return (math.ceil(words / (2 * width)), min(n_rows, max_grid_y)), width


def backward_words_geometry(chunks: int, words: int, n_gate: int, lanes: int,
                            block_cols: int | None = None,
                            max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int, int]:
    """(grid, block, shared bytes) of the word backward: one word per thread, a chunk per
    grid.y step, G * lanes float32 accumulators per thread in shared memory."""
    cap = block_cols_for(n_gate * lanes)
    width = block_cols or pick_width(words, min(cap, 256))
    return (math.ceil(words / width), min(chunks, max_grid_y)), width, n_gate * lanes * width * 4


def forward_geometry(n_rows: int, width: int, block_cols: int = BLOCK_COLS,
                     max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int]:
    """(grid, block) of the element forward: one element per thread."""
    return (math.ceil(width / block_cols), min(n_rows, max_grid_y)), block_cols


def backward_geometry(chunks: int, width: int, n_gate: int, block_cols: int | None = None,
                      max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int, int]:
    """(grid, block, shared bytes) of the element backward."""
    cols = block_cols or block_cols_for(n_gate)
    return (math.ceil(width / cols), min(chunks, max_grid_y)), cols, n_gate * cols * 4


def reduce_geometry(numel: int) -> tuple[int, int]:
    """(grid, block) of the chunk reduction: one thread per grad_gate element."""
    return max(1, math.ceil(numel / 256)), 256


# ------------------------------------------------ launches on numba/numpy arrays (simulator)


def launch_forward_words(out, residual, gate, y, index, dtype: str, stream=0, *,
                         block_cols: int | None = None, max_grid_y: int = MAX_GRID_Y) -> None:
    """Word forward on int64 views: ``out``/``residual``/``y`` (N, W), ``gate`` (G, W),
    W = D * itemsize / 8. ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_words_geometry(*out.shape, block_cols, max_grid_y)
    word_kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index)


def launch_backward_words(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                          stream=0, *, block_cols: int | None = None,
                          max_grid_y: int = MAX_GRID_Y) -> None:
    """Word backward on int64 views (``grad_gate`` and the float32 ``partial`` (chunks, G,
    D) are element arrays), then the chunk reduction."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    if partial.shape[0]:
        lanes = 2 * LANE_CODECS[dtype][3]
        grid, block, shared = backward_words_geometry(partial.shape[0], grad_out.shape[1],
                                                      gate.shape[0], lanes, block_cols,
                                                      max_grid_y)
        word_kernels_for(dtype)[1][grid, block, stream, shared](grad_y, partial, grad_out,
                                                                gate, y, index)
    grid, block = reduce_geometry(grad_gate.size)
    kernels_for(dtype)[2][grid, block, stream](grad_gate, partial)


def launch_forward(out, residual, gate, y, index, dtype: str, stream=0, *,
                   block_cols: int = BLOCK_COLS, max_grid_y: int = MAX_GRID_Y) -> None:
    """Element forward on element arrays (bfloat16 as int16 bits); shapes as in the module
    docstring. ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_geometry(*out.shape, block_cols, max_grid_y)
    kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index)


def launch_backward(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                    stream=0, *, block_cols: int | None = None,
                    max_grid_y: int = MAX_GRID_Y) -> None:
    """Element backward: writes ``grad_y`` (N, D) and ``grad_gate`` (G, D) in full
    (``grad_gate`` is +0.0 where no row selects a gate row); ``partial`` is float32 scratch
    (n_chunks(N), G, D)."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    _, backward_chunks, reduce_chunks = kernels_for(dtype)
    if partial.shape[0]:
        grid, block, shared = backward_geometry(partial.shape[0], grad_out.shape[1],
                                                gate.shape[0], block_cols, max_grid_y)
        backward_chunks[grid, block, stream, shared](grad_y, partial, grad_out, gate, y, index)
    grid, block = reduce_geometry(grad_gate.size)
    reduce_chunks[grid, block, stream](grad_gate, partial)


# --------------------------------------------------------------------------- torch entry points

_STORAGE = {torch.bfloat16: torch.int16}
_LAUNCHERS: dict[tuple, object] = {}


def _launcher(kind: str, dtype: str, which: int):
    from kernels.launch import Launcher

    key = (kind, dtype, which)
    if key not in _LAUNCHERS:
        kernels = word_kernels_for(dtype) if kind == "words" else kernels_for(dtype)
        _LAUNCHERS[key] = Launcher(kernels[which])
    return _LAUNCHERS[key]


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _elements(t):
    """The tensor as the element kernels take it (bfloat16 viewed as int16)."""
    return t.view(_STORAGE[t.dtype]) if t.dtype in _STORAGE else t


def _words_ok(*tensors) -> bool:
    """Whether the 8-byte word kernels apply: rows of whole words, 8-byte aligned storage."""
    t = tensors[0]
    return (t.shape[-1] * t.element_size()) % 8 == 0 and all(
        x.data_ptr() % 8 == 0 for x in tensors)


def gate_residual_forward(residual, gate, y, index, *, check_index: bool = True):
    """``residual + gate.index_select(0, index) * y`` with the numba.cuda forward kernel.

    Args: ``residual``, ``y``: (N, D) CUDA tensors; ``gate``: (G, D); ``index``: (N,) int64
    or int32 in [0, G); one floating dtype (bfloat16, float16 or float32) for all three.
    Non-contiguous inputs are made contiguous. Returns a new (N, D) tensor, bitwise equal to
    eager. Raises :class:`runner.errors.OpInputError` (a ``ValueError``) for bad input.
    ``check_index=False`` skips the index range check (which reads two scalars back from
    the GPU); the kernel then writes NaN rows for out-of-range indices, never reading
    outside ``gate``.
    """
    from kernels.checks import check_inputs

    residual, gate, y, index = check_inputs(residual, gate, y, index, device="cuda",
                                            check_index=check_index)
    out = torch.empty_like(residual)
    n_rows, width = out.shape
    if n_rows == 0 or width == 0:
        return out
    dtype = _dtype_name(out)
    if _words_ok(out, residual, gate, y):
        words = [t.view(torch.int64) for t in (out, residual, gate, y)]
        grid, block = forward_words_geometry(*words[0].shape)
        _launcher("words", dtype, 0)(grid, block, 0, *words, index)
    else:
        grid, block = forward_geometry(n_rows, width)
        _launcher("elements", dtype, 0)(grid, block, 0, *map(_elements, (out, residual, gate,
                                                                          y)), index)
    return out


def gate_residual_backward(grad_out, gate, y, index):
    """(grad_y, grad_gate) for upstream ``grad_out`` (N, D), with the numba.cuda kernels.

    ``grad_gate`` (G, D) is deterministic: :data:`SUMMATION_ORDER`. Scratch: one float32
    buffer of n_chunks(N) * G * D elements. Inputs as saved by :class:`GateResidual`.
    """
    grad_out = grad_out.contiguous()
    n_rows, width = grad_out.shape
    n_gate = gate.shape[0]
    grad_y = torch.empty_like(grad_out)
    grad_gate = torch.empty_like(gate)
    if width == 0 or n_gate == 0:
        return grad_y, grad_gate
    partial = torch.empty((n_chunks(n_rows), n_gate, width), dtype=torch.float32,
                          device=grad_out.device)
    dtype = _dtype_name(grad_out)
    if partial.shape[0]:
        if _words_ok(grad_y, grad_out, gate, y):
            words = [t.view(torch.int64) for t in (grad_y, grad_out, gate, y)]
            lanes = 2 * LANE_CODECS[dtype][3]
            grid, block, shared = backward_words_geometry(partial.shape[0], words[0].shape[1],
                                                          n_gate, lanes)
            _launcher("words", dtype, 1)(grid, block, shared, words[0], partial, *words[1:],
                                         index)
        else:
            grid, block, shared = backward_geometry(partial.shape[0], width, n_gate)
            e = [_elements(t) for t in (grad_y, grad_out, gate, y)]
            _launcher("elements", dtype, 1)(grid, block, shared, e[0], partial, *e[1:], index)
    grid, block = reduce_geometry(grad_gate.numel())
    _launcher("elements", dtype, 2)((grid,), block, 0, _elements(grad_gate), partial)
    return grad_y, grad_gate


class GateResidual(torch.autograd.Function):
    """Autograd Function: forward and backward with the numba.cuda kernels.

    ``GateResidual.apply(residual, gate, y, index)`` -> out (N, D). Gradients flow to
    ``residual`` (``grad_out`` itself), ``gate`` and ``y``; ``index`` has none.
    """

    @staticmethod
    def forward(ctx, residual, gate, y, index, check_index=True):
        from kernels.checks import check_inputs

        residual, gate, y, index = check_inputs(residual, gate, y, index, device="cuda",
                                                check_index=check_index)
        ctx.save_for_backward(gate, y, index)
        return gate_residual_forward(residual, gate, y, index, check_index=False)

    @staticmethod
    def backward(ctx, grad_out):
        from kernels.checks import check_backward_inputs

        gate, y, index = ctx.saved_tensors
        grad_out, gate, y, index = check_backward_inputs(grad_out, gate, y, index,
                                                         device="cuda", check_index=False)
        grad_y, grad_gate = gate_residual_backward(grad_out, gate, y, index)
        return grad_out, grad_gate, grad_y, None, None


def gate_residual(residual, gate, y, index, *, check_index: bool = True):
    """Differentiable ``residual + gate.index_select(0, index) * y`` (numba.cuda kernels).

    Same arguments, result and errors as :func:`gate_residual_forward`; use it inside
    autograd graphs. Example: ``out = gate_residual(r, g, y, idx); out.backward(grad)``.
    """
    return GateResidual.apply(residual, gate, y, index, check_index)


__all__ = [
    "CHUNK_ROWS",
    "SUMMATION_ORDER",
    "GateResidual",
    "gate_residual",
    "gate_residual_backward",
    "gate_residual_forward",
    "kernels_for",
    "launch_backward",
    "launch_backward_words",
    "launch_forward",
    "launch_forward_words",
    "n_chunks",
    "word_kernels_for",
]
