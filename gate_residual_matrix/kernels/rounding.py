"""Device functions that fix every rounding of the gate_residual kernels.

Two facts decide the bits (``../shared/NOTES.md``, measured on an H200 with numba-cuda 0.30.4):

* numba-cuda lets NVVM contract ``r + g * y`` into one FMA (one rounding instead of two),
  with ``fastmath=False`` too. :func:`mul_rn` and :func:`add_rn` use libdevice's
  ``__nv_fmul_rn`` / ``__nv_fadd_rn``, which emit ``mul.rn.f32`` / ``add.rn.f32``; PTX
  instructions with an explicit rounding modifier are never contracted (PTX ISA, "Floating
  Point Instructions: add/mul"). ``tests/test_contraction.py`` compiles the kernels to PTX
  and fails if an ``fma`` appears.
* Storage conversions give the results of the instructions PyTorch's ``c10::BFloat16`` /
  ``c10::Half`` use on the GPU (``cvt.rn.bf16.f32`` on sm_80+, ``cvt.rn.f16.f32``): round to
  nearest even, NaN stored as the canonical ``0x7FFF``. float16 uses ``cvt`` itself
  (``np.float16(x)``, and the intrinsics :func:`f32_from_f16_bits` / :func:`f16_bits_from_f32`
  on the 32-bit words of the vector kernels); bfloat16 the same rounding in integer
  operations (see :func:`store_bf16`).

This module imports nothing from ``kernels`` (``kernels/vector.py`` used to hold the float16
intrinsics and import this module back under the simulator: a cycle).

Each storage dtype has a ``load_*`` (storage element -> float32, exact) and a ``store_*``
(float32 -> storage element, round to nearest even). bfloat16 is held in ``int16`` arrays
(a view of the torch tensor's bits), float16 in ``float16`` arrays, float32 in ``float32``.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) libdevice functions are empty stubs and
there is no bfloat16, so the same names are bound to numpy implementations with the GPU's
semantics (float32 round to nearest even, canonical NaN ``0x7FFFFFFF`` from arithmetic, NaN
stored as ``0x7FFF``). They exist so that the kernels' indexing and summation order can be
tested without a GPU; the GPU bindings are what run on hardware.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda, float32

SIMULATOR = bool(config.ENABLE_CUDASIM)

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import libdevice, types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_from_f16_bits(typingctx, bits):
        """float16 bits in the low 16 bits of a uint32 -> float32 (``cvt.f32.f16``, exact).

        ``fpext`` on LLVM's ``half``, which NVVM lowers to ``cvt.f32.f16``: the instruction
        ``c10::Half`` uses on the GPU (``__half2float``), so the bits are eager's by
        construction; a software conversion's branches made the float16 vector kernels
        ALU-bound (H200: 0.873 ms vs 0.509 ms for bfloat16, ``docs/performance.md``).
        """
        sig = types.float32(bits)

        def codegen(context, builder, sig, args):
            low = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint32),
                                ir.IntType(16))
            return builder.fpext(builder.bitcast(low, ir.HalfType()), ir.FloatType())

        return sig, codegen

    @intrinsic
    def f16_bits_from_f32(typingctx, x):
        """float32 -> float16 bits as uint32 (``fptrunc``, lowered to ``cvt.rn.f16.f32``:
        nearest even, as ``__float2half``)."""
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            half = builder.fptrunc(args[0], ir.HalfType())
            return builder.zext(builder.bitcast(half, ir.IntType(16)), ir.IntType(32))

        return sig, codegen

    @cuda.jit(device=True, inline="always")
    def f32_from_u32(b):
        """uint32 -> the float32 with those bits."""
        return libdevice.int_as_float(np.int32(b))

    @cuda.jit(device=True, inline="always")
    def u32_from_f32(x):
        """float32 -> its bits as uint32."""
        return np.uint32(libdevice.float_as_int(x))

    @cuda.jit(device=True, inline="always")
    def rint(x):
        """float32 round to nearest integer, ties to even."""
        return libdevice.rintf(x)

    @cuda.jit(device=True, inline="always")
    def mul_rn(a, b):
        """float32 a * b rounded to nearest even; never contracted into an FMA."""
        return libdevice.fmul_rn(a, b)

    @cuda.jit(device=True, inline="always")
    def add_rn(a, b):
        """float32 a + b rounded to nearest even; never contracted into an FMA."""
        return libdevice.fadd_rn(a, b)

    @cuda.jit(device=True, inline="always")
    def load_bf16(bits):
        """bfloat16 bits (int16) -> float32, exact: the bits become the float32's top half."""
        return libdevice.int_as_float(np.int32((np.int64(bits) & 0xFFFF) << 16))

    @cuda.jit(device=True, inline="always")
    def store_bf16(x):
        """float32 -> bfloat16 bits (int16): round to nearest even; any NaN -> 0x7FFF.

        The result of ``cvt.rn.bf16.f32`` (what ``c10::BFloat16`` uses on sm_80+), in integer
        operations that NVVM inlines; numba-cuda's own ``float32_to_bfloat16_rn`` is an
        out-of-line call through local memory on every element.
        """
        u = np.int64(libdevice.float_as_int(x)) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return np.int16(0x7FFF)
        return np.int16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)

    @cuda.jit(device=True, inline="always")
    def load_f16(h):
        """float16 -> float32, exact."""
        return float32(h)

    @cuda.jit(device=True, inline="always")
    def store_f16(x):
        """float32 -> float16, ``cvt.rn.f16.f32``."""
        return np.float16(x)

    @cuda.jit(device=True, inline="always")
    def load_f32(x):
        """float32 -> float32 (identity)."""
        return x

    @cuda.jit(device=True, inline="always")
    def store_f32(x):
        """float32 -> float32 (identity)."""
        return x

