"""What the GPU-host steps run in a child process, so that the runner never holds a CUDA
context (it would stay on the GPU beside every cell) and a crash costs one step.

    python -m gate_residual_matrix.runner.gpu_host.probes launch    # 0: the launch path works
    python -m gate_residual_matrix.runner.gpu_host.probes rlbuild   # RL-Kernel's extension

``launch`` calls our gate_residual forward once (3 x 5376 bf16) through the launch path
``GATE_RESIDUAL_LAUNCH`` selects (default: libcuda's cuLaunchKernel) and checks its bits
against eager's. ``rlbuild`` imports RL-Kernel's op from its source tree
(:func:`contract.rl_kernel_tree.resolve`), which builds the extension into ``$RLK_BUILD_DIR``
on first import; exit 0 with a note when the tree or the toolchain is not there (the rows
are then ``unavailable`` with that reason), 1 when the build failed.
"""

from __future__ import annotations

import sys
import time


def launch() -> int:
    """Our forward once on the GPU, its bits against eager's; 0 when equal."""
    import torch

    from gate_residual_matrix.kernels.gate_residual import gate_residual_forward

    x = torch.ones(3, 5376, device="cuda", dtype=torch.bfloat16)
    index = torch.zeros(3, dtype=torch.int64, device="cuda")
    out = gate_residual_forward(x, x[:1], x, index)
    torch.cuda.synchronize()
    if not torch.equal(out, x + x[:1] * x):
        print("launch: ran, but the bits differ from eager's")
        return 1
    print("launch ok")
    return 0


def rlbuild() -> int:
    """Import RL-Kernel's op from its tree (building the extension); 0 unless the build
    failed."""
    from gate_residual_matrix.contract import rl_kernel_tree

    tree = rl_kernel_tree.resolve()
    why = rl_kernel_tree.problem(tree, ("rl_engine.kernels.ops.base",))
    if why is not None:
        print(f"rlbuild: not built: {why}")
        return 0
    rl_kernel_tree.prepare(tree)
    started = time.monotonic()
    from rl_engine.kernels.ops import base

    ok = bool(getattr(base, "_EXT_AVAILABLE", False))
    print(f"rlbuild: rl_engine._C built: {ok} {getattr(base, '_EXT_ERROR', None) or ''}"
          f"({time.monotonic() - started:.0f} s, {rl_kernel_tree.provenance(tree)})")
    return 0 if ok else 1


PROBES = {"launch": launch, "rlbuild": rlbuild}


def main(argv: list[str]) -> int:
    """Run the probe named by ``argv[0]``."""
    if len(argv) != 1 or argv[0] not in PROBES:
        print(f"usage: python -m {__spec__.name if __spec__ else __name__} "
              f"{{{','.join(PROBES)}}}", file=sys.stderr)
        return 2
    return PROBES[argv[0]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
