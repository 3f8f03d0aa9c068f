"""The summation orders of the RMSNorm kernels: which thread adds which squares, in what order.

Our forward kernels reproduce, bit for bit, two rollout engines' Triton kernels: vLLM's
batch-invariant RMSNorm (``_rms_norm_kernel`` of ``rms_norm_batch_invariant`` in
``vllm/model_executor/determinism/batch_invariant.py``) for ``rms_norm`` and ``add_rms_norm``,
and vllm-omni's ``_rms_norm_indexed_scale_shift_kernel`` (``rms_norm_indexed_scale_shift``)
for ``rms_norm_scale_shift``. Their bits are decided by how Triton lowers ``tl.sum`` for
their block size and warp count, read from the TTGIR and PTX that triton 3.6.0 emits for
``cuda:90`` (``scripts/rms_norm_probe.py`` checks the result on the GPU):

* Layout: ``#blocked<{sizePerThread = [S], threadsPerWarp = [32], warpsPerCTA = [W]}>`` with
  S elements of 16 bytes (8 for bfloat16/float16, 4 for float32). vLLM: a block of 1024
  columns per ``tl.sum``, ``num_warps`` 4 (T = 128 threads); vllm-omni: one block of
  ``next_power_of_2(D)`` columns, ``num_warps`` 8 (T = 256), S capped at block / T.
  Thread ``t`` of a block holds, in register order, the columns
  ``j * S * T + t * S + k`` for repetitions ``j`` then ``k < S``; columns at or beyond D are
  masked loads of 0.0. We call the ``S * T`` columns of one repetition a *slot*: slot ``s`` of
  the row covers columns ``s*S*T .. (s+1)*S*T - 1`` and block ``c`` holds slots
  ``c * R .. c * R + R - 1`` (R = block / (S * T)).
* Per thread, per block (the *chain*): the squares of its elements e_0, e_1, ... in register
  order: ``acc = fma(e0, e0, e1 * e1)`` (the square of e1 rounded, e0's fused), then
  ``acc = fma(ek, ek, acc)`` for the next elements of its first ``FUSED`` and
  ``acc = (ek * ek) + acc`` (square rounded, then the add) for the rest. FUSED is every
  element for vllm-omni and for vLLM's bfloat16/float16 (one vector per thread per block);
  for vLLM's float32 (two vectors per thread per block) only the first vector is fused:
  the ``tl.where`` mask of the second vector sits between its multiply and the add, so LLVM
  does not contract them.
* Then the 32 lanes of a warp: butterfly ``acc += shfl.bfly(acc, o)`` for o = 16, 8, 4, 2, 1
  (``add.f32``); lane 0 of each warp stores its sum to shared memory; after a barrier the
  W warp sums are combined by the same butterfly (o = W/2 .. 1), i.e. at lane 0
  ``((w0 + w2) + (w1 + w3))`` for W = 4 and ``(((w0 + w4) + (w2 + w6)) + ((w1 + w5) + (w3 +
  w7)))`` for W = 8. Float addition commutes, so every lane holds the same bits.
* vLLM: ``sum_sq = 0; sum_sq += block_sum`` over blocks in increasing order; then
  ``1.0 / tl.sqrt(sum_sq / n_cols + eps)``, which Triton emits as ``div.full.f32``,
  ``add.f32``, ``sqrt.approx.ftz.f32``, ``div.full.f32`` and ptxas (sm_90a SASS) as
  ``inv = RCP(SQRT(fma(sum_sq, RCP(D), eps)))``: ``div.full`` is a multiply by ``MUFU.RCP``
  (its operand scaling never applies here), and ptxas contracts that multiply with the
  ``+ eps``; ``out = round((x * inv) * w)`` (two ``mul.f32``, then ``cvt.rn``).
* vllm-omni: ``r = RSQ(fma(sum, RN(1 / D), eps))`` (``hidden_size`` is a constexpr, so
  ptxas folds the ``div.full`` into a multiply by the correctly rounded reciprocal of D,
  again contracted with the ``+ eps``); ``n = (x * r) * w``;
  ``out = round(fma(n, 1.0 + scale[index], shift[index]))``.

``RCP``, ``SQRT``, ``RSQ`` are the hardware approximations ``MUFU.RCP``, ``MUFU.SQRT``,
``MUFU.RSQ`` (PTX ``rcp/sqrt/rsqrt.approx.ftz.f32``); ``eps`` is float32 (1e-6 is
``0x358637BD``). Our GPU kernels emit those very instructions (inline PTX,
``kernels/rms_norm_ptx.py``) and every other multiply and add explicitly, so the SASS is the
same operations; the CPU twins use the correctly rounded reciprocal and square root instead
(``RSQ`` as ``1 / sqrt``, two roundings), so their bits can differ from the GPU's in ``inv``
or ``r`` and then in every output of that row. The sums of squares are the same bits on
both.

Triton chooses S from the divisibility of D and the row stride by 16: the orders above are
the libraries' for D a multiple of 16 (the MiniMax-H3 D = 5376 is); for other D our kernels
keep the same order (element loads instead of 16-byte vectors), which Triton does not.

Example::

    >>> vllm_layout(5376, 2).slots, omni_layout(5376, 2).slots
    (6, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

#: Columns per ``tl.sum`` in vLLM's ``rms_norm_batch_invariant`` (``BLOCK_SIZE``).
VLLM_BLOCK = 1024
#: Warps of vLLM's launch (Triton's default ``num_warps``).
VLLM_WARPS = 4
#: Warps of vllm-omni's launch (``num_warps=8``).
OMNI_WARPS = 8
#: float32 ``eps`` the ops use (``EPS`` of the ops), rounded to float32 by the kernels.
EPS = 1e-6


@dataclass(frozen=True)
class Layout:
    """Which thread holds which columns, and how its squares are chained.

    ``d``: columns; ``threads``: T (32 * warps); ``size``: S, consecutive columns a thread
    holds per slot; ``block``: columns per ``tl.sum``; ``fused``: leading elements of a
    thread's chain per block that are accumulated with ``fma`` (the rest: square rounded,
    then added). Slot ``s`` covers columns ``s * S * T + t * S + k``.
    """

    d: int
    threads: int
    size: int
    block: int
    fused: int

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def span(self) -> int:
        """Columns of one slot (S * T)."""
        return self.size * self.threads

    @property
    def reps(self) -> int:
        """Slots per block (R)."""
        return max(1, self.block // self.span)

    @property
    def slots(self) -> int:
        """Slots that hold at least one column < D: ceil(D / (S * T))."""
        return -(-self.d // self.span)

    @property
    def blocks(self) -> int:
        """Blocks (``tl.sum`` calls) per row with at least one column < D."""
        return -(-self.slots // self.reps)


def vector_elements(itemsize: int) -> int:
    """Elements in 16 bytes: 8 for bfloat16/float16, 4 for float32."""
    return 16 // itemsize


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1), as ``triton.next_power_of_2``."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def vllm_layout(d: int, itemsize: int) -> Layout:
    """Layout of vLLM's ``_rms_norm_kernel`` (BLOCK_SIZE 1024, 4 warps) for D columns."""
    size = vector_elements(itemsize)
    return Layout(d=d, threads=32 * VLLM_WARPS, size=size, block=VLLM_BLOCK, fused=size)


def omni_layout(d: int, itemsize: int) -> Layout:
    """Layout of vllm-omni's ``_rms_norm_indexed_scale_shift_kernel`` (block_n =
    next_power_of_2(D), 8 warps) for D columns."""
    threads = 32 * OMNI_WARPS
    block = next_power_of_2(max(d, 1))
    size = max(1, min(vector_elements(itemsize), block // threads))
    reps = max(1, block // (size * threads))
    return Layout(d=d, threads=threads, size=size, block=block, fused=size * reps)


__all__ = ["EPS", "OMNI_WARPS", "VLLM_BLOCK", "VLLM_WARPS", "Layout", "next_power_of_2",
           "omni_layout", "vector_elements", "vllm_layout"]
