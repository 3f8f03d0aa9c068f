"""A numpy oracle of the RMSNorm kernels' arithmetic, written apart from the kernels.

It restates the libraries' Triton reduction (the facts of ``kernels/rms_norm_order.py``'s
docstring, read from triton 3.6's PTX) with whole-array numpy float32 operations: every row's
elements are laid out as (block, thread, register) and reduced exactly as the PTX does. Each
operation rounds to nearest even and returns the GPU's canonical NaN. ``fma`` is exact:
float64 product and sum, rounded to odd, then to float32 (53 >= 2 * 24 + 2 bits, so the
double rounding is exact).

The approximate GPU instructions (``MUFU.RCP``, ``MUFU.SQRT``, ``MUFU.RSQ``) are
parameters: correctly rounded stand-ins by default (what the CPU twin computes); a GPU test
passes functions that evaluate the real instructions on the GPU.

Values are float32 arrays holding storage-dtype values exactly; :func:`storage_bits` rounds a
result to the storage dtype and returns its bits.
"""

from __future__ import annotations

import numpy as np

NAN32 = np.uint32(0x7FFFFFFF).view(np.float32)
DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


def canon(a) -> np.ndarray:
    a = np.array(a, dtype=np.float32, copy=True)
    a[np.isnan(a)] = NAN32
    return a


def mul(a, b):
    with np.errstate(all="ignore"):
        return canon(np.float32(a) * np.float32(b))


def add(a, b):
    with np.errstate(all="ignore"):
        return canon(np.float32(a) + np.float32(b))


