"""The float32 instructions of the libraries' Triton RMSNorm kernels, for numba.cuda.

Triton 3.6 lowers ``/`` on float32 to ``div.full.f32`` (an approximation with at most 2 ULP
of error, not IEEE division), ``tl.sqrt`` to ``sqrt.approx.ftz.f32`` and ``tl.rsqrt`` to
``rsqrt.approx.ftz.f32``, and contracts ``x * x + acc`` into ``fma.rn.f32`` (PTX read from
``triton.compile`` for ``cuda:90``, see ``kernels/rms_norm_order.py``). numba.cuda has no
such operations (``/`` is IEEE ``div.rn.f32`` and ``math.sqrt`` ``sqrt.rn.f32``), so each is
emitted here as that one PTX instruction through inline assembly; ``fma_rn`` is libdevice's
``__nv_fmaf`` (``fma.rn.f32``). Results of the approximate instructions are defined by the
hardware, not by a formula: the CPU side (``kernels/rms_norm_cpu.py``) uses correctly rounded
division and square root instead.

``div_rn`` / ``sqrt_rn`` (IEEE, ``div.rn.f32`` / ``sqrt.rn.f32``) are what our backward uses,
so that its bits are the same on the GPU and the CPU.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) every name is a numpy function with
correctly rounded results and the GPU's canonical NaN: the simulator checks the kernels'
indexing and summation order against the CPU twin, not the approximations.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import libdevice, types
    from numba.cuda.extending import intrinsic

    _F32 = ir.FloatType()

    def _asm(text: str, arity: int):
        """An intrinsic ``f(a[, b]) -> float32`` that is the single PTX instruction ``text``."""
        constraints = ",".join(["=f"] + ["f"] * arity)

        def typer(typingctx, *args):
            sig = types.float32(*([types.float32] * arity))

            def codegen(context, builder, sig, args):
                values = [context.cast(builder, a, t, types.float32)
                          for a, t in zip(args, sig.args, strict=True)]
                asm = ir.InlineAsm(ir.FunctionType(_F32, [_F32] * arity), text, constraints)
                return builder.call(asm, values)

            return sig, codegen

        return typer

    @intrinsic
    def div_full(typingctx, a, b):
        """float32 ``a / b`` as Triton's ``/``: ``div.full.f32`` (at most 2 ULP of error)."""
        return _asm("div.full.f32 $0, $1, $2;", 2)(typingctx, a, b)

    @intrinsic
    def sqrt_approx(typingctx, a):
        """float32 square root as Triton's ``tl.sqrt``: ``sqrt.approx.ftz.f32``."""
        return _asm("sqrt.approx.ftz.f32 $0, $1;", 1)(typingctx, a)

    @intrinsic
    def rsqrt_approx(typingctx, a):
        """float32 ``1 / sqrt(a)`` as Triton's ``tl.rsqrt``: ``rsqrt.approx.ftz.f32``."""
        return _asm("rsqrt.approx.ftz.f32 $0, $1;", 1)(typingctx, a)

    @cuda.jit(device=True, inline="always")
    def fma_rn(a, b, c):
        """float32 ``a * b + c`` with one rounding (``fma.rn.f32``)."""
        return libdevice.fmaf(a, b, c)

    @cuda.jit(device=True, inline="always")
    def div_rn(a, b):
        """float32 ``a / b`` correctly rounded (``div.rn.f32``)."""
        return libdevice.fdiv_rn(a, b)

    @cuda.jit(device=True, inline="always")
    def sqrt_rn(a):
        """float32 square root correctly rounded (``sqrt.rn.f32``)."""
        return libdevice.fsqrt_rn(a)

else:  # pragma: no cover - exercised only with NUMBA_ENABLE_CUDASIM=1
    _NAN = np.uint32(0x7FFFFFFF).view(np.float32)

    def _canon(x):
        x = np.float32(x)
        return _NAN if x != x else x

    def _fma64(a, b, c):
        """float32 fma through float64 with round-to-odd (exact: 53 >= 2 * 24 + 2)."""
        p = np.float64(a) * np.float64(b)
        s = p + np.float64(c)
        if not np.isfinite(s):
            return s
        bb = s - p
        err = (p - (s - bb)) + (np.float64(c) - bb)
        if err != 0 and (int(np.float64(s).view(np.uint64)) & 1) == 0:
            s = np.nextafter(s, np.inf if err > 0 else -np.inf)
        return s

    def fma_rn(a, b, c):
        with np.errstate(all="ignore"):
            return _canon(np.float32(_fma64(a, b, c)))

    def div_rn(a, b):
        with np.errstate(all="ignore"):
            return _canon(np.float32(a) / np.float32(b))

    def sqrt_rn(a):
        with np.errstate(all="ignore"):
            return _canon(np.sqrt(np.float32(a)))

    div_full = div_rn
    sqrt_approx = sqrt_rn

    def rsqrt_approx(a):
        return div_rn(np.float32(1.0), sqrt_rn(a))


__all__ = ["div_full", "div_rn", "fma_rn", "rsqrt_approx", "sqrt_approx", "sqrt_rn"]
