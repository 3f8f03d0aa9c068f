"""Kernel-only loading: a library's kernel modules from its released wheel's files, where the
library itself cannot be installed. Never a re-implementation.

:func:`load` takes a module of one (distribution, version) from the kernel wheelhouse
(:mod:`runner.wheelhouse`, built by ``nox -s kernel_wheelhouse``):

1. every file the module needs (it and the same distribution's modules it imports; no package
   ``__init__``) is read from the wheelhouse and checked against the wheel's own RECORD
   (sha256), and RECORD against the manifest; a mismatch raises :class:`KernelOnlyError`
   naming the file, before anything runs;
2. the modules execute from those verified bytes, under their real names, with **stand-in**
   parent packages (empty modules: the package ``__init__`` files, which import the whole
   serving stack, never run);
3. an import of another distribution that is not installed is served by a
   :data:`SUBSTITUTES` entry only where the substitute does exactly what that module does
   (``vllm.triton_utils``: triton's own modules), and recorded as a substitute; otherwise the
   load fails naming it;
4. a module of the same distribution that the wheelhouse cuts off
   (:data:`runner.wheelhouse.CUT_MODULES`: its closure is the serving stack) is served by its
   substitute, else by a :data:`STAND_INS` entry: inert names that raise
   :class:`StandInTouched` when used (attribute, call, instance), recorded as stand-ins, so a
   call that reaches one fails instead of running something the library never ran
   (:data:`TOUCHED` keeps every use for the caller to check);
5. an import of another distribution that the library makes as it loads only to ask about a
   feature its kernels never use, catching the failure (:data:`WITHHELD`, per version read),
   fails while the library loads, as if that distribution were not installed, and is
   recorded as withheld: the library then behaves the same on every host, and no process
   pays for importing it (peft and transformers take seconds each). Calls are not touched:
   withholding costs a pass over ``sys.modules``, milliseconds, too much for every call.

Versions of one distribution coexist in a process: a loaded version's modules are kept apart
and put into ``sys.modules`` only while it loads or is called (:meth:`Loaded.active`).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gate_residual_matrix.contract import wheel_record

_LOCK = threading.RLock()


class KernelOnlyError(ImportError):
    """A kernel-only load that cannot proceed; the message is one line and names the
    distribution, version and the file or module at fault."""


@dataclass(frozen=True)
class Substitute:
    """A module of another distribution replaced by exactly what it does.

    ``names``: attribute -> the module it is bound to in the real module (only pure
    re-exports qualify). ``evidence``: where the real module was read.
    """

    module: str
    distribution: str
    names: dict[str, str]
    evidence: str

    def build(self) -> types.ModuleType:
        """The substitute module: each name bound to the module it names (imported now)."""
        mod = types.ModuleType(self.module, f"substitute for {self.module} ({self.evidence})")
        for name, target in self.names.items():
            setattr(mod, name, importlib.import_module(target))
        setattr(mod, "__kernel_only_substitute__", True)  # noqa: B010 - not a ModuleType field
        return mod


#: ``vllm/triton_utils/__init__.py`` (vllm, read at commit 0234dbe9 and in the 0.2x-0.3x
#: releases): where triton imports (``HAS_TRITON``), ``import triton``, ``import
#: triton.language as tl``, ``import triton.language.extra.libdevice as tldevice``. The
#: vllm-omni kernels import ``tl`` and ``triton`` from it, nothing else.
SUBSTITUTES: dict[str, Substitute] = {
    "vllm.triton_utils": Substitute(
        module="vllm.triton_utils", distribution="vllm",
        names={"triton": "triton", "tl": "triton.language"},
        evidence="vllm/triton_utils/__init__.py re-exports triton as triton and "
                 "triton.language as tl when triton imports"),
}


class StandInTouched(RuntimeError):
    """Library code used a kernel-only stand-in: the code path is not the one recorded."""


#: Every stand-in name used in this process (``module.name``), in order.
TOUCHED: list[str] = []


def _touched(what: str) -> StandInTouched:
    TOUCHED.append(what)
    return StandInTouched(f"{what} is a kernel-only stand-in (contract."
                          "kernel_only.STAND_INS): the library's code path used it")


class _InertMeta(type):
    """Classes that stand for a name: usable in annotations (``X | None``), raising on any
    attribute, call or instantiation."""

    def __getattr__(cls, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise _touched(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise _touched(cls.__qualname__)


@dataclass(frozen=True)
class StandIn:
    """A module of the loaded distribution that the kernel module imports but whose closure
    is the serving stack: each of ``names`` is an inert placeholder, and any other attribute
    of the module raises (``import vllm.envs as envs``). ``evidence``: why the called code
    path never uses it (checked at run time: a use raises :class:`StandInTouched`)."""

    module: str
    distribution: str
    names: tuple[str, ...]
    evidence: str

    def build(self) -> types.ModuleType:
        """The stand-in module."""
        mod = types.ModuleType(self.module, f"kernel-only stand-in for {self.module} "
                                            f"({self.evidence})")
        for name in self.names:
            setattr(mod, name, _InertMeta(f"{self.module}.{name}", (), {}))

        def missing(attr: str):
            if attr.startswith("__") and attr.endswith("__"):
                raise AttributeError(attr)
            raise _touched(f"{self.module}.{attr}")

        mod.__getattr__ = missing  # type: ignore[method-assign]  # PEP 562
        mod.__path__ = []  # a parent of other stand-ins (vllm.platforms.interface)
        setattr(mod, "__kernel_only_stand_in__", True)  # noqa: B010 - not a ModuleType field
        return mod


_LIGER_READ = ("0.8.4", "0.8.5")
"""The liger-kernel versions whose sources :data:`WITHHELD`'s evidence was read in."""

