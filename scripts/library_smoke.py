"""GPU rehearsal of the library rows: one line per (implementation, version).

On a CUDA machine, loads each library version named in matrix.yaml's ``libraries`` (kernel-
only from the wheelhouse where that version is not installed), calls each library
implementation once on a tiny bf16 input (N = 3, D = 64, G = 2) and prints ``ok`` with
whether ``out`` equals eager's bits, or the one-line reason it did not run. RL-Kernel's op
runs from its source tree (its first import builds the extension, about 80 s on the H200).

    python scripts/library_smoke.py [--matrix matrix.yaml]

Exit 0 when every row ran or is unavailable for a stated reason; 1 when a call raised.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    """Run every library row once; print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    args = parser.parse_args()

    import torch

    from gate_residual_matrix.contract import versioned
    from gate_residual_matrix.contract.library import LibraryImplementation
    from gate_residual_matrix.ops.gate_residual.eager import run as eager
    from gate_residual_matrix.ops.gate_residual.inputs import make_inputs
    from gate_residual_matrix.runner.cell import catalog as implementations
    from gate_residual_matrix.runner.config.matrix import load_matrix
    from gate_residual_matrix.runner.errors import ConfigError

    try:
        matrix = load_matrix(args.matrix, known_implementations=implementations.known)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    target = "cuda" if torch.cuda.is_available() else "cpu"
    x = make_inputs(n=3, d=64, g=2, dtype="bfloat16", index_dtype="int64", seed=13,
                    specials=False).tensors
    x = {k: v.to(target) for k, v in x.items()}
    want = eager({k: v.clone() for k, v in x.items()}, backward=False)["out"]
    failed = 0
    print(f"target {target}; {versioned.runtime()}")
    for impl in implementations.rows(matrix):
        if not isinstance(impl, LibraryImplementation):
            continue
        why = impl.unavailable_reason(target)
        if why:
            print(f"{impl.name}: unavailable: {why}")
            continue
        try:
            out = impl.run({k: v.clone() for k, v in x.items()}, backward=False)["out"]
            torch.cuda.synchronize() if target == "cuda" else None
            same = out.shape == want.shape and torch.equal(out.view(torch.int16),
                                                           want.view(torch.int16))
            print(f"{impl.name}: ok, out {'==' if same else '!='} eager bits; {impl.ran()}")
        except Exception as err:  # report and go on: one line per row
            failed += 1
            first = (str(err).strip().splitlines() or [""])[0]
            print(f"{impl.name}: error: {type(err).__name__}: {first}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
