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
from numba.cuda import types

from kernels.checks import check_backward_inputs, check_grad_out, check_inputs
from kernels.errors import OpInputError
from kernels.geometry import (
    BLOCK_COLS,
    MAX_GRID_Y,
    backward_geometry,
    block_cols_for,
    forward_geometry,
    pick_width,
    reduce_geometry,
    shared_fits,
)
from kernels.launch import Launcher, array_type
from kernels.rounding import CODECS, LANE_CODECS, add_rn, mul_rn
from kernels.vector import load_vec, store_vec

#: Rows per chunk of the grad_gate reduction. Part of the algorithm (it fixes the summation
#: order), not a launch parameter.
CHUNK_ROWS = 128

SUMMATION_ORDER = (
    "grad_gate[k, d]: rows are split into consecutive chunks of CHUNK_ROWS=128; within a "
    "chunk, s = +0.0 then s = fadd_rn(s, fmul_rn(grad_out[i, d], y[i, d])) for rows i with "
    "index[i] == k in increasing i; then t = +0.0 and t = fadd_rn(t, s_c) over chunks c in "
    "increasing c; float32 throughout; t rounded once to the storage dtype."
)

def _make_element_backward(load, store, in_shared: bool):
    """The element backward_chunks kernel, with its accumulators in shared memory
    (``in_shared``: acc[k * blockDim.x + threadIdx.x], one float32 per gate row per thread,
    each thread owning its slots, so no barrier) or in ``partial`` itself (for G too large
    for shared memory). Same operations in the same order either way: the same bits."""
    if in_shared:
        @cuda.jit(device=True, inline="always")
        def accumulators(partial):
            return cuda.shared.array(0, dtype=float32)

        @cuda.jit(device=True, inline="always")
        def slot(chunk, k, col, tx, width):
            return k * width + tx

        @cuda.jit(device=True, inline="always")
        def flush(partial, acc, chunk, n_gate, col, tx, width):
            for k in range(n_gate):
                partial[chunk, k, col] = acc[k * width + tx]
    else:
        @cuda.jit(device=True, inline="always")
        def accumulators(partial):
            return partial

        @cuda.jit(device=True, inline="always")
        def slot(chunk, k, col, tx, width):
            return chunk, k, col

        @cuda.jit(device=True, inline="always")
        def flush(partial, acc, chunk, n_gate, col, tx, width):
            pass

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index, flag):
        # grid: x over column blocks, y over chunks of CHUNK_ROWS rows (strided)
        acc = accumulators(partial)
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
                acc[slot(chunk, k, col, tx, width)] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            for i in range(start, stop):
                k = index[i]
                if k < 0 or k >= n_gate:
                    flag[0] = np.uint8(0)
                    grad_y[i, col] = store(add_rn(float32(np.nan), float32(0.0)))
                    continue
                go = load(grad_out[i, col])
                grad_y[i, col] = store(mul_rn(go, load(gate[k, col])))
                s = slot(chunk, k, col, tx, width)
                acc[s] = add_rn(acc[s], mul_rn(go, load(y[i, col])))
            flush(partial, acc, chunk, n_gate, col, tx, width)
            chunk += cuda.gridDim.y

    return backward_chunks