_LIGER_WITHHELD = {
    "peft": "liger_kernel/utils.py imports it in a try for PEFT_AVAILABLE, which only "
            "is_peft_available() reads, and no loaded module calls that",
    "transformers": "liger_kernel/utils.py is_npu_available() imports transformers.utils in a "
                    "try and answers False without it, as transformers does on a host without "
                    "torch_npu; each ops/*rms_norm.py kernel module asks it at import",
}

#: (distribution, version) -> {module: why}: imports that fail while that version loads (step
#: 5 of the module docstring). Each is made inside a ``try`` whose handler takes the path of
#: a host without it, and no loaded kernel module reads what it sets; only the versions whose
#: sources were read are listed (another version imports them as it would anywhere).
WITHHELD: dict[tuple[str, str], dict[str, str]] = {
    ("liger-kernel", version): _LIGER_WITHHELD for version in _LIGER_READ}


def _withholding(names: tuple[str, ...]):
    """A block in which ``import`` of each of ``names`` (and of its submodules) raises
    ImportError (``sys.modules[name] = None``, through :func:`_swapped`); the entries before
    it come back after it."""
    return _swapped((), names, dict.fromkeys(names)) if names else contextlib.nullcontext()


_BI = "vllm/model_executor/determinism/batch_invariant.py"
_RMS = "rms_norm_batch_invariant"

#: vllm 0.30.0 and 0.33.0 ``batch_invariant.py`` (and ``batch_invariant_configs.py``) import
#: these at module level; ``rms_norm_batch_invariant`` without a residual (its only call
#: here) reaches none of them: it reshapes, allocates and launches ``_rms_norm_kernel``.
STAND_INS: dict[str, StandIn] = {
    "vllm.envs": StandIn(
        "vllm.envs", "vllm", (),
        f"{_BI} reads envs.* in init_batch_invariance only, never in {_RMS}"),
    "vllm.platforms": StandIn(
        "vllm.platforms", "vllm", ("current_platform",),
        f"{_BI} and batch_invariant_configs.py use current_platform in "
        f"enable_batch_invariant_mode and the matmul config lookup, never in {_RMS}"),
    "vllm.platforms.interface": StandIn(
        "vllm.platforms.interface", "vllm", ("DeviceCapability",),
        "batch_invariant_configs.py uses DeviceCapability as an annotation only"),
    "vllm.utils.mem_utils": StandIn(
        "vllm.utils.mem_utils", "vllm", ("get_max_shared_memory_bytes",),
        f"{_BI} calls it in enable_batch_invariant_mode, never in {_RMS}"),
    "vllm.utils.platform_utils": StandIn(
        "vllm.utils.platform_utils", "vllm", ("num_compute_units",),
        f"{_BI} calls it in the matmul paths and enable_batch_invariant_mode, never in {_RMS}"),
    "vllm.utils.torch_utils": StandIn(
        "vllm.utils.torch_utils", "vllm", ("is_torch_equal_or_newer",),
        f"{_BI} calls it in enable_batch_invariant_mode, never in {_RMS}"),
    "vllm.utils.nccl": StandIn(
        "vllm.utils.nccl", "vllm", ("pin_nccl_env",),
        f"{_BI} (0.33.0) calls it in enable_batch_invariant_mode, never in {_RMS}"),
}


