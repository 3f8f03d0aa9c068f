"""The float32 instructions of the libraries' Triton RMSNorm kernels, for numba.cuda.

Triton 3.6 lowers ``/`` on float32 to ``div.full.f32``, ``tl.sqrt`` to
``sqrt.approx.ftz.f32`` and ``tl.rsqrt`` to ``rsqrt.approx.ftz.f32``, and contracts
``x * x + acc`` into ``fma.rn.f32``; ptxas (sm_90a) then expands ``div.full.f32 a, b`` into
``MUFU.RCP`` of ``b`` times ``a`` (operands scaled first only when ``|b|`` is above 2**126 or
below 2**-126), contracts that multiply with a following ``add.f32`` into one ``FFMA``, and
folds a division by a constant into a multiply by the correctly rounded reciprocal (SASS of
the libraries' kernels, ``kernels/rms_norm_order.py``). So the whole non-IEEE part of the
libraries' RMSNorm is three hardware approximations, ``MUFU.RCP``, ``MUFU.SQRT`` and
``MUFU.RSQ``, which PTX names ``rcp.approx.ftz.f32``, ``sqrt.approx.ftz.f32`` and
``rsqrt.approx.ftz.f32``. Each is emitted here as that one instruction through inline
assembly (numba.cuda's ``/`` is IEEE ``div.rn.f32``, ``math.sqrt`` ``sqrt.rn.f32``), and
every multiply and add around them is explicit (``fma_rn``: libdevice's ``__nv_fmaf``,
``fma.rn.f32``), so no contraction decision of ptxas is left to chance. Their results are
defined by the hardware, not by a formula: the CPU side (``kernels/rms_norm_cpu.py``) uses
correctly rounded reciprocal and square root instead.

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
    def rcp_approx(typingctx, a):
        """float32 ``1 / a`` as ``MUFU.RCP``: ``rcp.approx.ftz.f32`` (what ``div.full.f32``
        multiplies by)."""
        return _asm("rcp.approx.ftz.f32 $0, $1;", 1)(typingctx, a)

    @intrinsic
    def sqrt_approx(typingctx, a):
        """float32 square root as Triton's ``tl.sqrt``: ``sqrt.approx.ftz.f32`` (``MUFU.SQRT``)."""
        return _asm("sqrt.approx.ftz.f32 $0, $1;", 1)(typingctx, a)

    @intrinsic
    def rsqrt_approx(typingctx, a):
        """float32 ``1 / sqrt(a)`` as Triton's ``tl.rsqrt``: ``rsqrt.approx.ftz.f32``
        (``MUFU.RSQ``)."""
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

    sqrt_approx = sqrt_rn

    def rcp_approx(a):
        return div_rn(np.float32(1.0), a)

    def rsqrt_approx(a):
        return div_rn(np.float32(1.0), sqrt_rn(a))


__all__ = ["div_rn", "fma_rn", "rcp_approx", "rsqrt_approx", "sqrt_approx", "sqrt_rn"]