def _make_kernels(load, store):
    """Build the element kernels for one storage dtype's ``load``/``store`` device functions."""

    @cuda.jit
    def forward(out, residual, gate, y, index, flag):
        # grid: x over column blocks, y over rows (strided when N > MAX_GRID_Y); ``flag``
        # (uint8, 1 element) is set to 0 on an index outside [0, G), whose row is NaN
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if col >= out.shape[1]:
            return
        row = cuda.blockIdx.y
        while row < out.shape[0]:
            k = index[row]
            if k < 0 or k >= gate.shape[0]:
                flag[0] = np.uint8(0)
                out[row, col] = store(add_rn(float32(np.nan), float32(0.0)))
            else:
                product = store(mul_rn(load(gate[k, col]), load(y[row, col])))
                out[row, col] = store(add_rn(load(residual[row, col]), load(product)))
            row += cuda.gridDim.y

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
        # eight loads issued before their eight additions, which stay in chunk order
        total = float32(0.0)
        chunks = partial.shape[0]
        c = 0
        while c + 8 <= chunks:
            p0 = partial[c, k, col]
            p1 = partial[c + 1, k, col]
            p2 = partial[c + 2, k, col]
            p3 = partial[c + 3, k, col]
            p4 = partial[c + 4, k, col]
            p5 = partial[c + 5, k, col]
            p6 = partial[c + 6, k, col]
            p7 = partial[c + 7, k, col]
            total = add_rn(add_rn(add_rn(add_rn(total, p0), p1), p2), p3)
            total = add_rn(add_rn(add_rn(add_rn(total, p4), p5), p6), p7)
            c += 8
        while c < chunks:
            total = add_rn(total, partial[c, k, col])
            c += 1
        grad_gate[k, col] = store(total)

    backward_chunks = _make_element_backward(load, store, in_shared=True)
    backward_chunks_global = _make_element_backward(load, store, in_shared=False)
    return forward, backward_chunks, reduce_chunks, backward_chunks_global