@dataclass
class Loaded:
    """One distribution version loaded kernel-only: its manifest (``wheel``, ``files``), the
    files actually loaded (path -> sha256), the substitutes used, its modules, and the
    imports it is kept from (``withheld``: :data:`WITHHELD`)."""

    distribution: str
    version: str
    wheel: dict
    files: dict[str, str] = field(default_factory=dict)
    substitutes: dict[str, str] = field(default_factory=dict)
    modules: dict[str, types.ModuleType] = field(default_factory=dict)
    tops: tuple[str, ...] = ()
    stand_ins: dict[str, str] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def active(self, full: bool = False) -> Iterator[None]:
        """Put this version's modules (and substitutes) into ``sys.modules`` for the block,
        restored after. ``full`` (while loading) also hides every other module of the
        distribution (another version, an installed copy) and withholds :attr:`withheld`;
        without it (each call) only this version's own names are swapped, which costs
        microseconds."""
        if full:
            extra = (*self.substitutes, *self.stand_ins)
            with _LOCK, _swapped(self.tops, extra, self.modules), \
                    _withholding(tuple(self.withheld)):
                yield
            return
        with _LOCK:
            saved = {n: sys.modules[n] for n in self.modules if n in sys.modules}
            sys.modules.update(self.modules)
            try:
                yield
            finally:
                for n in self.modules:
                    sys.modules.pop(n, None)
                sys.modules.update(saved)

    def describe(self) -> str:
        """``kernel-only sglang 0.5.23, wheel NAME sha256 H; files: P sha256 H, ...;
        substitutes: M (why); stand-ins: M: names (why); withheld: M (why)``: what the
        report's code_path records (each part only where there is one)."""
        files = ", ".join(f"{p} sha256 {h}" for p, h in self.files.items())
        text = (f"kernel-only {self.distribution} {self.version}, wheel "
                f"{self.wheel['filename']} sha256 {self.wheel['sha256']}; files: {files}")
        if self.substitutes:
            text += "; substitutes: " + ", ".join(f"{m} ({why})"
                                                  for m, why in self.substitutes.items())
        if self.stand_ins:
            text += "; stand-ins: " + ", ".join(f"{m} ({why})"
                                                for m, why in self.stand_ins.items())
        if self.withheld:
            text += "; withheld: " + ", ".join(f"{m} ({why})"
                                              for m, why in self.withheld.items())
        return text

    def record(self) -> dict:
        """The same as JSON-ready data (report environment)."""
        out = {"mode": "kernel-only", "distribution": self.distribution,
               "version": self.version, "wheel": dict(self.wheel), "files": dict(self.files),
               "substitutes": dict(self.substitutes)}
        if self.stand_ins:
            out["stand_ins"] = dict(self.stand_ins)
        if self.withheld:
            out["withheld"] = dict(self.withheld)
        return out


