"""Probe on one GPU: our RMSNorm kernels against vLLM's and vllm-omni's Triton kernels.

Usage (from the repository root, on a CUDA machine with torch, triton and numba-cuda)::

    python scripts/rms_norm_probe.py --libs .carry/norm-probe [--reps 50] [--no-variants]

``--libs`` is a folder with the libraries' own files, copied from their wheels and renamed
``<label>_<file>.py``: ``vllm-0.30.0_batch_invariant.py`` and ``vllm-0.33.0_batch_invariant.py``
(``vllm/model_executor/determinism/batch_invariant.py``),
``vllm-omni-0.30.0_indexed_modulation.py`` (``vllm_omni/diffusion/layers/``) and
``vllm-omni-0.28.0_minimax_h3_modulation.py`` (``vllm_omni/diffusion/attention/ops/``).
The stand-in loader of ``tests/rms_norm_library_kernels.py`` (not the libraries' import path:
their packages import whole serving stacks) copies the named top-level functions of each
file, unchanged, into a module that imports only torch and triton; the probe calls the
libraries' own launch functions (``rms_norm_batch_invariant``,
``rms_norm_indexed_scale_shift``).

It prints, per op / dtype / candidate, how many output elements differ in their bits from
the library kernel at N in {1, 255, 256, 257, 4097, 32768} (D = 5376, specials planted in
rows 1-10 and in random rows), how many differ from the numpy oracle of
``tests/rms_norm_oracle.py`` (with the GPU's approximate instructions evaluated on the GPU;
at N = 1 and 257)
and from the same rows of the N = 32768 run (batch invariance); then CUDA-event timings
(median of ``--reps`` samples of 10 back-to-back calls, after warm-up) at N = 32768
bfloat16 of ours, theirs and a device-to-device copy. Candidates: ``ours`` (the op),
``ours-ieee`` (correctly rounded reciprocal and square root instead of the MUFU
approximations) and ``ours-nofma`` (no FMA in the sums of squares), which should differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

D, G, EPS = 5376, 9, 1e-6
NS = (1, 255, 256, 257, 4097, 32768)
ORACLE_NS = (1, 257)  # the numpy oracle runs on the CPU: two sizes keep the probe short
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_inputs(n: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random normal inputs with special values planted in rows 1-10 and 16 random rows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fi = torch.finfo(dtype)
    x = torch.randn(n, D, generator=gen, device="cuda")
    sign = torch.where(torch.rand(D, generator=gen, device="cuda") < 0.5, -1.0, 1.0)
    x[1, 7] = float("nan")
    x[2, 11] = float("inf")
    x[3, 13] = float("-inf")
    x[4] = 0.0
    x[5] = sign * fi.smallest_normal * torch.rand(D, generator=gen, device="cuda")  # subnormal
    x[6] = (x[6] * (fi.max / 8)).clamp(-fi.max, fi.max)
    x[7] = x[7] * fi.smallest_normal * 16
    x[8] = x[8] * (1e-20 if dtype != torch.float16 else 1e-3)
    x[9, ::2] = -0.0
    x[10] = sign * fi.max
    rows = torch.randint(11, n, (16,), generator=gen, device="cuda")
    cols = torch.randint(0, D, (16,), generator=gen, device="cuda")
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, fi.max, -fi.max,
                             fi.smallest_normal / 2, fi.tiny] * 2, device="cuda")
    x[rows, cols] = specials
    return {
        "x": x.to(dtype),
        "residual": torch.randn(n, D, generator=gen, device="cuda").to(dtype),
        "weight": torch.randn(D, generator=gen, device="cuda").to(dtype),
        "scale": (0.5 * torch.randn(G, D, generator=gen, device="cuda")).to(dtype),
        "shift": (0.5 * torch.randn(G, D, generator=gen, device="cuda")).to(dtype),
        "index": torch.randint(0, G, (n,), generator=gen, device="cuda"),
    }


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((bits(a) != bits(b)).sum())


def oracle_diffs(op: str, ins: dict, out: torch.Tensor, math) -> int:
    import rms_norm_oracle as O

    dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16",
             torch.float32: "float32"}[ins["x"].dtype]
    itemsize = ins["x"].element_size()
    f = {k: v.float().cpu().numpy() for k, v in ins.items() if k != "index"}
    rcp, sqrt, rsqrt = math
    if op == "rms_norm_scale_shift":
        ref = O.rms_norm_scale_shift(f["x"], f["weight"], f["scale"], f["shift"],
                                     ins["index"].cpu().numpy(), itemsize, EPS, rsqrt)
    else:
        x = f["x"]
        if op == "add_rms_norm":
            x = O.round_storage(O.add(f["x"], f["residual"]), dtype)
        ref = O.rms_norm(x, f["weight"], itemsize, EPS, rcp, sqrt)
    got = bits(out).cpu().numpy().view(np.uint32 if itemsize == 4 else np.uint16)
    return int((O.storage_bits(ref, dtype) != got).sum())


def ours(op: str, ins: dict, variant: str = "triton"):
    from gate_residual_matrix.kernels.rms_norm import forward_variant

    return forward_variant(op, variant, ins["x"], ins["weight"], residual=ins["residual"],
                           scale=ins["scale"], shift=ins["shift"], index=ins["index"])


def theirs(op: str, lib, ins: dict) -> torch.Tensor:
    if op == "rms_norm_scale_shift":
        return lib.rms_norm_indexed_scale_shift(ins["x"], ins["weight"], ins["shift"],
                                                ins["scale"], ins["index"], EPS)
    x = ins["x"] + ins["residual"] if op == "add_rms_norm" else ins["x"]
    return lib.rms_norm_batch_invariant(x, ins["weight"], EPS)


def compare(op: str, full: dict, variants: list[str], refs: dict, math) -> dict:
    """(candidate, reference) -> {N: differing elements}."""
    big = {v: ours(op, full, v) for v in variants}
    big_ref = {label: theirs(op, lib, full) for label, lib in refs.items()}
    table: dict[tuple, dict] = {}

    def put(candidate: str, reference: str, n: int, count: int) -> None:
        table.setdefault((candidate, reference), {})[n] = count

    for n in NS:
        ins = {k: (v[:n] if v.dim() and v.shape[0] == max(NS) else v) for k, v in full.items()}
        for v in variants:
            got = ours(op, ins, v)
            out, h = got if op == "add_rms_norm" else (got, None)
            big_out = big[v][0] if op == "add_rms_norm" else big[v]
            name = "ours" if v == "triton" else f"ours-{v}"
            for label, lib in refs.items():
                put(name, label, n, ndiff(out, theirs(op, lib, ins)))
            put(name, "prefix of N=32768", n, ndiff(out, big_out[:n]))
            if op == "add_rms_norm":
                put(name + " h", "x + residual (eager)", n, ndiff(h, ins["x"] + ins["residual"]))
            if v == "triton" and n in ORACLE_NS:
                put(name, "numpy oracle", n, oracle_diffs(op, ins, out, math))
        for label, lib in refs.items():
            put(label, "prefix of N=32768", n, ndiff(theirs(op, lib, ins), big_ref[label][:n]))
    return table


def timed(fn, reps: int, inner: int = 10) -> float:
    """Milliseconds per call of ``fn``: the median over ``reps`` CUDA-event timings of
    ``inner`` back-to-back calls (so that the host's launch cost hides behind the GPU's
    work, as in a training step), after 5 warm-up calls."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libs", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args()
    t_start = time.time()
    from rms_norm_library_kernels import LIBS, load_all

    from gate_residual_matrix.kernels.rms_norm import forward_variant

    libs = load_all(args.libs)
    for label in LIBS.keys() - libs.keys():
        print(f"missing {args.libs / LIBS[label][0]}: {label} skipped")
    vllm = {k: v for k, v in libs.items() if k.startswith("vllm-0")}
    omni = {k: v for k, v in libs.items() if k.startswith("vllm-omni")}
    import rms_norm_gpu_math as M

    math = (M.rcp, M.sqrt, M.rsqrt)
    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"triton {__import__('triton').__version__}")

    rows = []  # (op, dtype, candidate, reference, diffs per N...)
    for dname, dtype in DTYPES.items():
        full = make_inputs(max(NS), dtype, args.seed)
        # FMA changes a sum of squares only where a square is inexact: float32 storage
        variants = ["triton"] + ([] if args.no_variants else
                                 {"bf16": ["ieee"], "fp16": [], "fp32": ["ieee", "nofma"]}[dname])
        for op in ("rms_norm", "add_rms_norm", "rms_norm_scale_shift"):
            refs = omni if op == "rms_norm_scale_shift" else vllm
            for (cand, ref), counts in compare(op, full, variants, refs, math).items():
                rows.append((op, dname, cand, ref, *(counts.get(n, "-") for n in NS)))
            torch.cuda.synchronize()
        print(f"{dname}: compared in {time.time() - t_start:.0f} s", flush=True)

    timings = []
    full = make_inputs(max(NS), torch.bfloat16, args.seed)
    n_bytes = full["x"].numel() * 2
    dst = torch.empty_like(full["x"])
    copy_ms = timed(lambda: dst.copy_(full["x"]), args.reps)
    copy_tbs = 2 * n_bytes / copy_ms / 1e9
    timings.append(("copy", "torch copy_", copy_ms, copy_tbs, 100.0))
    cases = [("rms_norm", "ours", 2, lambda: forward_variant("rms_norm", "triton", full["x"],
                                                              full["weight"]))]
    for label, lib in vllm.items():
        cases.append(("rms_norm", label, 2,
                      lambda lib=lib: lib.rms_norm_batch_invariant(full["x"], full["weight"],
                                                                   EPS)))
    cases.append(("add_rms_norm", "ours", 4, lambda: forward_variant(
        "add_rms_norm", "triton", full["x"], full["weight"], residual=full["residual"])))
    for label, lib in list(vllm.items())[:1]:
        cases.append(("add_rms_norm", f"torch add + {label}", 4,
                      lambda lib=lib: lib.rms_norm_batch_invariant(
                          full["x"] + full["residual"], full["weight"], EPS)))
    cases.append(("rms_norm_scale_shift", "ours", 2, lambda: forward_variant(
        "rms_norm_scale_shift", "triton", full["x"], full["weight"], scale=full["scale"],
        shift=full["shift"], index=full["index"])))
    for label, lib in omni.items():
        cases.append(("rms_norm_scale_shift", label, 2,
                      lambda lib=lib: lib.rms_norm_indexed_scale_shift(
                          full["x"], full["weight"], full["shift"], full["scale"],
                          full["index"], EPS)))
    cases += backward_cases(full)
    for op, who, tensors, fn in cases:
        ms = timed(fn, args.reps)
        tbs = tensors * n_bytes / ms / 1e9
        timings.append((op, who, ms, tbs, 100.0 * tbs / copy_tbs))

    print(f"\nall done in {time.time() - t_start:.0f} s\n")
    print("Elements whose bits differ (D = 5376; columns: N)")
    header = ("op", "dtype", "candidate", "vs", *map(str, NS))
    print(format_table(header, rows))
    print("\nTimings at N = 32768 bfloat16 (median of CUDA events; TB/s over the op's "
          "(N, D) tensors read + written)")
    print(format_table(("op", "implementation", "ms", "TB/s", "% of copy"),
                       [(a, b, f"{c:.4f}", f"{d:.2f}", f"{e:.0f}") for a, b, c, d, e in
                        timings]))