def _make_vec_kernels(get, put, rnd, word_lanes):
    """The vectorised kernels: each thread moves 16-byte vectors (kernels/vector.py).

    Same operations in the same order as :func:`_make_kernels`. Arrays are uint32 views of
    the tensors' bytes: (N, D * itemsize / 4). A 32-bit word holds ``word_lanes`` lanes
    (kernels/rounding.py: two bfloat16/float16, one float32); vector ``q`` of a row is words
    ``4q .. 4q + 3``, columns ``q * vec_lanes ..``. The forward handles two rows per loop
    step (:data:`FORWARD_ROWS_PER_STEP`), issuing all their loads before any store, so more
    bytes are in flight per thread (one row per step measured slower: docs/performance.md).
    Needs D * itemsize % 16 == 0 and 16-byte aligned storage.

    ``flag`` (uint8, 1 element) is set to 0 by any thread that meets an index outside
    [0, G); that row's output is NaN and ``gate`` is read at row 0 instead (never outside).
    """
    vec_lanes = 4 * word_lanes
    nan = np.uint32(0x7FFF7FFF if word_lanes == 2 else 0x7FFFFFFF)  # canonical NaN lanes

    @cuda.jit(device=True, inline="always")
    def forward_word(rh, gh, yh):
        o = np.uint32(0)
        for j in range(word_lanes):
            product = rnd(mul_rn(get(gh, j), get(yh, j)))
            o |= put(add_rn(get(rh, j), product), j)
        return o

    @cuda.jit(device=True, inline="always")
    def forward_store(out, row, q, r, g, y, bad):
        if bad:
            store_vec(out, row, q, nan, nan, nan, nan)
        else:
            store_vec(out, row, q, forward_word(r[0], g[0], y[0]),
                      forward_word(r[1], g[1], y[1]), forward_word(r[2], g[2], y[2]),
                      forward_word(r[3], g[3], y[3]))

    @cuda.jit(device=True, inline="always")
    def gate_row(index, row, n_gate, flag):
        """(row of gate to read, whether index[row] is outside [0, G))."""
        k = index[row]
        if k < 0 or k >= n_gate:
            flag[0] = np.uint8(0)
            return 0, True
        return k, False

    @cuda.jit
    def forward(out, residual, gate, y, index, flag):
        # grid: x over 16-byte vectors of a row, y over pairs of rows (strided)
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if q >= (out.shape[1] >> 2):
            return
        n_rows = out.shape[0]
        n_gate = gate.shape[0]
        row = 2 * cuda.blockIdx.y
        while row < n_rows:
            has_b = row + 1 < n_rows
            row_b = row + 1 if has_b else row
            ka, bad_a = gate_row(index, row, n_gate, flag)
            kb, bad_b = gate_row(index, row_b, n_gate, flag)
            ra = load_vec(residual, row, q)
            ya = load_vec(y, row, q)
            ga = load_vec(gate, ka, q)
            rb = load_vec(residual, row_b, q)
            yb = load_vec(y, row_b, q)
            gb = load_vec(gate, kb, q)
            forward_store(out, row, q, ra, ga, ya, bad_a)
            if has_b:
                forward_store(out, row_b, q, rb, gb, yb, bad_b)
            row += 2 * cuda.gridDim.y

    @cuda.jit(device=True, inline="always")
    def backward_word(goh, gh, yh, acc, base, width, tx):
        o = np.uint32(0)
        for j in range(word_lanes):
            go = get(goh, j)
            o |= put(mul_rn(go, get(gh, j)), j)
            slot = (base + j) * width + tx
            acc[slot] = add_rn(acc[slot], mul_rn(go, get(yh, j)))
        return o

    @cuda.jit
    def backward_chunks(grad_y, partial, grad_out, gate, y, index, flag):
        # grid: x over 16-byte vectors, y over chunks (strided). Shared memory:
        # acc[(k * vec_lanes + lane) * blockDim.x + threadIdx.x]; each thread owns its
        # slots, so no barrier.
        acc = cuda.shared.array(0, dtype=float32)
        tx = cuda.threadIdx.x
        width = cuda.blockDim.x
        q = cuda.blockIdx.x * width + tx
        n_rows = grad_out.shape[0]
        n_gate = gate.shape[0]
        if q >= (grad_out.shape[1] >> 2):
            return
        chunk = cuda.blockIdx.y
        while chunk < partial.shape[0]:
            for slot in range(n_gate * vec_lanes):
                acc[slot * width + tx] = float32(0.0)
            start = chunk * CHUNK_ROWS
            stop = min(start + CHUNK_ROWS, n_rows)
            # A two-row pipeline: row i has its index and all three vectors loaded; row
            # i + 1 its index and grad_out/y vectors (its gate vector is loaded as soon as
            # its index is known). Loads past the chunk's end re-read its last row.
            k0, bad0 = gate_row(index, start, n_gate, flag)
            go0 = load_vec(grad_out, start, q)
            y0 = load_vec(y, start, q)
            g0 = load_vec(gate, k0, q)
            ahead = min(start + 1, stop - 1)
            k1, bad1 = gate_row(index, ahead, n_gate, flag)
            go1 = load_vec(grad_out, ahead, q)
            y1 = load_vec(y, ahead, q)
            for i in range(start, stop):
                k = k0
                bad = bad0
                go = go0
                yv = y0
                g = g0
                k0 = k1
                bad0 = bad1
                go0 = go1
                y0 = y1
                g0 = load_vec(gate, k0, q)
                ahead = min(i + 2, stop - 1)
                k1, bad1 = gate_row(index, ahead, n_gate, flag)
                go1 = load_vec(grad_out, ahead, q)
                y1 = load_vec(y, ahead, q)
                if bad:
                    store_vec(grad_y, i, q, nan, nan, nan, nan)
                    continue
                base = k * vec_lanes
                o0 = backward_word(go[0], g[0], yv[0], acc, base, width, tx)
                o1 = backward_word(go[1], g[1], yv[1], acc, base + word_lanes, width, tx)
                o2 = backward_word(go[2], g[2], yv[2], acc, base + 2 * word_lanes, width, tx)
                o3 = backward_word(go[3], g[3], yv[3], acc, base + 3 * word_lanes, width, tx)
                store_vec(grad_y, i, q, o0, o1, o2, o3)
            for k in range(n_gate):
                for j in range(vec_lanes):
                    partial[chunk, k, q * vec_lanes + j] = acc[(k * vec_lanes + j) * width + tx]
            chunk += cuda.gridDim.y

    return forward, backward_chunks


_KERNELS: dict[str, tuple] = {}
_VEC_KERNELS: dict[str, tuple] = {}

