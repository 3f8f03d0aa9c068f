"""SGLang's diffusion gate kernels, called by their exact paths (forward only, CUDA).

Read in the wheels of sglang 0.5.21, 0.5.22 and 0.5.23 (``pip download --no-deps``); the
paths are the same in all three. SGLang's facade ``sglang.kernels.ops.diffusion`` re-exports
both lazily; we import the owner modules, as the facade does.

- ``sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton``:
  ``indexed_gate_bf16(x, gate, other, indices) -> Tensor``, Triton kernel
  ``_indexed_gate_bf16_kernel``: ``x + bf16(gate[indices] * other)`` in float32, written to
  ``torch.empty_like(x)``; ``indexed_gate_bf16_`` (same signature) writes into ``x``, and is
  what SGLang's MiniMax-H3 (``multimodal_gen/runtime/models/dits/minimax_h3.py``,
  ``_modulate_gate``) calls by default. bfloat16 rows only (its name; SGLang dispatches to
  it for bf16 only). 0.5.21: one program per row; 0.5.22+: 2048-wide column tiles. 0.5.23
  adds ``indexed_gate_fp32(_)`` for float32 gate tables with bf16 rows (not our op: one dtype).
- ``sglang.kernels.kda_kernels.residual_gate_add_jit``: ``residual_gate_add_cuda(residual,
  update, gate) -> Tensor``, ``residual + update * gate`` elementwise on a gate of
  ``residual``'s shape (fp16, bf16, fp32), through the custom op
  ``diffusion_residual_gate_add``. We gather ``gate.index_select(0, index)`` with torch first
  (the library has no index). Its backend depends on the version: 0.5.21 runs
  ``_residual_gate_add_triton`` (Triton ``_rga_flat``; the JIT module is defined but not
  called), 0.5.22 and 0.5.23 run ``_residual_gate_add_cuda_impl`` (JIT CUDA through
  tvm-ffi, ``kda_kernels/csrc/diffusion/residual_gate_add.cuh``) for contiguous layouts.
  We call ``_cuda``, not ``residual_gate_add``: the latter falls back to eager when the
  fast path is refused (and, in 0.5.21, when the JIT build fails), silently.

No JIT (CUDA) variant of the *indexed* gate exists in these versions, nor in sglang-kernel
0.4.10 (which sglang 0.5.23 pins) or sgl-kernel 0.3.21.
"""

from __future__ import annotations

from types import ModuleType

import torch

from gate_residual_matrix.contract.library import LibraryImplementation

TRITON = "sglang.kernels.ops.diffusion.modulate.indexed_modulation_triton"
RGA = "sglang.kernels.kda_kernels.residual_gate_add_jit"
VERSIONS_READ = "sglang 0.5.21, 0.5.22, 0.5.23"

RGA_BACKENDS = (
    ("_residual_gate_add_triton", "Triton _rga_flat/_rga_row/_rga_flat_m1"),
    ("_residual_gate_add_cuda_impl",
     "JIT CUDA via tvm-ffi, kda_kernels/csrc/diffusion/residual_gate_add.cuh"),
    ("_residual_gate_add_transposed", "Triton _rga_transposed"),
)


def run_indexed_gate_triton(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``indexed_gate_bf16(residual, gate, y, index)``; forward only. ``impl``: the
    implementation row that calls (a versioned one), default :data:`INDEXED_GATE_TRITON`."""
    impl = impl or INDEXED_GATE_TRITON
    impl.refuse_dtype(inputs["residual"])
    return {"out": impl.call(inputs["residual"], inputs["gate"], inputs["y"], inputs["index"])}


def run_indexed_gate_triton_inplace(inputs, *, backward: bool,
                                    impl=None) -> dict[str, torch.Tensor]:
    """``indexed_gate_bf16_(residual, gate, y, index)``: writes the result into ``residual``
    (the runner's clone; the report lists ``residual`` under ``mutated_inputs``)."""
    impl = impl or INDEXED_GATE_TRITON_INPLACE
    impl.refuse_dtype(inputs["residual"])
    return {"out": impl.call(inputs["residual"], inputs["gate"], inputs["y"], inputs["index"])}


def run_residual_gate_add(inputs, *, backward: bool, impl=None) -> dict[str, torch.Tensor]:
    """``residual_gate_add_cuda(residual, y, gate.index_select(0, index))``; forward only.
    The gather is ours (torch ``index_select``), the rest the library's."""
    gathered = inputs["gate"].index_select(0, inputs["index"])
    return {"out": (impl or RESIDUAL_GATE_ADD).call(inputs["residual"], inputs["y"], gathered)}


def rga_backend(module: ModuleType) -> str | None:
    """The backend ``residual_gate_add_cuda`` runs for a contiguous 2-D layout in this
    version: 0.5.21's custom op calls ``_residual_gate_add_triton`` (it also defines the
    unused ``_residual_gate_add_cuda_impl``), 0.5.22+ call ``_residual_gate_add_cuda_impl``."""
    for name in ("_residual_gate_add_triton", "_residual_gate_add_cuda_impl"):
        if callable(getattr(module, name, None)):
            return name
    return None


INDEXED_GATE_TRITON = LibraryImplementation(
    name="sglang_indexed_gate_triton",
    source=f"SGLang {TRITON}:indexed_gate_bf16 (Triton; paths read in {VERSIONS_READ})",
    has_backward=False,
    run=run_indexed_gate_triton,
    targets=("cuda",),
    distribution="sglang",
    entries=(f"{TRITON}:indexed_gate_bf16",),
    backend=lambda module: "Triton _indexed_gate_bf16_kernel",
    dtypes=("bfloat16",),
)

INDEXED_GATE_TRITON_INPLACE = LibraryImplementation(
    name="sglang_indexed_gate_triton_inplace",
    source=(f"SGLang {TRITON}:indexed_gate_bf16_ (Triton, in place into residual, as SGLang's "
            f"MiniMax-H3 calls it; paths read in {VERSIONS_READ})"),
    has_backward=False,
    run=run_indexed_gate_triton_inplace,
    targets=("cuda",),
    distribution="sglang",
    entries=(f"{TRITON}:indexed_gate_bf16_",),
    backend=lambda module: "Triton _indexed_gate_bf16_kernel, output aliases x",
    dtypes=("bfloat16",),
    notes=("writes into its residual clone: mutated_inputs lists residual",),
)

RESIDUAL_GATE_ADD = LibraryImplementation(
    name="sglang_residual_gate_add_jit",
    source=(f"SGLang {RGA}:residual_gate_add_cuda on gate.index_select(0, index) gathered by "
            f"us with torch (JIT CUDA from 0.5.22, Triton in 0.5.21; paths read in "
            f"{VERSIONS_READ})"),
    has_backward=False,
    run=run_residual_gate_add,
    targets=("cuda",),
    distribution="sglang",
    entries=(f"{RGA}:residual_gate_add_cuda",),
    watch=RGA_BACKENDS,
    backend=rga_backend,
    notes=("the gather gate.index_select(0, index) is torch's, not the library's",),
)

SGLANG = (INDEXED_GATE_TRITON, INDEXED_GATE_TRITON_INPLACE, RESIDUAL_GATE_ADD)