else:  # pragma: no cover - exercised only with NUMBA_ENABLE_CUDASIM=1
    _CANONICAL_NAN32 = np.uint32(0x7FFFFFFF).view(np.float32)

    def _canon(x):
        x = np.float32(x)
        return _CANONICAL_NAN32 if x != x else x

    def f32_from_u32(b):
        return np.array([int(b) & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]

    def u32_from_f32(x):
        return np.array([x], dtype=np.float32).view(np.uint32)[0]

    def rint(x):
        return np.rint(np.float32(x))

    def mul_rn(a, b):
        with np.errstate(all="ignore"):
            return _canon(np.float32(a) * np.float32(b))

    def add_rn(a, b):
        with np.errstate(all="ignore"):
            return _canon(np.float32(a) + np.float32(b))

    def load_bf16(bits):
        u = np.uint32(np.uint16(np.int16(bits).view(np.uint16))) << np.uint32(16)
        return np.uint32(u).view(np.float32)

    def store_bf16(x):
        u = int(np.float32(x).view(np.uint32))
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return np.int16(0x7FFF)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return np.uint16(u & 0xFFFF).view(np.int16)

    def load_f16(h):
        return np.float32(h)

    def store_f16(x):
        x = np.float32(x)
        if x != x:
            return np.uint16(0x7FFF).view(np.float16)
        with np.errstate(all="ignore"):
            return np.float16(x)

    def load_f32(x):
        return np.float32(x)

    def store_f32(x):
        return _canon(x)


# ----------------------------------------------------------------------------------------
# Lane codecs for the vector kernels. A kernel loads 16-byte vectors and handles them as four
# 32-bit words; a word holds two bfloat16/float16 lanes or one float32 lane. Everything is
# uint32 arithmetic (numba widens + and - to 64 bits, so sums are narrowed explicitly with
# np.uint32), shared by the GPU and the simulator: only f32_from_u32, u32_from_f32, mul_rn
# and rint differ between the two.

_jit = (lambda f: f) if SIMULATOR else cuda.jit(device=True, inline="always")

U0 = np.uint32(0)
U1 = np.uint32(1)
U13 = np.uint32(13)
U16 = np.uint32(16)
HIGH16 = np.uint32(0xFFFF0000)
LOW16 = np.uint32(0xFFFF)
ABS32 = np.uint32(0x7FFFFFFF)
INF32 = np.uint32(0x7F800000)
NAN_BF16_HIGH = np.uint32(0x7FFF0000)  # bfloat16 canonical NaN 0x7FFF, in float32's top half
TWO_POW_112 = np.float32(5.192296858534828e33)
TWO_POW_24 = np.float32(16777216.0)


@_jit
def round_bf16_bits(x):
    """float32 -> float32 bits rounded to bfloat16 (low 16 bits zero): nearest even,
    overflow to inf, any NaN -> 0x7FFF0000 (``cvt.rn.bf16.f32``'s canonical NaN)."""
    u = u32_from_f32(x)
    if (u & ABS32) > INF32:
        return NAN_BF16_HIGH
    return np.uint32(u + np.uint32(0x7FFF) + ((u >> U16) & U1)) & HIGH16


@_jit
def decode_f16(b):
    """float16 bits (uint32 0..0xFFFF) -> float32, exact (subnormals, inf, NaN payload).

    The 15 magnitude bits moved into float32's place are the value times 2**-112 (for
    subnormals too); one exact multiplication by 2**112 restores it. Exponent 31 (inf, NaN)
    maps to float32's all-ones exponent instead.
    """
    magnitude = (b & np.uint32(0x7FFF)) << U13
    if (b & np.uint32(0x7C00)) == np.uint32(0x7C00):
        value = f32_from_u32(magnitude | INF32)
    else:
        value = mul_rn(f32_from_u32(magnitude), TWO_POW_112)
    return -value if (b & np.uint32(0x8000)) else value


@_jit
def encode_f16(x):
    """float32 -> float16 bits (uint32): nearest even, subnormals, overflow to inf at
    |x| >= 65520, NaN -> 0x7FFF (the results of ``cvt.rn.f16.f32``)."""
    u = u32_from_f32(x)
    sign = (u >> U16) & np.uint32(0x8000)
    a = u & ABS32
    if a > INF32:
        return np.uint32(0x7FFF)
    if a >= np.uint32(0x477FF000):
        return sign | np.uint32(0x7C00)
    if a < np.uint32(0x38800000):  # below 2**-14: multiples of 2**-24 (1024 of them is 2**-14)
        return sign | np.uint32(rint(mul_rn(f32_from_u32(a), TWO_POW_24)))
    rounded = np.uint32(a + np.uint32(0x0FFF) + ((a >> U13) & U1)) >> U13
    return sign | np.uint32(rounded - np.uint32(112 << 10))


# get(half, j) -> float32 of lane j; put(x, j) -> x encoded in lane j's place; rnd(x) -> x
# rounded to the storage dtype, as float32. j is a compile-time constant after unrolling.

@_jit
def get_bf16(h, j):
    return f32_from_u32((h << np.uint32(16 - 16 * j)) & HIGH16)


@_jit
def put_bf16(x, j):
    return round_bf16_bits(x) >> np.uint32(16 - 16 * j)


@_jit
def rnd_bf16(x):
    return f32_from_u32(round_bf16_bits(x))


if SIMULATOR:  # pragma: no cover - the software conversions, with the instructions' results
    f32_from_f16_bits, f16_bits_from_f32 = decode_f16, encode_f16
# else: the cvt.f32.f16 / cvt.rn.f16.f32 intrinsics defined at the top, as c10::Half does


@_jit
def get_f16(h, j):
    return f32_from_f16_bits((h >> np.uint32(16 * j)) & LOW16)


@_jit
def put_f16(x, j):
    return f16_bits_from_f32(x) << np.uint32(16 * j)


@_jit
def rnd_f16(x):
    return f32_from_f16_bits(f16_bits_from_f32(x))


@_jit
def get_f32(h, j):
    return f32_from_u32(h)


@_jit
def put_f32(x, j):
    return u32_from_f32(x)


@_jit
def rnd_f32(x):
    return x


#: storage dtype name -> (get, put, rnd, lanes per 32-bit word) for the vector kernels
LANE_CODECS = {
    "bfloat16": (get_bf16, put_bf16, rnd_bf16, 2),
    "float16": (get_f16, put_f16, rnd_f16, 2),
    "float32": (get_f32, put_f32, rnd_f32, 1),
}

#: storage dtype name -> (load, store, numpy dtype of the array that holds it)
CODECS = {
    "bfloat16": (load_bf16, store_bf16, np.int16),
    "float16": (load_f16, store_f16, np.float16),
    "float32": (load_f32, store_f32, np.float32),
}
