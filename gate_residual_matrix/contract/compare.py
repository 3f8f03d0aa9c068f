"""Bitwise comparison and accuracy figures for two tensors.

Everything "bitwise" here compares integer views of the storage (int16 for bfloat16 and
float16, int32 for float32, int64 for float64), never values: NaN payloads, +0.0 vs -0.0
and subnormals all count. Field meanings: ``docs/report-format.md``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

from gate_residual_matrix.contract.row_blocks import RowBlocks

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """Signed-integer view of a floating tensor's bits (same shape); integers pass through."""
    return t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t


_SIDE_STREAMS: dict = {}


_PINNED: dict = {}
_CHUNK = 1 << 25
"""Bytes per device-to-host copy of :func:`tensor_sha256` (one pinned buffer per thread)."""


def _sha256_cuda(t: torch.Tensor) -> str:
    """sha256 of a CUDA tensor's bytes (row-major), copied to the host in :data:`_CHUNK`
    pieces through a pinned buffer of the calling thread, each piece hashed after its copy.

    The copies run on a side stream of the thread that first waits for the work queued so
    far on the current stream (so ``t`` is complete). Each piece's copy, and only the copy,
    holds :data:`contract.gpu_lock.COPIES` and the shared GPU lock, so no copy overlaps a
    timing loop, and a process that asks for the GPU alone waits for at most one piece's
    copy, not for a whole tensor's hashing (at N = 32768 a tensor is 352 MB of bf16).
    Pinned, asynchronous copies matter here: a pageable copy of a 352 MB tensor kept the
    driver's lock for its whole length, and the cell's own CUDA calls waited on it (py-spy
    with native frames on the H200 at 2b61cde: ``pthread_rwlock_wrlock`` inside libcuda
    under the cell's accuracy and runs)."""
    import threading

    from gate_residual_matrix.contract import gpu_lock

    thread = threading.get_ident()
    key = (thread, t.device.index)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = torch.cuda.Stream(device=t.device)
    buffer = _PINNED.get(key)
    if buffer is None:
        buffer = _PINNED[key] = torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True)
    digest = hashlib.sha256()
    with gpu_lock.COPIES, gpu_lock.shared():  # never during a timing loop (contract/gpu_lock.py)
        stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            raw = t.contiguous().reshape(-1).view(torch.uint8)
    for start in range(0, raw.numel(), _CHUNK):
        length = min(_CHUNK, raw.numel() - start)
        with gpu_lock.COPIES, gpu_lock.shared():
            with torch.cuda.stream(stream):
                buffer[:length].copy_(raw[start:start + length], non_blocking=True)
            stream.synchronize()
        digest.update(buffer[:length].numpy())
    return digest.hexdigest()


def tensor_sha256(t: torch.Tensor | RowBlocks) -> str:
    """sha256 hex digest of a tensor's bytes (contiguous, row-major; a CUDA tensor's copied
    to the host piece by piece: :func:`_sha256_cuda`; a :class:`~contract.row_blocks.RowBlocks`
    hashed block after block, the digest of the whole tensor's bytes)."""
    if isinstance(t, RowBlocks):
        digest = hashlib.sha256()
        for _, block in t.blocks():
            digest.update(_host_bytes(block))
        return digest.hexdigest()
    t = t.detach()
    if t.is_cuda:
        return _sha256_cuda(t)
    return hashlib.sha256(_host_bytes(t)).hexdigest()


def _host_bytes(t: torch.Tensor):
    """A CPU tensor's bytes, row-major, as a numpy uint8 array (no copy when contiguous)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().reshape(-1).view("u1")


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Map float bits to int64 so that adjacent representable values differ by 1.

    Non-negative floats keep their magnitude bits; negative ones map to ``-magnitude - 1``,
    so +0.0 -> 0 and -0.0 -> -1: the ULP distance counts the two zeros one apart, matching
    the bitwise view in which they differ.
    """
    width = t.element_size() * 8
    raw = bits(t).to(torch.int64)
    sign_mask = 1 << (width - 1)
    magnitude = raw & (sign_mask - 1)
    return torch.where(raw < 0, -magnitude - 1, magnitude)


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(x)


_CMP_BLOCK = 1 << 22
"""Elements per block of :func:`bitwise`: its temporaries (indices and int64 views of the
elements that differ) stay a few tens of MB; whole, at N = 32768 they were several 1.4 GB
tensors where most elements differ, the CPU cell's peak after the reference went by rows."""