@contextlib.contextmanager
def _swapped(tops: tuple[str, ...], extra: tuple[str, ...],
             install: dict[str, types.ModuleType]) -> Iterator[None]:
    """Remove ``sys.modules`` entries under ``tops`` and ``extra`` (and their parents for
    ``extra``), install ``install``; on exit store back what the block added into
    ``install`` and restore the previous entries."""
    def ours(name: str) -> bool:
        return (name.split(".")[0] in tops
                or any(name == e or name.startswith(e + ".") or e.startswith(name + ".")
                       for e in extra))

    saved = {n: m for n, m in list(sys.modules.items()) if ours(n)}
    for n in saved:
        del sys.modules[n]
    sys.modules.update(install)
    try:
        yield
    finally:
        for n in [n for n in sys.modules if ours(n)]:
            install[n] = sys.modules.pop(n)
        sys.modules.update(saved)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one version's verified files and stand-in packages; refuses any other module of
    the distribution (it would need a file the wheelhouse does not hold)."""

    def __init__(self, label: str, tops: tuple[str, ...], sources: dict[str, tuple[str, bytes]]):
        self.label, self.tops, self.sources = label, tops, sources
        self.packages = {".".join(m.split(".")[:i]) for m in sources
                         for i in range(1, m.count(".") + 1)}

    def find_spec(self, name, path=None, target=None):
        if name in self.sources:
            return importlib.machinery.ModuleSpec(name, self, origin=self.sources[name][0])
        if name in self.packages:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if name.split(".")[0] in self.tops:
            raise KernelOnlyError(f"{self.label}: {name} is needed but not in the kernel "
                                  "wheelhouse (a package __init__ or a module outside the "
                                  "kernel's closure)")
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        if name not in self.sources:  # a stand-in parent package
            module.__path__ = []
            module.__doc__ = f"kernel-only stand-in package ({self.label}): __init__ not run"
            module.__kernel_only_stand_in__ = True
            return
        origin, source = self.sources[name]
        module.__file__ = origin
        exec(compile(source, origin, "exec", dont_inherit=True), module.__dict__)


def _manifest(root: Path, distribution: str, version: str) -> dict:
    path = wheel_record.manifest_path(root, distribution, version)
    if not root.is_dir():
        raise KernelOnlyError(f"no kernel wheelhouse at {root}: build it where a package "
                              "index answers with `nox -s kernel_wheelhouse`, and carry it")
    if not path.is_file():
        raise KernelOnlyError(f"kernel wheelhouse {root} has no {distribution} {version}: "
                              "rebuild it with `nox -s kernel_wheelhouse`")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise KernelOnlyError(f"{path}: unreadable manifest: {err}".splitlines()[0]) from None


def verified_sources(root: Path, manifest: dict, paths: list[str]) -> dict[str, bytes]:
    """``{path: bytes}`` of ``paths``, each checked against the wheel's RECORD (itself checked
    against the manifest). :class:`KernelOnlyError` naming the first file that differs."""
    label = f"{manifest['distribution']} {manifest['version']}"
    rec = manifest["record"]
    try:
        text = gzip.decompress((root / "objects" / f"{rec['sha256']}.RECORD.gz").read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise KernelOnlyError(f"{label}: RECORD unreadable in the wheelhouse: "
                              f"{type(err).__name__}") from None
    if wheel_record.sha256_bytes(text) != rec["sha256"]:
        raise KernelOnlyError(f"{label}: {rec['path']} does not match the manifest's sha256")
    record = wheel_record.parse_record(text.decode("utf-8"))
    out = {}
    for path in paths:
        digest = manifest["files"].get(path)
        obj = root / "objects" / f"{digest}.py"
        try:
            data = obj.read_bytes()
        except OSError:
            raise KernelOnlyError(f"{label}: {path} is missing from the wheelhouse "
                                  f"({obj})") from None
        got = wheel_record.sha256_bytes(data)
        if record.get(path) is None or got != record[path]:
            raise KernelOnlyError(f"{label}: {path} does not match the wheel's RECORD (sha256 "
                                  f"{got}, RECORD {record.get(path) or 'has no entry'})")
        out[path] = data
    return out


_LOADED: dict[tuple[str, str, str], Loaded] = {}
_MODULES: dict[tuple[str, str, str, str], tuple[Loaded, types.ModuleType]] = {}


def _available(module: str) -> bool:
    if sys.modules.get(module) is not None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _module_info(manifest: dict, module: str, label: str) -> dict:
    """The manifest's entry for ``module``; :class:`KernelOnlyError` unless it was found."""
    info = manifest["modules"].get(module)
    if info is None:
        raise KernelOnlyError(f"{label}: the wheelhouse did not look for {module} (not in "
                              "the op specs' library_modules)")
    if info["status"] == "not in this version":
        raise KernelOnlyError(f"{module}: not in this version ({label})")
    if info["status"] != "found":
        raise KernelOnlyError(f"{module} ({label}) is {info['status']}: {info['problems'][0]}")
    return info