#: Rows per loop step of the vectorised forward (its loop body is written for two).
FORWARD_ROWS_PER_STEP = 2
#: grid.y cap of the vectorised forward: a block walks N / (cap * rows per step) steps.
FORWARD_MAX_GRID_Y = 8192


def vec_kernels_for(dtype: str):
    """The (forward, backward_chunks) 16-byte-vector numba.cuda kernels for a storage dtype.

    Raises ``KeyError`` for an unknown dtype.
    """
    if dtype not in _VEC_KERNELS:
        _VEC_KERNELS[dtype] = _make_vec_kernels(*LANE_CODECS[dtype])
    return _VEC_KERNELS[dtype]


def kernels_for(dtype: str):
    """The (forward, backward_chunks, reduce_chunks, backward_chunks_global) element
    numba.cuda kernels for a dtype (the last for G too large for shared memory).

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


# --------------------------------------------------------------------------- launch geometry
# Grid and block shapes change which thread computes what, never an operation or its order.


def forward_vec_geometry(n_rows: int, vectors: int, block_cols: int | None = None,
                         max_grid_y: int = FORWARD_MAX_GRID_Y) -> tuple[tuple, int]:
    """(grid, block) of the vectorised forward: one 16-byte vector per thread, a block of
    :data:`FORWARD_ROWS_PER_STEP` rows per grid.y step. ``vectors``: 16-byte vectors per row."""
    width = block_cols or pick_width(vectors, 256)
    steps = -(-n_rows // FORWARD_ROWS_PER_STEP)
    return (math.ceil(vectors / width), max(1, min(steps, max_grid_y))), width


def backward_vec_geometry(chunks: int, vectors: int, n_gate: int, lanes: int,
                          block_cols: int | None = None,
                          max_grid_y: int = MAX_GRID_Y) -> tuple[tuple, int, int]:
    """(grid, block, shared bytes) of the vectorised backward: one vector per thread, a
    chunk per grid.y step, G * lanes float32 accumulators per thread in shared memory."""
    cap = block_cols_for(n_gate * lanes)
    width = block_cols or pick_width(vectors, min(cap, 256))
    return (math.ceil(vectors / width), min(chunks, max_grid_y)), width, n_gate * lanes * width * 4


def _flag_array():
    return np.ones(1, dtype=np.uint8)


# ------------------------------------------------ launches on numba/numpy arrays (simulator)


def launch_forward_vec(out, residual, gate, y, index, dtype: str, stream=0, *, flag=None,
                       block_cols: int | None = None,
                       max_grid_y: int = FORWARD_MAX_GRID_Y) -> None:
    """Vectorised forward on uint32 views: ``out``/``residual``/``y`` (N, W), ``gate`` (G,
    W), W = D * itemsize / 4 (a multiple of 4). ``flag``: uint8 (1,), set to 0 on an index
    outside [0, G). ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_vec_geometry(out.shape[0], out.shape[1] // 4, block_cols,
                                       max_grid_y)
    flag = _flag_array() if flag is None else flag
    vec_kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index, flag)


def launch_backward_vec(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                        stream=0, *, flag=None, block_cols: int | None = None,
                        max_grid_y: int = MAX_GRID_Y) -> None:
    """Vectorised backward on uint32 views (``grad_gate`` and the float32 ``partial``
    (chunks, G, D) are element arrays), then the chunk reduction."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    flag = _flag_array() if flag is None else flag
    if partial.shape[0]:
        lanes = 4 * LANE_CODECS[dtype][3]
        grid, block, shared = backward_vec_geometry(partial.shape[0], grad_out.shape[1] // 4,
                                                    gate.shape[0], lanes, block_cols,
                                                    max_grid_y)
        vec_kernels_for(dtype)[1][grid, block, stream, shared](grad_y, partial, grad_out,
                                                               gate, y, index, flag)
    grid, block = reduce_geometry(grad_gate.size)
    kernels_for(dtype)[2][grid, block, stream](grad_gate, partial)


def launch_forward(out, residual, gate, y, index, dtype: str, stream=0, *, flag=None,
                   block_cols: int = BLOCK_COLS, max_grid_y: int = MAX_GRID_Y) -> None:
    """Element forward on element arrays (bfloat16 as int16 bits); shapes as in the module
    docstring. ``block_cols``/``max_grid_y`` change the launch only."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return
    grid, block = forward_geometry(*out.shape, block_cols, max_grid_y)
    flag = _flag_array() if flag is None else flag
    kernels_for(dtype)[0][grid, block, stream](out, residual, gate, y, index, flag)


