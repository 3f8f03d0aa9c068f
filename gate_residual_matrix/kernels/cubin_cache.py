"""An on-disk cache of our kernels' cubins, so a process loads a kernel numba compiled before
instead of compiling it again.

numba.cuda compiles a kernel once per process (typing, LLVM, NVVM, the link): about 0.7 s
per signature on the H200's host, and a matrix cell uses about 40 of them, so every cell
process spent about 30 s compiling the same kernels (py-spy profile of a cuda cell at
5a2246c: 41.6 s of 190 s in ``Launcher.compiled``, docs/performance.md). numba's own
``cache=True`` does not apply: our kernels are closures made per dtype (``kernels_for``),
which numba does not cache.

What is cached is numba's own output for one kernel and signature: the linked cubin
(``CUDACodeLibrary.get_cubin``) and its entry name. A hit loads that cubin into numba's
context (``create_module_image``, as ``get_cufunc`` does after compiling), so the code
that runs is byte for byte the code numba would have built. The key (:func:`key`) covers
everything that decides that code: the source of every module in ``kernels/`` (the kernels
and the device functions they inline), the caller's name of the kernel and its variant
(dtype, index dtype, kind), the numba types of the signature, the dispatcher's target
options, the GPU's compute capability, the numba, numba-cuda, llvmlite, NVVM, CUDA runtime
and driver versions, and every ``NUMBA_*`` environment variable but those of numba's CPU
thread pool (:data:`HOST_THREADING`: they decide how many host threads run parallel CPU
code, never a kernel's code; the GPU host's cells set ``NUMBA_NUM_THREADS`` where its
compile-ahead workers do not, and with it in the key every cell's first process compiled
every kernel again). Anything else that changed would only ever make a miss, which compiles
as before.

Where: ``$GATE_RESIDUAL_CUBIN_CACHE`` (``off`` disables it), else
``$XDG_CACHE_HOME/gate-residual/cubin`` (``~/.cache`` when unset). Writes are atomic (a
temporary file, then ``os.replace``); an entry that cannot be read, or whose cubin does not
match the sha256 recorded beside it, is ignored and compiled again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from gate_residual_matrix import settings

_KERNELS_DIR = Path(__file__).resolve().parent
_SOURCE_DIGEST: list[str] = []

HOST_THREADING = frozenset({"NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER",
                            "NUMBA_THREADING_LAYER_PRIORITY"})
"""numba's settings of its CPU thread pool, left out of :func:`key`."""
_VERSIONS: list[str] = []


def cache_dir() -> Path | None:
    """The cache folder (not created here), or None when ``GATE_RESIDUAL_CUBIN_CACHE=off``."""
    value = settings.get("GATE_RESIDUAL_CUBIN_CACHE")
    if value == "off":
        return None
    if value:
        return Path(value)
    base = settings.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gate-residual" / "cubin"


def source_digest() -> str:
    """sha256 over the name and bytes of every ``kernels/*.py`` (once per process)."""
    if not _SOURCE_DIGEST:
        h = hashlib.sha256()
        for path in sorted(_KERNELS_DIR.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        _SOURCE_DIGEST.append(h.hexdigest())
    return _SOURCE_DIGEST[0]


def _versions() -> str:
    """The toolchain's versions (once per process): numba, numba-cuda, llvmlite, NVVM, the
    CUDA runtime and the driver, Python."""
    if not _VERSIONS:
        import llvmlite
        import numba
        from numba import cuda

        try:
            import numba_cuda
            numba_cuda_version = numba_cuda.__version__
        except ImportError:  # numba's bundled CUDA target
            numba_cuda_version = "bundled"
        try:
            from numba.cuda.cudadrv import nvvm
            nvvm_version = str(nvvm.NVVM().get_version())
        except Exception as err:  # no NVVM: the key says so (a miss, never a wrong hit)
            nvvm_version = f"unknown: {type(err).__name__}"
        parts = [f"numba {numba.__version__}", f"numba-cuda {numba_cuda_version}",
                 f"llvmlite {llvmlite.__version__}", f"nvvm {nvvm_version}",
                 f"runtime {cuda.runtime.get_version()}",
                 f"driver {cuda.cudadrv.driver.driver.get_version()}",
                 f"python {sys.version_info[:2]}"]
        _VERSIONS.append("; ".join(parts))
    return _VERSIONS[0]


def key(name: str, dispatcher, argtypes: tuple, cc: tuple[int, int]) -> str:
    """The cache key (64 hex digits) of kernel ``name`` (the caller's unique name of the
    kernel and its variant, e.g. ``"gate_residual vec 0 bfloat16 int64"``) compiled by
    ``dispatcher`` for ``argtypes`` (numba types) on a GPU of compute capability ``cc``."""
    options = getattr(dispatcher, "targetoptions", {})
    numba_env = [(k, v) for k, v in settings.matching("NUMBA_") if k not in HOST_THREADING]
    text = json.dumps([source_digest(), name, repr(argtypes),
                       sorted((k, repr(v)) for k, v in options.items()), list(cc),
                       _versions(), numba_env])
    return hashlib.sha256(text.encode()).hexdigest()


def load(entry_key: str) -> tuple[bytes, str] | None:
    """The cached (cubin, entry name) of ``entry_key``, or None (no cache, a miss, or an
    entry that cannot be read or whose cubin's sha256 does not match its record)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        meta = json.loads((folder / f"{entry_key}.json").read_text())
        cubin = (folder / f"{entry_key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or hashlib.sha256(cubin).hexdigest() != meta.get("sha256"):
        return None
    entry = meta.get("entry_name")
    return (cubin, entry) if isinstance(entry, str) and entry else None


def store(entry_key: str, cubin: bytes, entry_name: str, name: str) -> None:
    """Write one entry atomically (the cubin first, then its record); a cache that cannot be
    written is skipped silently (the next process compiles, as without a cache)."""
    folder = cache_dir()
    if folder is None:
        return
    meta = {"entry_name": entry_name, "sha256": hashlib.sha256(cubin).hexdigest(),
            "kernel": name, "versions": _versions()}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, data in ((".cubin", cubin), (".json", json.dumps(meta).encode())):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{entry_key}", suffix=suffix)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, folder / f"{entry_key}{suffix}")
    except OSError:
        return
