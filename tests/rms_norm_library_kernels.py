"""Stand-in loader of the libraries' Triton RMSNorm kernels from their wheels' files, for the
GPU tests and ``scripts/rms_norm_probe.py`` (not the libraries' import path: their packages
import whole serving stacks, which a GPU host without them cannot run).

A folder (``$RMS_NORM_LIBS``, default ``.carry/norm-probe`` in the repository) holds the
libraries' own files, copied unchanged from their wheels and renamed ``<label>_<file>.py``:
``vllm-0.30.0_batch_invariant.py`` and ``vllm-0.33.0_batch_invariant.py``
(``vllm/model_executor/determinism/batch_invariant.py``),
``vllm-omni-0.30.0_indexed_modulation.py`` (``vllm_omni/diffusion/layers/``) and
``vllm-omni-0.28.0_minimax_h3_modulation.py`` (``vllm_omni/diffusion/attention/ops/``).
:func:`load_library` copies the named top-level definitions of one file, decorators and
bodies unchanged, into a module that imports only torch and triton; the tests then call the
libraries' own launch functions (``rms_norm_batch_invariant``,
``rms_norm_indexed_scale_shift``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM = ("_rms_norm_kernel", "rms_norm_batch_invariant")
OMNI = ("_MAX_1D_GRID_SIZE", "_iter_row_chunks", "_launch_row_chunks",
        "_rms_norm_indexed_scale_shift_kernel", "rms_norm_indexed_scale_shift")
LIBS = {
    "vllm-0.30.0": ("vllm-0.30.0_batch_invariant.py", VLLM),
    "vllm-0.33.0": ("vllm-0.33.0_batch_invariant.py", VLLM),
    "vllm-omni-0.30.0": ("vllm-omni-0.30.0_indexed_modulation.py", OMNI),
    "vllm-omni-0.28.0": ("vllm-omni-0.28.0_minimax_h3_modulation.py", OMNI),
}
HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"


def libs_dir() -> Path:
    """The folder of the libraries' files."""
    return Path(os.environ.get("RMS_NORM_LIBS", ROOT / ".carry" / "norm-probe"))


def load_library(path: Path, names: tuple[str, ...], label: str):
    """A module with the named top-level definitions of ``path`` (decorators kept)."""
    source = path.read_text()
    lines = source.splitlines()
    parts = []
    for node in ast.parse(source).body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.Assign) and isinstance(node.targets[0],
                                                                         ast.Name):
            name = node.targets[0].id
        if name in names:
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            parts.append("\n".join(lines[start - 1:node.end_lineno]))
    folder = Path(tempfile.mkdtemp(prefix="norm-libs-"))
    module_name = "stand_in_" + label.replace("-", "_").replace(".", "_")
    file = folder / f"{module_name}.py"
    file.write_text(HEADER + "\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def load_all(folder: Path | None = None) -> dict:
    """label -> module for every library file present in ``folder``."""
    folder = folder or libs_dir()
    return {label: load_library(folder / file, names, label)
            for label, (file, names) in LIBS.items() if (folder / file).exists()}