def launch_backward(grad_y, grad_gate, partial, grad_out, gate, y, index, dtype: str,
                    stream=0, *, flag=None, block_cols: int | None = None,
                    max_grid_y: int = MAX_GRID_Y) -> None:
    """Element backward: writes ``grad_y`` (N, D) and ``grad_gate`` (G, D) in full
    (``grad_gate`` is +0.0 where no row selects a gate row); ``partial`` is float32 scratch
    (n_chunks(N), G, D)."""
    if grad_out.shape[1] == 0 or gate.shape[0] == 0:
        return
    _, backward_chunks, reduce_chunks, backward_global = kernels_for(dtype)
    flag = _flag_array() if flag is None else flag
    if partial.shape[0] and shared_fits(gate.shape[0]):
        grid, block, shared = backward_geometry(partial.shape[0], grad_out.shape[1],
                                                gate.shape[0], block_cols, max_grid_y)
        backward_chunks[grid, block, stream, shared](grad_y, partial, grad_out, gate, y, index,
                                                     flag)
    elif partial.shape[0]:
        grid, block = forward_geometry(partial.shape[0], grad_out.shape[1],
                                       block_cols or BLOCK_COLS, max_grid_y)
        backward_global[grid, block, stream](grad_y, partial, grad_out, gate, y, index, flag)
    grid, block = reduce_geometry(grad_gate.size)
    reduce_chunks[grid, block, stream](grad_gate, partial)


# --------------------------------------------------------------------------- torch entry points
# The entry points launch on raw pointers (kernels/launch.py): a tensor is described to the
# kernel as a C-contiguous array of the type the kernel takes (uint32 words for the
# vectorised kernels, int16 for bfloat16 elements), without creating torch views.

_ELEMENT_TYPES = {torch.bfloat16: types.int16, torch.float16: types.float16,
                  torch.float32: types.float32}
_INDEX_TYPES = {torch.int64: types.int64, torch.int32: types.int32}
_U32_2D = array_type(types.uint32, 2)
_FLAG_TYPE = array_type(types.uint8, 1)
_F32_3D = array_type(types.float32, 3)
_LAUNCHERS: dict[tuple, Launcher] = {}
#: per device index: (flag the checked calls clear on a bad index, flag unchecked calls clear)
_FLAGS: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _launcher(kind: str, which: int, dtype: torch.dtype, index_dtype: torch.dtype) -> Launcher:
    """The launcher of one kernel and signature. ``kind``: "vec" or "elements"; ``which``:
    0 forward, 1 backward_chunks, 2 reduce_chunks, 3 backward_chunks_global (elements only)."""
    key = (kind, which, dtype, index_dtype)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        name = str(dtype).removeprefix("torch.")
        element = array_type(_ELEMENT_TYPES[dtype], 2)
        index = array_type(_INDEX_TYPES[index_dtype], 1)
        if kind == "vec":
            kernel = vec_kernels_for(name)[which]
            argtypes = ((_U32_2D,) * 4 + (index, _FLAG_TYPE) if which == 0 else
                        (_U32_2D, _F32_3D, _U32_2D, _U32_2D, _U32_2D, index, _FLAG_TYPE))
        else:
            kernel = kernels_for(name)[which]
            argtypes = ((element,) * 4 + (index, _FLAG_TYPE) if which == 0 else
                        (element, _F32_3D) if which == 2 else
                        (element, _F32_3D, element, element, element, index, _FLAG_TYPE))
        launcher = _LAUNCHERS[key] = Launcher(kernel, argtypes)
    return launcher