def fma(a, b, c):
    """float32 ``a * b + c`` with one rounding (exact, see the module docstring)."""
    with np.errstate(all="ignore"):
        p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
        c64 = np.asarray(c, np.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        even = (s.view(np.uint64) & np.uint64(1)) == 0
        bump = np.isfinite(s) & (err != 0) & even
        s = np.where(bump, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return canon(s.astype(np.float32))


def div_rn(a, b):
    with np.errstate(all="ignore"):
        return canon(np.float32(a) / np.float32(b))


def sqrt_rn(a):
    with np.errstate(all="ignore"):
        return canon(np.sqrt(np.asarray(a, np.float32)))


def rsqrt_rn(a):
    """1 / sqrt(a), two correct roundings (the CPU's stand-in for ``MUFU.RSQ``)."""
    return div_rn(np.float32(1.0), sqrt_rn(a))


def rcp_rn(a):
    """1 / a correctly rounded (the CPU's stand-in for ``MUFU.RCP``)."""
    return div_rn(np.float32(1.0), a)


def _layout(kind: str, d: int, itemsize: int) -> tuple[int, int, int, int]:
    """(threads, elements per thread per slot, columns per block, fused elements)."""
    vec = 16 // itemsize
    if kind == "vllm":  # BLOCK_SIZE 1024, num_warps 4; the first vector's squares fused
        return 128, vec, 1024, vec
    block = 1 << max(0, (max(d, 1) - 1).bit_length())  # next power of 2, num_warps 8
    size = max(1, min(vec, block // 256))
    return 256, size, max(block, 256 * size), 10**9  # every square fused


def _per_thread(x: np.ndarray, kind: str, itemsize: int):
    """``x`` (N, D) as (N, blocks, threads, registers) in ``kind``'s layout (0.0 beyond D),
    and the number of fused registers."""
    n, d = x.shape
    threads, size, block, fused = _layout(kind, d, itemsize)
    blocks = max(1, -(-d // block))
    padded = np.zeros((n, blocks * block), np.float32)
    padded[:, :d] = x
    reps = block // (threads * size)
    # column b*block + j*size*threads + t*size + k -> thread t, register j*size + k
    e = padded.reshape(n, blocks, reps, threads, size).transpose(0, 1, 3, 2, 4)
    return e.reshape(n, blocks, threads, reps * size), fused


def _butterflies(acc: np.ndarray) -> np.ndarray:
    """(N, blocks, threads) per-thread values -> (N,) block sums (lane and warp butterflies,
    lane 0), the blocks added from +0.0 in order."""
    n, blocks, threads = acc.shape
    warps = threads // 32
    lanes = acc.reshape(n, blocks, warps, 32)
    for o in (16, 8, 4, 2, 1):
        lanes = add(lanes, lanes[..., np.arange(32) ^ o])
    ws = lanes[..., 0]
    o = warps // 2
    while o:
        ws = add(ws, ws[..., np.arange(warps) ^ o])
        o //= 2
    total = np.zeros(n, np.float32)
    for b in range(blocks):
        total = add(total, ws[:, b, 0])
    return total


def sum_squares(x: np.ndarray, kind: str, itemsize: int) -> np.ndarray:
    """(N,) float32 sums of squares of the rows of ``x`` (N, D) in ``kind``'s order
    ("vllm" or "omni")."""
    e, fused = _per_thread(x, kind, itemsize)
    m = e.shape[-1]
    if m == 1:
        acc = mul(e[..., 0], e[..., 0])
    else:
        acc = fma(e[..., 0], e[..., 0], mul(e[..., 1], e[..., 1]))
    for i in range(2, m):
        ei = e[..., i]
        acc = fma(ei, ei, acc) if i < fused else add(mul(ei, ei), acc)
    return _butterflies(acc)


def row_dot(p: np.ndarray, itemsize: int) -> np.ndarray:
    """(N,) sums of the rows of ``p`` (N, D) as the backward adds them: per thread of the
    omni layout from +0.0 in register order, then the butterflies."""
    e, _ = _per_thread(p, "omni", itemsize)
    acc = np.zeros(e.shape[:-1], np.float32)
    for i in range(e.shape[-1]):
        acc = add(acc, e[..., i])
    return _butterflies(acc)


def rms_norm(x, w, itemsize, eps=1e-6, rcp=rcp_rn, sqrt=sqrt_rn):
    """vLLM order: float32 ``(x * inv) * w`` before the storage rounding, with
    ``inv = rcp(sqrt(fma(sum_sq, rcp(D), eps)))`` (the SASS of ``1.0 / tl.sqrt(sum_sq /
    n_cols + eps)``)."""
    d = x.shape[1]
    ss = sum_squares(x, "vllm", itemsize)
    inv = rcp(sqrt(fma(ss, rcp(np.full(ss.shape, d, np.float32)), np.float32(eps))))
    return mul(mul(x, inv[:, None]), w[None, :])


def rms_norm_scale_shift(x, w, scale, shift, index, itemsize, eps=1e-6, rsqrt=rsqrt_rn):
    """vllm-omni order: float32 ``fma((x * r) * w, 1 + scale[k], shift[k])`` before the
    storage rounding, ``r = rsqrt(fma(sum, RN(1 / D), eps))`` (ptxas folds the division by
    the constexpr D into a multiply by its correctly rounded reciprocal)."""
    d = x.shape[1]
    inv_d = np.float32(1.0) / np.float32(max(d, 1))
    r = rsqrt(fma(sum_squares(x, "omni", itemsize), inv_d, np.float32(eps)))
    n = mul(mul(x, r[:, None]), w[None, :])
    return fma(n, add(np.float32(1.0), scale[index]), shift[index])


def round_storage(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to the storage dtype (nearest even), as float32."""
    return bits_to_f32(storage_bits(v, dtype), dtype)


def storage_bits(v: np.ndarray, dtype: str) -> np.ndarray:
    """Bits of float32 values rounded to the storage dtype: uint16 (bfloat16, float16;
    NaN -> 0x7FFF) or uint32 (float32; NaN -> 0x7FFFFFFF)."""
    v = canon(v)
    nan = np.isnan(v)
    if dtype == "float32":
        return v.view(np.uint32)
    if dtype == "float16":
        with np.errstate(all="ignore"):
            bits = v.astype(np.float16).view(np.uint16)
    else:
        u = v.view(np.uint32).astype(np.uint64)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[nan] = 0x7FFF
    return bits


def bits_to_f32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Storage bits (uint16 or uint32) -> exact float32 values."""
    if dtype == "float32":
        return bits.astype(np.uint32).view(np.float32)
    if dtype == "float16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def backward(go, v, w, itemsize, chunk_rows, eps=1e-6, gh=None, scale=None, index=None):
    """The backward of ``kernels/rms_norm_backward.py``'s BACKWARD_ORDER, float32.

    ``go`` (N, D) upstream into ``out``; ``v`` (N, D) the normalized input (x, or h);
    ``gh`` the upstream into h (add_rms_norm) or None; ``scale`` (G, D) and ``index`` (N,)
    for rms_norm_scale_shift. Returns (dv or gh + dv (N, D) before the storage rounding,
    parameter sums (P, D) before the storage rounding: row 0 weight, then scale rows, then
    shift rows).
    """
    n, d = v.shape
    inv_d = np.float32(1.0) / np.float32(max(d, 1))
    r = div_rn(np.float32(1.0), sqrt_rn(fma(sum_squares(v, "omni", itemsize), inv_d,
                                            np.float32(eps))))[:, None]
    u = go if scale is None else mul(go, add(np.float32(1.0), scale[index]))
    nn = mul(v, r)
    gw = mul(u, w[None, :])
    coef = div_rn(mul(mul(mul(r[:, 0], r[:, 0]), r[:, 0]), row_dot(mul(gw, v), itemsize)),
                  np.float32(d))
    dv = add(mul(gw, r), -mul(v, coef[:, None]))
    if gh is not None:
        dv = add(gh, dv)
    groups = 0 if scale is None else scale.shape[0]
    terms = [mul(u, nn)]
    if groups:
        terms += [mul(go, mul(nn, w[None, :])), go]
    totals = np.zeros((1 + 2 * groups, d), np.float32)
    for start in range(0, n, chunk_rows):
        rows = np.arange(start, min(start + chunk_rows, n))
        if groups:  # rows grouped by index, each group in increasing row order
            rows = rows[np.argsort(index[rows], kind="stable")]
        acc = np.zeros_like(totals)
        for i in rows:
            acc[0] = add(acc[0], terms[0][i])
            if groups:
                k = index[i]
                acc[1 + k] = add(acc[1 + k], terms[1][i])
                acc[1 + groups + k] = add(acc[1 + groups + k], terms[2][i])
        totals = add(totals, acc)
    return dv, totals
