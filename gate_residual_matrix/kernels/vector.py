"""16-byte vector loads and stores for numba.cuda kernels.

numba-cuda 0.30 loads an array element with one instruction of the element's width: an
``int64`` array gives 8-byte loads, and nothing wider exists among numba's scalar types. The
gate_residual kernels are memory-bound (``docs/performance.md``), and fewer, wider memory
instructions keep more bytes in flight per thread. These intrinsics emit, through llvmlite,
an aligned ``load <4 x i32>`` / ``store <4 x i32>`` in the global address space, which NVVM
lowers to ``ld.global.v4.u32`` / ``st.global.v4.u32`` (PTX ISA, "Data Movement and
Conversion Instructions: ld / st", vector operands). ``tests/test_contraction.py`` reads the
PTX to check that they do.

The hardware float16 conversions the vector kernels use (``cvt.f32.f16`` /
``cvt.rn.f16.f32``) are in ``kernels/rounding.py``, with every other rounding; this module
imports nothing from ``kernels`` (no import cycle).

Arrays: 2-D, C-contiguous ``uint32`` (a view of the tensor's bytes; a row of D elements of
``itemsize`` bytes is ``D * itemsize / 4`` words). ``q`` counts 16-byte vectors in a row:
the vector is words ``4q .. 4q + 3``. The caller guarantees 16-byte alignment of the data
pointer and of every row (``D * itemsize % 16 == 0``) and ``0 <= row < shape[0]``,
``0 <= q < shape[1] / 4``; nothing is checked in the kernel (no wraparound either).

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the same names are plain Python over
numpy arrays.
"""

from __future__ import annotations

import numpy as np
from numba import config

SIMULATOR = bool(config.ENABLE_CUDASIM)

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)
    _V4 = ir.VectorType(_I32, 4)
    _GLOBAL = 1  # NVPTX address space of global memory

    def _vector_pointer(context, builder, sig, args):
        """Address of vector ``q`` of row ``row`` of a 2-D array, as ``<4 x i32> addrspace(1)*``."""
        array_type, row_type, q_type = sig.args[:3]
        array = context.make_array(array_type)(context, builder, value=args[0])
        stride0 = cgutils.unpack_tuple(builder, array.strides, 2)[0]
        row = context.cast(builder, args[1], row_type, types.intp)
        q = context.cast(builder, args[2], q_type, types.intp)
        offset = builder.add(builder.mul(row, stride0), builder.mul(q, ir.Constant(_I64, 16)))
        address = builder.add(builder.ptrtoint(array.data, _I64), offset)
        return builder.inttoptr(address, ir.PointerType(_V4, addrspace=_GLOBAL))

    def _check_array(array):
        if not (isinstance(array, types.Array) and array.ndim == 2
                and array.dtype == types.uint32):
            raise TypeError(f"16-byte vector access needs a 2-D uint32 array, got {array}")

    @intrinsic
    def load_vec(typingctx, array, row, q):
        """``(w0, w1, w2, w3)``: the four uint32 words of vector ``q`` of ``row``, one load."""
        _check_array(array)
        sig = types.UniTuple(types.uint32, 4)(array, row, q)

        def codegen(context, builder, sig, args):
            vec = builder.load(_vector_pointer(context, builder, sig, args), align=16)
            words = [builder.extract_element(vec, ir.Constant(_I32, i)) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, words)

        return sig, codegen

    @intrinsic
    def load_vec_cg(typingctx, array, row, q):
        """:func:`load_vec` through L2 only: ``ld.global.cg.v4.u32`` (PTX ISA, "Cache
        Operators": cache in L2, not in L1), as inline assembly with side effects, so it is
        neither moved across a barrier or fence nor merged with another load. For data that
        other blocks wrote during this launch (after a ``threadfence`` and a ticket): the
        SM's L1 is not coherent with them, L2 is."""
        _check_array(array)
        sig = types.UniTuple(types.uint32, 4)(array, row, q)

        def codegen(context, builder, sig, args):
            address = builder.ptrtoint(_vector_pointer(context, builder, sig, args), _I64)
            result = ir.LiteralStructType([_I32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(result, [_I64]),
                               "ld.global.cg.v4.u32 {$0, $1, $2, $3}, [$4];",
                               "=r,=r,=r,=r,l", side_effect=True)
            value = builder.call(asm, [address])
            words = [builder.extract_value(value, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, words)

        return sig, codegen

    @intrinsic
    def store_vec(typingctx, array, row, q, w0, w1, w2, w3):
        """Store four uint32 words as vector ``q`` of ``row``, one store."""
        _check_array(array)
        sig = types.void(array, row, q, w0, w1, w2, w3)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(_V4, ir.Undefined)
            for i, (value, value_type) in enumerate(zip(args[3:], sig.args[3:], strict=True)):
                word = context.cast(builder, value, value_type, types.uint32)
                vec = builder.insert_element(vec, word, ir.Constant(_I32, i))
            builder.store(vec, _vector_pointer(context, builder, sig, args), align=16)
            return context.get_dummy_value()

        return sig, codegen

else:  # pragma: no cover - exercised only with NUMBA_ENABLE_CUDASIM=1

    def load_vec(array, row, q):
        base = 4 * int(q)
        return tuple(np.uint32(array[row, base + i]) for i in range(4))

    load_vec_cg = load_vec

    def store_vec(array, row, q, w0, w1, w2, w3):
        base = 4 * int(q)
        for i, w in enumerate((w0, w1, w2, w3)):
            array[row, base + i] = np.uint32(w)


__all__ = ["load_vec", "load_vec_cg", "store_vec"]