def _substitutes_needed(loaded: Loaded, info: dict, module: str,
                        label: str) -> dict[str, Substitute | StandIn]:
    """The substitutes and stand-ins ``module`` still needs for its foreign imports (those
    ``loaded`` has not got and that are neither installed here nor its own); raises
    :class:`KernelOnlyError` for an import none covers."""
    subs: dict[str, Substitute | StandIn] = {}
    for foreign in info["foreign"]:
        own = foreign.split(".")[0] in loaded.tops  # cut off by the wheelhouse
        if foreign in loaded.substitutes or foreign in loaded.stand_ins or (
                not own and _available(foreign)):
            continue
        sub = SUBSTITUTES.get(foreign) or (STAND_INS.get(foreign) if own else None)
        names = set(info["foreign"][foreign])
        if sub is None or not names <= set(sub.names):
            if own:
                raise KernelOnlyError(f"{module} ({label}) imports {foreign}, a module "
                                      "that kernel-only loading does not take from the "
                                      "wheel, and no substitute or stand-in covers "
                                      f"{', '.join(sorted(names)) or 'it'}")
            raise KernelOnlyError(f"{module} ({label}) imports {foreign}, of a "
                                  "distribution that is not installed here, and no exact "
                                  "substitute exists")
        subs[foreign] = sub
    return subs


def _install_substitutes(loaded: Loaded, subs: dict[str, Substitute | StandIn], module: str,
                         label: str) -> None:
    """Build each of ``subs`` into ``loaded.modules`` (with stand-in parent packages) and
    record its evidence."""
    for name, sub in subs.items():
        try:
            loaded.modules[name] = sub.build()
        except ImportError as err:
            raise KernelOnlyError(f"{module} ({label}): substitute for {name} cannot be "
                                  f"built: {err}".splitlines()[0]) from None
        if isinstance(sub, StandIn):
            loaded.stand_ins[name] = (f"{', '.join(sub.names) or 'any attribute'}: "
                                      f"{sub.evidence}")
        else:
            loaded.substitutes[name] = sub.evidence
        parts = name.split(".")
        for i in range(1, len(parts)):  # stand-in parents of the substitute
            parent = ".".join(parts[:i])
            stand_in = types.ModuleType(parent, "kernel-only stand-in for a substitute")
            stand_in.__path__ = []
            loaded.modules.setdefault(parent, stand_in)


def _import_through(finder: _Finder, loaded: Loaded, module: str,
                    label: str) -> types.ModuleType:
    """Import ``module`` with ``finder`` first on ``sys.meta_path`` and ``loaded`` active;
    the module's own failure becomes a one-line :class:`KernelOnlyError`."""
    sys.meta_path.insert(0, finder)
    try:
        with loaded.active(full=True):
            try:
                return importlib.import_module(module)
            except KernelOnlyError:
                raise
            except Exception as err:  # the library module's own failure as it loads
                first = (str(err).strip().splitlines() or [""])[0]
                raise KernelOnlyError(f"{module} ({label}, kernel-only) failed to load: "
                                      f"{type(err).__name__}: {first}") from None
    finally:
        sys.meta_path.remove(finder)


def load(root: Path, distribution: str, version: str, module: str) -> tuple[Loaded,
                                                                        types.ModuleType]:
    """``(Loaded, module)``: ``module`` of ``distribution`` ``version`` from the wheelhouse at
    ``root``, loaded kernel-only (see the module docstring); cached per process.

    Raises :class:`KernelOnlyError` (one line): no wheelhouse or manifest; ``module`` ``not in
    this version``; not loadable without a package ``__init__``; a file that does not match
    RECORD; an import of an absent distribution without a substitute; or the module's own
    error as it executes.
    """
    root = Path(root)
    cached = _MODULES.get((str(root), distribution, version, module))
    if cached is not None:
        return cached
    label = f"{distribution} {version}"
    manifest = _manifest(root, distribution, version)
    info = _module_info(manifest, module, label)
    key = (str(root), distribution, version)
    with _LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            loaded = Loaded(distribution, version, dict(manifest["wheel"]),
                            tops=tuple(manifest["packages"]),
                            withheld=dict(WITHHELD.get((distribution, version), {})))
        subs = _substitutes_needed(loaded, info, module, label)
        data = verified_sources(root, manifest, info["files"])
        sources = {m: (str(root / "objects" / f"{manifest['files'][p]}.py"), data[p])
                   for p, m in ((p, p[:-3].replace("/", ".")) for p in info["files"])}
        finder = _Finder(label, loaded.tops, sources)
        _install_substitutes(loaded, subs, module, label)
        mod = _import_through(finder, loaded, module, label)
        for path in info["files"]:
            loaded.files[path] = manifest["files"][path]
        _LOADED[key] = loaded
        _MODULES[(str(root), distribution, version, module)] = (loaded, mod)
        return loaded, mod