def backward_cases(full) -> list:
    """Forward + backward timings of ours (skipped while kernels/rms_norm_backward.py is
    absent)."""
    try:
        from gate_residual_matrix.kernels.rms_norm import (
            add_rms_norm,
            rms_norm,
            rms_norm_scale_shift,
        )
    except ImportError:
        return []
    go = torch.randn_like(full["x"], dtype=torch.float32).to(full["x"].dtype)

    def fb(fn, *leaves):
        def step():
            ts = [t.detach().requires_grad_() for t in leaves]
            out = fn(*ts)
            outs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(outs, (go,) * len(outs))
        return step

    return [
        ("rms_norm fwd+bwd", "ours", 5, fb(rms_norm, full["x"], full["weight"])),
        ("add_rms_norm fwd+bwd", "ours", 8, fb(
            lambda x, r, w: add_rms_norm(x, r, w), full["x"], full["residual"],
            full["weight"])),
        ("rms_norm_scale_shift fwd+bwd", "ours", 5, fb(
            lambda x, w, s, h: rms_norm_scale_shift(x, w, s, h, full["index"]), full["x"],
            full["weight"], full["scale"], full["shift"])),
    ]


def format_table(header, rows) -> str:
    try:
        from tabulate import tabulate
        return tabulate(rows, headers=header)
    except ImportError:
        widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))
                         for r in (header, *rows))


if __name__ == "__main__":
    main()
