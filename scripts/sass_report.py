"""Registers, shared memory, local memory and FMA count of every kernel, from the SASS.

Run on a GPU machine (numba compiles for the device it finds). Prints one line per kernel
and the SASS of the bf16 kernels' inner loops for docs/performance.md.
"""

from __future__ import annotations

import re

import torch

from gate_residual_matrix.kernels import gate_residual as K
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs


def main() -> None:
    for dtype in ("bfloat16", "float16", "float32"):
        x = {k: v.cuda() for k, v in make_inputs(n=300, d=257, g=9, dtype=dtype,
                                                  index_dtype="int64", seed=1).tensors.items()}
        r, g, y = (x[k].requires_grad_() for k in ("residual", "gate", "y"))
        K.gate_residual(r, g, y, x["index"]).backward(x["grad_out"])
        torch.cuda.synchronize()
        x = {k: v.cuda() for k, v in make_inputs(n=300, d=256, g=9, dtype=dtype,
                                                  index_dtype="int64", seed=1).tensors.items()}
        r, g, y = (x[k].requires_grad_() for k in ("residual", "gate", "y"))
        K.gate_residual(r, g, y, x["index"]).backward(x["grad_out"])  # vector, fused
        x = {k: v.cuda() for k, v in make_inputs(n=1200, d=256, g=9, dtype=dtype,
                                                  index_dtype="int64", seed=1).tensors.items()}
        r, g, y = (x[k].requires_grad_() for k in ("residual", "gate", "y"))
        K.gate_residual(r, g, y, x["index"]).backward(x["grad_out"])  # vector, two launches
        torch.cuda.synchronize()
        named = [*zip(("forward", "backward_chunks", "reduce_chunks"), K.kernels_for(dtype)[:3],
                      strict=True),
                 *zip(("vec_forward", "vec_backward", "vec_fused"), K.vec_kernels_for(dtype),
                      strict=True)]
        for name, kern in named:
            for sig, sass in kern.inspect_sass().items():
                ffma = len(re.findall(r"\bFFMA\b", sass))
                fmul = len(re.findall(r"\bFMUL\b", sass))
                fadd = len(re.findall(r"\bFADD\b", sass))
                local = len(re.findall(r"\b(LDL|STL)\b", sass))
                compiled = kern.overloads[sig]
                regs = compiled.regs_per_thread
                shared = compiled.shared_mem_per_block
                local_bytes = compiled.local_mem_per_thread
                sig = ", ".join(str(a) for a in sig)
                print(f"{dtype:9s} {name:16s} regs={regs:3d} static_smem={shared:5d}B "
                      f"local={local_bytes}B "
                      f"FFMA={ffma} FMUL={fmul} FADD={fadd} local_ld_st={local} sig={sig}")
                if dtype == "bfloat16" and name == "vec_forward":
                    print(sass)


if __name__ == "__main__":
    main()