def _flags(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    flags = _FLAGS.get(index)
    if flags is None:
        flags = _FLAGS[index] = (torch.ones(1, dtype=torch.uint8, device=device),
                                 torch.ones(1, dtype=torch.uint8, device=device))
    return flags


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _vec_ok(*tensors) -> bool:
    """Whether the 16-byte vector kernels apply: rows of whole vectors, 16-byte aligned."""
    t = tensors[0]
    return (t.shape[-1] * t.element_size()) % 16 == 0 and all(
        x.data_ptr() % 16 == 0 for x in tensors)


# numba's array ABI for C-contiguous arrays (what numba-cuda's _Kernel._prepare_args passes), for
# the ranks used here: 0, 0, size, itemsize, pointer, *shape, *strides in bytes.

def _p1(ptr: int, n: int, itemsize: int) -> tuple:
    return 0, 0, n, itemsize, ptr, n, itemsize


def _p2(ptr: int, rows: int, cols: int, itemsize: int) -> tuple:
    return 0, 0, rows * cols, itemsize, ptr, rows, cols, cols * itemsize, itemsize


def _p3(ptr: int, a: int, b: int, c: int) -> tuple:  # float32
    return 0, 0, a * b * c, 4, ptr, a, b, c, 4 * b * c, 4 * c, 4


def _launch_forward(out, residual, gate, y, index, flag, *,
                    max_grid_y: int = FORWARD_MAX_GRID_Y) -> None:
    """Launch the forward on contiguous CUDA tensors of one device (no checks): the
    vectorised kernel when :func:`_vec_ok`, else the element kernel."""
    n_rows, width = out.shape
    n_gate = gate.shape[0]
    itemsize = out.element_size()
    tail = (*_p1(index.data_ptr(), n_rows, index.element_size()), *_p1(flag.data_ptr(), 1, 1))
    if _vec_ok(out, residual, gate, y):
        words = width * itemsize // 4
        grid, block = forward_vec_geometry(n_rows, words // 4, max_grid_y=max_grid_y)
        launcher = _launcher("vec", 0, out.dtype, index.dtype)
        params = [*_p2(out.data_ptr(), n_rows, words, 4),
                  *_p2(residual.data_ptr(), n_rows, words, 4),
                  *_p2(gate.data_ptr(), n_gate, words, 4),
                  *_p2(y.data_ptr(), n_rows, words, 4), *tail]
    else:
        grid, block = forward_geometry(n_rows, width)
        launcher = _launcher("elements", 0, out.dtype, index.dtype)
        params = [*_p2(out.data_ptr(), n_rows, width, itemsize),
                  *_p2(residual.data_ptr(), n_rows, width, itemsize),
                  *_p2(gate.data_ptr(), n_gate, width, itemsize),
                  *_p2(y.data_ptr(), n_rows, width, itemsize), *tail]
    launcher(out.get_device(), grid, block, 0, params)


def _index_mode(check_index) -> bool | str:
    """``check_index`` if it is ``True``, ``False`` or ``"sync"``; else a one-line
    :class:`OpInputError` (a typo must not turn the check off)."""
    if isinstance(check_index, bool) or (isinstance(check_index, str) and check_index == "sync"):
        return check_index
    raise OpInputError(f'gate_residual: check_index must be True, False or "sync", '
                       f"got {check_index!r}")


def _device_flag(device: torch.device, check_index) -> torch.Tensor:
    """The flag the kernels set on an out-of-range index: the checked one for
    ``check_index=True`` (see :func:`_assert_index`), else the sink nobody reads."""
    checked, sink = _flags(device)
    return checked if check_index is True else sink


def _assert_index(device: torch.device, check_index) -> None:
    """For ``check_index=True``: fail at the next synchronisation if a kernel set the flag."""
    if check_index is True:
        torch._assert_async(_flags(device)[0],
                            "gate_residual: index holds a value outside [0, G)")


def _forward(residual, gate, y, index, check_index) -> torch.Tensor:
    """The forward on inputs :func:`check_inputs` accepted (contiguous, one device)."""
    out = torch.empty_like(residual)
    if out.shape[0] == 0 or out.shape[1] == 0:
        return out
    _launch_forward(out, residual, gate, y, index, _device_flag(out.device, check_index))
    _assert_index(out.device, check_index)
    return out


def gate_residual_forward(residual, gate, y, index, *, check_index: bool | str = True):
    """``residual + gate.index_select(0, index) * y`` with the numba.cuda forward kernel.

    Args: ``residual``, ``y``: (N, D) CUDA tensors; ``gate``: (G, D); ``index``: (N,) int64
    or int32 in [0, G); one floating dtype (bfloat16, float16 or float32) for all three.
    Non-contiguous inputs are made contiguous. Returns a new (N, D) tensor, bitwise equal to
    eager. Raises :class:`kernels.errors.OpInputError` (a ``ValueError``) for bad input.

    ``check_index``: ``True`` (default) checks every index on the device, without a
    synchronisation: an index outside [0, G) fails ``torch._assert_async`` at the next
    synchronisation, as eager's ``index_select`` fails with a device-side assert (the CUDA
    context is unusable afterwards in both). ``"sync"`` reads the range back first and
    raises ``OpInputError`` at once (one synchronisation). ``False`` checks nothing: rows
    with an out-of-range index come out NaN, and ``gate`` is never read outside its rows.
    """
    check_index = _index_mode(check_index)
    residual, gate, y, index = check_inputs(residual, gate, y, index, device="cuda",
                                            check_index=check_index == "sync")
    return _forward(residual, gate, y, index, check_index)


def gate_residual_backward(grad_out, gate, y, index, *, check_index: bool | str = True):
    """(grad_y, grad_gate) for upstream ``grad_out`` (N, D), with the numba.cuda kernels.

    Args: ``grad_out``, ``y``: (N, D) CUDA tensors of one floating dtype (bfloat16, float16
    or float32), ``gate``: (G, D) of that dtype, ``index``: (N,) int64 or int32 in [0, G).
    Returns ``grad_y`` (N, D), bitwise equal to eager's, and ``grad_gate`` (G, D),
    deterministic: float32 sums in :data:`SUMMATION_ORDER`, rounded once. Scratch: one
    float32 buffer of n_chunks(N) * G * D elements. Raises :class:`kernels.errors.OpInputError`
    (one line) for bad input. ``check_index`` as in :func:`gate_residual_forward`; with
    ``False``, rows with an out-of-range index give NaN ``grad_y`` rows and add nothing to
    ``grad_gate``.
    """
    check_index = _index_mode(check_index)
    grad_out, gate, y, index = check_backward_inputs(grad_out, gate, y, index, device="cuda",
                                                     check_index=check_index == "sync")
    grads = _backward(grad_out, gate, y, index, _device_flag(grad_out.device, check_index))
    _assert_index(grad_out.device, check_index)
    return grads


def _backward(grad_out, gate, y, index, flag):
    """The backward on inputs :func:`check_backward_inputs` accepted (contiguous, one
    device); ``flag``: the uint8 flag the kernel sets on an out-of-range index."""
    n_rows, width = grad_out.shape
    n_gate = gate.shape[0]
    grad_y = torch.empty_like(grad_out)
    grad_gate = torch.empty_like(gate)
    if width == 0 or n_gate == 0:
        return grad_y, grad_gate
    chunks = n_chunks(n_rows)
    partial = torch.empty((chunks, n_gate, width), dtype=torch.float32,
                          device=grad_out.device)
    device = grad_out.get_device()
    itemsize = grad_out.element_size()
    partial_params = _p3(partial.data_ptr(), chunks, n_gate, width)
    if chunks:
        tail = (*_p1(index.data_ptr(), n_rows, index.element_size()),
                *_p1(flag.data_ptr(), 1, 1))
        lanes = 4 * LANE_CODECS[_dtype_name(grad_out)][3]
        if shared_fits(n_gate * lanes) and _vec_ok(grad_y, grad_out, gate, y):
            words = width * itemsize // 4
            grid, block, shared = backward_vec_geometry(chunks, words // 4, n_gate, lanes)
            launcher = _launcher("vec", 1, grad_out.dtype, index.dtype)
            params = [*_p2(grad_y.data_ptr(), n_rows, words, 4), *partial_params,
                      *_p2(grad_out.data_ptr(), n_rows, words, 4),
                      *_p2(gate.data_ptr(), n_gate, words, 4),
                      *_p2(y.data_ptr(), n_rows, words, 4), *tail]
        else:
            if shared_fits(n_gate):
                grid, block, shared = backward_geometry(chunks, width, n_gate)
                launcher = _launcher("elements", 1, grad_out.dtype, index.dtype)
            else:  # accumulators in global memory (same order, same bits)
                (grid, block), shared = forward_geometry(chunks, width), 0
                launcher = _launcher("elements", 3, grad_out.dtype, index.dtype)
            params = [*_p2(grad_y.data_ptr(), n_rows, width, itemsize), *partial_params,
                      *_p2(grad_out.data_ptr(), n_rows, width, itemsize),
                      *_p2(gate.data_ptr(), n_gate, width, itemsize),
                      *_p2(y.data_ptr(), n_rows, width, itemsize), *tail]
        launcher(device, grid, block, shared, params)
    grid, block = reduce_geometry(grad_gate.numel())
    launcher = _launcher("elements", 2, grad_out.dtype, index.dtype)
    launcher(device, (grid, 1), block, 0,
             [*_p2(grad_gate.data_ptr(), n_gate, width, itemsize), *partial_params])
    return grad_y, grad_gate


class GateResidual(torch.autograd.Function):
    """Autograd Function: forward and backward with the numba.cuda kernels.

    ``GateResidual.apply(residual, gate, y, index, check_index=True)`` -> out (N, D).
    Gradients flow to ``residual`` (``grad_out`` itself), ``gate`` and ``y``; ``index`` has
    none. ``check_index`` as in :func:`gate_residual_forward`.
    """

    @staticmethod
    def forward(ctx, residual, gate, y, index, check_index=True):
        check_index = _index_mode(check_index)
        residual, gate, y, index = check_inputs(residual, gate, y, index, device="cuda",
                                                check_index=check_index == "sync")
        ctx.save_for_backward(gate, y, index)
        return _forward(residual, gate, y, index, check_index)

    @staticmethod
    def backward(ctx, grad_out):
        gate, y, index = ctx.saved_tensors
        grad_out = check_grad_out(grad_out, y)
        # The forward checked the index (or was told not to): the sink flag, no check.
        grad_y, grad_gate = _backward(grad_out, gate, y, index, _flags(grad_out.device)[1])
        return grad_out, grad_gate, grad_y, None, None


def gate_residual(residual, gate, y, index, *, check_index: bool | str = True):
    """Differentiable ``residual + gate.index_select(0, index) * y`` (numba.cuda kernels).

    Same arguments, result and errors as :func:`gate_residual_forward`; use it inside
    autograd graphs. Example: ``out = gate_residual(r, g, y, idx); out.backward(grad)``.
    """
    return GateResidual.apply(residual, gate, y, index, check_index)


__all__ = [
    "CHUNK_ROWS",
    "FORWARD_MAX_GRID_Y",
    "FORWARD_ROWS_PER_STEP",
    "SUMMATION_ORDER",
    "GateResidual",
    "gate_residual",
    "gate_residual_backward",
    "gate_residual_forward",
    "kernels_for",
    "launch_backward",
    "launch_backward_vec",
    "launch_forward",
    "launch_forward_vec",
    "n_chunks",
    "vec_kernels_for",
]