def bitwise(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Compare two tensors of one shape and dtype bit for bit.

    Returns the report's CMP object: ``equal``, ``differ``, ``numel``, ``max_abs`` (float or
    ``"inf"``), ``max_ulp`` (int or None), ``nan_differ`` (differing elements with a NaN on either
    side), ``nan_payload_differ`` (of those, NaN on both sides with other bits) and
    ``first_differ`` (flat index or None). Computed in blocks of :data:`_CMP_BLOCK` elements
    (every figure is a count, a max or the first index: the same as over the whole tensor).
    Raises ``ValueError`` when shapes or dtypes differ.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype}"
        )
    if a.device != b.device:
        b = b.to(a.device)
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    block = _CMP_BLOCK * (16 if a.is_cuda else 1)
    parts = [_bitwise_block(a_flat[i:i + block], b_flat[i:i + block], i)
             for i in range(0, a_flat.numel(), block)]
    differ = sum(p["differ"] for p in parts)
    abs_values = [p["max_abs"] for p in parts if p["max_abs"] is not None]
    ulps = [p["max_ulp"] for p in parts if p["max_ulp"] is not None]
    return {
        "equal": differ == 0,
        "differ": differ,
        "numel": int(a.numel()),
        "max_abs": _num(max(abs_values)) if abs_values else 0.0,
        "max_ulp": (max(ulps) if ulps else None) if differ else 0,
        "nan_differ": sum(p["nan_differ"] for p in parts),
        "nan_payload_differ": sum(p["nan_payload_differ"] for p in parts),
        "first_differ": next((p["first"] for p in parts if p["first"] is not None), None),
    }


def _bitwise_block(a: torch.Tensor, b: torch.Tensor, offset: int) -> dict:
    """:func:`bitwise`'s figures of one block (flat, ``offset``: its first element's index):
    ``max_abs`` and ``max_ulp`` None where no element (no non-NaN one) differs."""
    where = torch.nonzero(bits(a) != bits(b)).reshape(-1)
    out: dict[str, Any] = {"differ": int(where.numel()), "max_abs": None, "max_ulp": None,
                           "nan_differ": 0, "nan_payload_differ": 0,
                           "first": offset + int(where[0]) if where.numel() else None}
    if not where.numel():
        return out
    if not a.is_floating_point():
        out["max_abs"] = float((a[where] - b[where]).abs().max())
        return out
    da, db = a[where], b[where]
    nan_a, nan_b = torch.isnan(da), torch.isnan(db)
    out["nan_differ"] = int((nan_a | nan_b).sum())
    out["nan_payload_differ"] = int((nan_a & nan_b).sum())
    keep = ~(nan_a | nan_b)
    if bool(keep.any()):
        da, db = da[keep], db[keep]
        with torch.no_grad():
            diff = (da.double() - db.double()).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        out["max_abs"] = float(diff.max())
        out["max_ulp"] = int((ordered(da) - ordered(db)).abs().max())
    return out


def ulp_at(x: float, dtype: torch.dtype) -> float:
    """One unit in the last place of ``dtype`` at magnitude ``x`` (>= the smallest normal).

    ulp(x) = eps * 2**floor(log2 |x|), eps from ``torch.finfo`` (bfloat16 2**-7, float16
    2**-10, float32 2**-23); below the smallest normal it is the subnormal spacing.
    """
    info = torch.finfo(dtype)
    x = abs(x)
    if x < info.smallest_normal or x == 0:
        return info.smallest_normal * info.eps
    if math.isinf(x):
        return math.inf
    return info.eps * 2.0 ** math.floor(math.log2(x))


_BLOCK = 1 << 22
"""Elements per block of :func:`accuracy` (32 MiB of float64): at N = 32768 a whole-tensor pass
allocates 1.4 GB per temporary, and the CPU cell spent half its time there."""


