"""A device-side assert for numba.cuda kernels: what eager's ``index_select`` does on a bad index.

CUDA C++'s ``assert(cond)`` in device code calls the PTX system call ``__assertfail(message,
file, line, function, charSize)`` when ``cond`` is false (PTX Interoperability guide, "System
Calls"); the thread prints ``file:line: function: block: [...], thread: [...] Assertion
`message` failed.`` and stops, the launch fails with ``cudaErrorAssert``, and every later CUDA
call in the process reports ``device-side assert triggered``. That is how eager PyTorch's
kernels (``CUDA_KERNEL_ASSERT``) fail on an index out of range. numba-cuda 0.30 compiles
``assert`` statements only with ``debug=True``, so :func:`device_assert_fail` emits the call
through llvmlite, like numba-cuda's ``print`` emits ``vprintf``.

:func:`index_fault` is what the gate_residual kernels call on an index outside [0, G): the
one-element uint8 ``flag`` array the launch passes says what to do. :data:`FLAG_ASSERT` (2):
fail as above (``check_index=True``, the default: the error reaches the caller at the next
synchronisation, with no host work per call); :data:`FLAG_CLEAN` (1): write
:data:`FLAG_BAD` (0) into it and go on (``check_index=False`` and ``"sync"``, whose check ran on
the host; nobody reads that flag). The branch runs only for a bad index: valid inputs execute
the same instructions, with the same bits, as before.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) :func:`device_assert_fail` raises
``AssertionError`` with :data:`INDEX_MESSAGE`.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

SIMULATOR = bool(config.ENABLE_CUDASIM)

#: Flag values (uint8) a launch passes to the kernels.
FLAG_BAD, FLAG_CLEAN, FLAG_ASSERT = 0, 1, 2
#: The assertion text the device prints (the message eager's ``index_select`` assert names
#: its condition with: ``index >= -sizes[i] && index < sizes[i] && "index out of bounds"``).
INDEX_MESSAGE = "gate_residual: index holds a value outside [0, G)"

if not SIMULATOR:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    _I8P = ir.IntType(8).as_pointer()
    _ASSERTFAIL = ir.FunctionType(ir.VoidType(), [_I8P, _I8P, ir.IntType(32), _I8P,
                                                  ir.IntType(64)])

    @intrinsic
    def device_assert_fail(typingctx):
        """``__assertfail(INDEX_MESSAGE, "kernels/gate_residual.py", 0, "gate_residual", 1)``;
        does not return (the thread traps)."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, _ASSERTFAIL, "__assertfail")
            fn.attributes.add("noreturn")
            message = context.insert_string_const_addrspace(builder, INDEX_MESSAGE)
            where = context.insert_string_const_addrspace(builder,
                                                          "gate_residual_matrix/kernels/gate_residual.py")
            function = context.insert_string_const_addrspace(builder, "gate_residual")
            builder.call(fn, [message, where, ir.Constant(ir.IntType(32), 0), function,
                              ir.Constant(ir.IntType(64), 1)])
            builder.unreachable()
            # numba goes on lowering after the call: into a block nothing jumps to
            builder.position_at_end(builder.append_basic_block("after_assertfail"))
            return context.get_dummy_value()

        return sig, codegen

else:  # pragma: no cover - exercised only with NUMBA_ENABLE_CUDASIM=1

    def device_assert_fail():
        raise AssertionError(INDEX_MESSAGE)


@cuda.jit(device=True, inline="always")
def index_fault(flag):
    """An index outside [0, G) was met: fail the launch (flag == FLAG_ASSERT) or mark the
    flag FLAG_BAD and let the caller write its NaN row."""
    if flag[0] == np.uint8(FLAG_ASSERT):
        device_assert_fail()
    flag[0] = np.uint8(FLAG_BAD)


__all__ = ["FLAG_ASSERT", "FLAG_BAD", "FLAG_CLEAN", "INDEX_MESSAGE", "device_assert_fail",
           "index_fault"]
