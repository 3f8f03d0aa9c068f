"""Registers, spills and shared memory of every gate_residual kernel, from ptxas, without a GPU.

numba-cuda compiles each kernel to PTX for sm_90 (NVVM only, no device needed); ``ptxas -v
-arch=sm_90a`` then reports what the H200 would run: registers per thread, stack frame,
spill stores and loads, static shared memory (the backward's accumulators are dynamic
shared memory: G * lanes * block * 4 bytes, chosen at launch). The PTX's ``.version`` line is
lowered to what this ptxas reads when NVVM is newer (the instructions are the same). Also
counts the ``__assertfail`` call sites (kernels/device_assert.py). ``scripts/sass_report.py``
reads the same from the SASS on a GPU machine.

    python scripts/ptxas_report.py [--ptxas PATH] [--version 9.0]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STORAGE = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}


def signatures(dtype: str, index: str = "int64") -> dict:
    """(kernel, numba signature) of each kernel for one storage dtype."""
    from gate_residual_matrix.kernels import gate_residual as K

    a, u = f"{STORAGE[dtype]}[:, ::1]", "uint32[:, ::1]"
    forward, chunks, reduce, chunks_global = K.kernels_for(dtype)
    vec_forward, vec_backward, vec_fused = K.vec_kernels_for(dtype)
    flag = f"{index}[::1], uint8[::1]"
    return {
        "forward": (forward, f"void({a}, {a}, {a}, {a}, {flag})"),
        "backward_chunks": (chunks, f"void({a}, float32[:, :, ::1], {a}, {a}, {a}, {flag})"),
        "reduce_chunks": (reduce, f"void({a}, float32[:, :, ::1])"),
        "backward_chunks_global": (chunks_global,
                                   f"void({a}, float32[:, :, ::1], {a}, {a}, {a}, {flag})"),
        "vec_forward": (vec_forward, f"void({u}, {u}, {u}, {u}, {flag})"),
        "vec_backward": (vec_backward, f"void({u}, float32[:, :, ::1], {u}, {u}, {u}, {flag})"),
        "vec_fused": (vec_fused, f"void({u}, {u}, {u}, uint32[::1], {u}, {u}, {u}, {flag})"),
    }


def report(ptxas: str, version: str) -> list[str]:
    """One line per (dtype, kernel)."""
    from numba import cuda

    lines = []
    for dtype in STORAGE:
        for name, (kernel, sig) in signatures(dtype).items():
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
            ptx = re.sub(r"^\.version \S+", f".version {version}", ptx, flags=re.M)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "k.ptx"
                path.write_text(ptx)
                done = subprocess.run([ptxas, "-v", "-arch=sm_90a", str(path), "-o",
                                       str(Path(tmp) / "k.cubin")], capture_output=True,
                                      text=True)
            if done.returncode:
                lines.append(f"{dtype:9s} {name:22s} ptxas failed: {done.stderr.strip()[:200]}")
                continue
            info = done.stderr
            regs = re.search(r"Used (\d+) registers", info)
            stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes "
                              r"spill loads", info)
            smem = re.search(r"(\d+) bytes smem", info)
            asserts = len(re.findall(r"call\.uni\s+__assertfail", ptx))
            fmas = len(re.findall(r"\bfma\.", ptx))
            lines.append(f"{dtype:9s} {name:22s} regs={regs.group(1) if regs else '?':>3} "
                         f"stack={stack.group(1) if stack else '?'}B "
                         f"spill_st={stack.group(2) if stack else '?'}B "
                         f"spill_ld={stack.group(3) if stack else '?'}B "
                         f"static_smem={smem.group(1) if smem else 0}B "
                         f"assertfail_calls={asserts} fma={fmas}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptxas", default=shutil.which("ptxas") or "ptxas")
    parser.add_argument("--version", default="9.0", help="PTX ISA version this ptxas reads")
    args = parser.parse_args()
    release = subprocess.run([args.ptxas, "--version"], capture_output=True, text=True).stdout
    print(f"# {release.strip().splitlines()[-1]}; numba PTX for sm_90, .version {args.version}")
    print("\n".join(report(args.ptxas, args.version)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