def _block_pairs(got: torch.Tensor, ref: torch.Tensor | RowBlocks, block: int):
    """``(got, ref)`` pieces, flat, in order: elements ``[i, i + block)`` of both, ``got``
    moved to the reference's device. A :class:`~contract.row_blocks.RowBlocks` reference
    computes the rows that hold each piece (the pieces, and so the figures' sums, are the
    same as a whole tensor's)."""
    flat_got = got.to(ref.device).reshape(-1)
    if isinstance(ref, RowBlocks):
        width = max(ref.numel() // max(ref.shape[0], 1), 1)  # elements per row
        for start in range(0, ref.numel(), block):
            stop = min(start + block, ref.numel())
            first, last = start // width, -(-stop // width)
            rows = ref.rows(first, last).reshape(-1)
            yield (flat_got[start:stop],
                   rows[start - first * width:stop - first * width])
        return
    flat_ref = ref.detach().reshape(-1)
    for start in range(0, flat_ref.numel(), block):
        yield flat_got[start:start + block], flat_ref[start:start + block]


def _block_figures(g: torch.Tensor, r: torch.Tensor, limit: float,
                   on_gpu: bool) -> torch.Tensor:
    """One block's figures for :func:`accuracy`, as a float64 tensor on the block's device:
    elements compared, any non-finite error, max error, max ``|ref|``, max relative error, and
    the sums of squares of ``ref`` and of the error (over fresh tensors: MKL's dot gives other
    last bits on data that is not 16-byte aligned, and a block of rows of a
    :class:`~contract.row_blocks.RowBlocks` starts mid-row)."""
    r = r.to(torch.float64)
    g = g.to(torch.float64)
    magnitude = r.abs()
    keep = torch.isfinite(r) & (magnitude <= limit)
    if on_gpu or not bool(keep.all()):  # on the CPU a check is free, three passes not
        r, g, magnitude = (torch.where(keep, t, 0.0) for t in (r, g, magnitude))
    err = (g - r).abs_()  # 0 where left out: adds nothing to a max or a sum
    rel = torch.where(magnitude != 0, err / magnitude, 0.0)  # 0 stands in for ref == 0
    err_max = err.max()  # NaN if any is (max propagates NaN), +inf if any is: a non-finite
    return torch.stack([  # error shows in the max, one pass fewer
        keep.sum().to(torch.float64), (~torch.isfinite(err_max)).to(torch.float64),
        err_max, magnitude.max(), rel.max(), torch.dot(magnitude, magnitude),
        torch.dot(err, err)])


def accuracy(a: torch.Tensor, ref: torch.Tensor | RowBlocks) -> dict:
    """Error of ``a`` (any float dtype) against a float64 reference of the same shape.

    Over elements where ``ref`` is finite and within the range of ``a``'s dtype (an overflow
    that the storage dtype cannot hold is not an error of the implementation): ``max_abs``,
    ``max_rel`` (max |a-ref|/|ref| where ref != 0), ``rel_l2`` (||a-ref||_2 / ||ref||_2) and
    ``max_abs_ulps`` (max_abs over one ULP of ``a``'s dtype at max |ref|). Non-finite ``a``
    where ``ref`` is finite makes the figures ``"inf"``. ``finite`` counts the elements compared.
    Computed on ``ref``'s device (a GPU reference: on the GPU), in blocks of :data:`_BLOCK`
    elements (16 times that on a GPU); a :class:`~contract.row_blocks.RowBlocks` reference
    computes the rows of each block when it is reached (the same blocks, the same figures).
    Elements left out are zeroed rather than gathered, and
    each block's figures stay on the device until one transfer at the end: on the H200 a
    synchronisation per figure waited behind the hashing threads' device-to-host copies
    (py-spy at 5a2246c: 21.6 s of a cell in this function). The sums of squares add up per
    block, in float64 (:func:`_block_figures`).

    Raises:
        ValueError: ``a`` and ``ref`` differ in shape.
    """
    if a.numel() != ref.numel() or (isinstance(ref, RowBlocks)
                                     and tuple(a.shape) != tuple(ref.shape)):
        raise ValueError(f"accuracy: shapes differ, {tuple(a.shape)} against the reference's "
                         f"{tuple(ref.shape)}")
    got = a.detach()
    dtype = got.dtype
    limit = torch.finfo(dtype).max
    on_gpu = ref.device.type != "cpu"
    per_block = []
    for g, r in _block_pairs(got, ref, _BLOCK * 16 if on_gpu else _BLOCK):
        per_block.append(_block_figures(g, r, limit, on_gpu))
    out = {"max_abs": 0.0, "max_rel": 0.0, "rel_l2": 0.0, "max_abs_ulps": 0.0, "finite": 0}
    if not per_block:
        return out
    rows = torch.stack(per_block).cpu().tolist()  # the one synchronisation
    count = int(sum(row[0] for row in rows))
    out["finite"] = count
    if count == 0:
        return out
    if any(row[1] for row in rows):
        return {**out, "max_abs": "inf", "max_rel": "inf", "rel_l2": "inf",
                "max_abs_ulps": "inf"}
    max_abs, max_ref, max_rel = (max(row[k] for row in rows) for k in (2, 3, 4))
    norm = math.sqrt(sum(row[5] for row in rows))
    out["max_abs"] = max_abs
    out["max_rel"] = max_rel
    out["rel_l2"] = math.sqrt(sum(row[6] for row in rows)) / norm if norm else 0.0
    out["max_abs_ulps"] = max_abs / ulp_at(max_ref, dtype) if dtype != torch.float64 else 0.0
    return out
