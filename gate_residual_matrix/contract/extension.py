"""Library rows that call an op of a library's compiled extension (a ``torch.ops`` library such
as vLLM's ``vllm/_C_stable_libtorch.abi3.so``, built on torch's stable ABI), loaded from a
file with ``torch.ops.load_library``. Never a re-implementation.

Where the file comes from (:meth:`ExtensionImplementation.locate`):

* the installed distribution's package folder, where that version is installed (or, for the
  unversioned row, any installed version): found with ``importlib.util.find_spec``, whose
  package ``__init__`` is not run;
* otherwise the file kept beside the kernel wheelhouse for that version
  (:mod:`contract.extension_files`: ``python -m gate_residual_matrix.runner.wheelhouse
  --extensions``), its sha256 checked against the record made from the wheel's RECORD.

A missing file makes the row ``unavailable`` with one line that says how to fetch it. The
report records the file, its sha256, the torch the wheel requires (its METADATA) and the torch
it ran under: the stable ABI lets one file load under several torch versions, so they may
differ, and the record says so.

torch registers an op namespace (``_C``) once per process: a second version's file cannot load
beside the first. The first version a process asks for claims the namespace; the others are
``unavailable`` in that process, with that reason.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from gate_residual_matrix.contract import extension_files
from gate_residual_matrix.contract.library import LibraryMissing, installed_version
from gate_residual_matrix.contract.versioned import VersionedImplementation, runtime
from gate_residual_matrix.contract.wheel_record import sha256_file

_LOCK = threading.Lock()
#: op namespace -> (label, file) of the extension loaded into it by this process.
_CLAIMED: dict[str, tuple[str, str]] = {}
#: (distribution, version, wheelhouse, installed) -> (file, provenance): hashed once.
_LOCATED: dict[tuple[str, str, str, bool], tuple[Path, dict]] = {}


def _one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _installed_torch_requirement(distribution: str) -> str | None:
    import importlib.metadata

    for line in importlib.metadata.requires(distribution) or ():
        pin = extension_files.torch_requirement(f"Requires-Dist: {line}")
        if pin is not None:
            return pin
    return None


@dataclass(frozen=True)
class ExtensionImplementation(VersionedImplementation):
    """A library row calling ``torch.ops.<namespace>.<op>`` of the extension file ``library``
    (its path inside the wheel, ``"vllm/_C_stable_libtorch.abi3.so"``); ``op`` is
    ``"<namespace>::<name>"`` (``"_C::rms_norm"``). Versioned as the other library rows
    (:func:`contract.versioned.versioned` keeps this kind)."""

    library: str = ""
    op: str = ""

    @property
    def label(self) -> str:
        """``<distribution> <version>`` (``installed`` for the unversioned row)."""
        return f"{self.distribution} {self.version or 'installed'}"

    def installed(self) -> bool:
        """Whether the file is taken from the installed package: this exact version is
        installed, or the row is unversioned and the distribution is installed."""
        have = installed_version(self.distribution)
        return have == self.version or (not self.version and have != "version unknown")

    def locate(self) -> tuple[Path, dict]:
        """``(file, provenance)``, found and hashed once per process; :class:`LibraryMissing`
        (one line) when there is none."""
        key = (self.distribution, self.version, self.wheelhouse, self.installed())
        if key not in _LOCATED:
            _LOCATED[key] = self._locate()
        return _LOCATED[key]

    def _locate(self) -> tuple[Path, dict]:
        name = Path(self.library).name
        if self.installed():
            top = self.library.split("/")[0]
            spec = importlib.util.find_spec(top)
            folders = list(spec.submodule_search_locations or []) if spec else []
            file = Path(folders[0]) / Path(*Path(self.library).parts[1:]) if folders else None
            if file is None or not file.is_file():
                raise LibraryMissing(f"{self.label} is installed but has no {name}")
            return file, {"mode": "installed", "distribution": self.distribution,
                          "version": installed_version(self.distribution), "file": str(file),
                          "sha256": sha256_file(file),
                          "requires_torch": _installed_torch_requirement(self.distribution)}
        if not self.version:
            raise LibraryMissing(f"{self.distribution} is not installed (its {name} is taken "
                                 "from the package, or per version from the wheelhouse)")
        try:
            file, info = extension_files.kept(Path(self.wheelhouse), self.distribution,
                                              self.version, self.library)
        except extension_files.ExtensionMissing as err:
            raise LibraryMissing(str(err)) from None
        return file, {"mode": "extension file", "distribution": self.distribution,
                      "version": self.version, "wheel": dict(info["wheel"]),
                      "file": info["path"], "sha256": info["sha256"],
                      "requires_torch": info["requires_torch"]}

    def entry(self) -> tuple[ModuleType, object]:
        """``(torch.ops.<namespace>, op)`` with the extension loaded (once per process);
        :class:`LibraryMissing` (one line): no file, another file holds the namespace, the
        load failed (e.g. no CUDA libraries), or the file has no such op."""
        namespace, _, name = self.op.partition("::")
        file, _ = self.locate()
        with _LOCK:
            claimed = _CLAIMED.get(namespace)
            if claimed is not None and claimed[1] != str(file):
                raise LibraryMissing(
                    f"torch.ops.{namespace} already holds {claimed[0]}'s {Path(claimed[1]).name} "
                    f"in this process (torch registers an op namespace once): run "
                    f"{self.label}'s rows in a process of their own")
            if claimed is None:
                if hasattr(getattr(torch.ops, namespace), name):
                    raise LibraryMissing(f"torch.ops.{self.op.replace('::', '.')} is already "
                                         "registered by another library in this process")
                try:
                    torch.ops.load_library(str(file))
                except Exception as err:  # OSError: missing CUDA libraries; RuntimeError
                    cause = f" ({_one_line(err.__cause__)})" if err.__cause__ else ""
                    raise LibraryMissing(f"{self.label}: torch.ops.load_library({file.name}) "
                                         f"failed: {_one_line(err)}{cause}") from None
                _CLAIMED[namespace] = (self.label, str(file))
        ops = getattr(torch.ops, namespace)
        if not hasattr(ops, name):
            raise LibraryMissing(f"{self.label}'s {file.name} has no op {self.op}")
        return ops, getattr(ops, name)

    def unavailable_reason(self, target: str) -> str | None:
        """The target, then :meth:`entry` (which loads the file)."""
        if target not in self.targets:
            return f"{self.name} does not run on target {target!r}"
        try:
            self.entry()
        except LibraryMissing as err:
            return str(err)
        return None

    def _torch_note(self, provenance: dict) -> str:
        pin = provenance.get("requires_torch")
        if pin is None:
            return "the wheel names no torch requirement"
        ran = torch.__version__.split("+")[0]
        same = pin == f"=={ran}"
        return (f"the wheel requires torch{pin or ' (any)'}, ran under torch {torch.__version__}"
                + ("" if same else " (another torch than the wheel pins)"))

    def ran(self) -> str:
        """``torch.ops._C.rms_norm (vllm/_C_stable_libtorch.abi3.so, op schema S) [extension
        file of vllm 0.30.0, wheel W sha256 H; file sha256 H; the wheel requires
        torch==2.13.0, ran under torch 2.11.0 (another torch than the wheel pins); torch X,
        triton Y]``; the op and the reason where it does not load."""
        op = f"torch.ops.{self.op.replace('::', '.')}"
        try:
            _, fn = self.entry()
        except LibraryMissing as err:
            return f"{op} ({self.library}) [{self.label}: not loaded: {err}]"
        file, provenance = self.locate()
        schema = getattr(getattr(fn, "default", None), "_schema", None)
        head = f"{op} ({self.library}" + (f", schema {schema}" if schema else "") + ")"
        where = (f"installed {self.distribution} {provenance['version']}, {file}"
                 if provenance["mode"] == "installed" else
                 f"extension file of {self.label}, wheel {provenance['wheel']['filename']} "
                 f"sha256 {provenance['wheel']['sha256']}")
        return (f"{head} [{where}; file sha256 {provenance['sha256']}; "
                f"{self._torch_note(provenance)}; {runtime()}]")

    def record(self) -> dict | None:
        """JSON for the report's environment: the file's provenance, the torch the wheel
        requires and the one it ran under; None where it does not load."""
        try:
            self.entry()
        except LibraryMissing:
            return None
        _, provenance = self.locate()
        pin = provenance.get("requires_torch")
        return {**provenance, "runtime": runtime(),
                "torch_differs_from_requirement": (
                    None if not pin else pin != f"=={torch.__version__.split('+')[0]}")}

    def call(self, *args, **kwargs):
        """Call the op (loaded by :meth:`entry`) with ``args``."""
        _, fn = self.entry()
        return fn(*args, **kwargs)
