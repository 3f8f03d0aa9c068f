"""Which verdict changes fail the gate: a small typed set of rules, with defaults.

Every change :mod:`runner.compare_reports.diff` can find has one rule name (:data:`RULES`);
each rule either **fails** the comparison (exit 6) or is **allowed** (reported, exit 0).
The defaults fail every change for the worse and allow every change for the better:

* ``bits:equal->differ`` (fail), ``bits:equal->nan_payload``, ``bits:nan_payload->differ``
  (fail); ``bits:differ->equal``, ``bits:nan_payload->equal``, ``bits:differ->nan_payload``
  (allow). ``nan_payload``: the tensors differ in NaN payloads only.
* ``repeatable:yes->no`` (fail), ``repeatable:no->yes`` (allow): the same bits in every
  repeat within one process; ``across_processes:yes->no`` / ``:no->yes`` the same across
  two processes (``--abba``); ``batch_invariant:yes->no`` / ``:no->yes``.
* ``differ_fraction:grew`` (fail) / ``:shrank`` (allow): the share of a differing tensor's
  elements that differ, beyond :attr:`Rules.fraction_tolerance` (absolute).
* ``error:grew`` (fail) / ``:shrank`` (allow): an implementation's error against fp64
  (``max_abs_ulps``, else ``max_abs``), beyond :attr:`Rules.error_tolerance` (relative).
* ``cell_status:worse`` (fail: ``ok`` became anything else but ``skipped``) / ``:better``
  (allow); ``cell_status:skipped`` (allow): ``ok`` became ``skipped``, the new host cannot run
  that cell (no GPU, no Docker engine, no image), so nothing of it is compared;
  ``impl_status:worse`` / ``:better`` the same for one implementation in a cell.
* ``inputs:changed`` (fail): a case's inputs have other sha256 (seed or sizes changed), so
  nothing of that case could be compared.

Bits, fractions and errors of a side that was not repeatable (in either report) move from run
to run; such changes are reported as ``unstable`` and never fail unless
:attr:`Rules.gate_unstable` is set (its own ``repeatable:yes->no`` change fails already).

A rules file (YAML, or TOML by its ``.toml`` suffix) overrides the defaults, and the
command line's ``--allow RULE`` / ``--fail RULE`` override the file::

    fail: ["bits:equal->differ", "repeatable:yes->no"]
    allow: ["differ_fraction:grew", "error:grew"]
    tolerance: {differ_fraction: 0.01, error: 0.05}
    gate_unstable: false
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gate_residual_matrix.runner.errors import ConfigError

try:
    import tomllib
except ImportError:  # Python 3.10: tomli, where installed (the docker extra has it)
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

__all__ = ["DEFAULT_FAIL", "RULES", "Rules", "load_rules"]

RULES: dict[str, bool] = {
    "bits:equal->differ": True,
    "bits:equal->nan_payload": True,
    "bits:nan_payload->differ": True,
    "bits:differ->equal": False,
    "bits:nan_payload->equal": False,
    "bits:differ->nan_payload": False,
    "repeatable:yes->no": True,
    "repeatable:no->yes": False,
    "across_processes:yes->no": True,
    "across_processes:no->yes": False,
    "batch_invariant:yes->no": True,
    "batch_invariant:no->yes": False,
    "differ_fraction:grew": True,
    "differ_fraction:shrank": False,
    "error:grew": True,
    "error:shrank": False,
    "cell_status:worse": True,
    "cell_status:better": False,
    "cell_status:skipped": False,
    "impl_status:worse": True,
    "impl_status:better": False,
    "inputs:changed": True,
}
"""Every rule name, and whether it fails by default (True) or is allowed (False)."""
DEFAULT_FAIL = frozenset(name for name, fails in RULES.items() if fails)
_KEYS = ("fail", "allow", "tolerance", "gate_unstable")
_TOLERANCES = ("differ_fraction", "error")


@dataclass(frozen=True)
class Rules:
    """The rules a comparison applies.

    Attributes:
        fail: the rule names (:data:`RULES`) that fail the comparison; the others are allowed.
        fraction_tolerance: a differing tensor's share of differing elements "grew" when the
            new share exceeds the old one by more than this (absolute, in [0, 1]).
        error_tolerance: an error against fp64 "grew" when new > old * (1 + this) (relative,
            >= 0); shrank when old > new * (1 + this).
        gate_unstable: also fail on changes of a side that was not repeatable.
    """

    fail: frozenset[str] = DEFAULT_FAIL
    fraction_tolerance: float = 0.0
    error_tolerance: float = 0.0
    gate_unstable: bool = False

    def fails(self, rule: str) -> bool:
        """Whether a change under ``rule`` fails the comparison."""
        return rule in self.fail

    def overridden(self, allow: Iterable[str] = (), fail: Iterable[str] = (),
                   where: str = "") -> Rules:
        """These rules with ``allow`` names allowed, then ``fail`` names failed.

        Raises:
            ConfigError: a name that is not a rule (the message lists them).
        """
        allow, fail = list(allow), list(fail)
        for name in (*allow, *fail):
            _check_name(name, where or "--allow/--fail")
        return replace(self, fail=frozenset((set(self.fail) - set(allow)) | set(fail)))

    def describe(self) -> dict[str, Any]:
        """The rules as JSON: the names that fail, those allowed, the tolerances."""
        return {"fail": [r for r in RULES if r in self.fail],
                "allow": [r for r in RULES if r not in self.fail],
                "tolerance": {"differ_fraction": self.fraction_tolerance,
                              "error": self.error_tolerance},
                "gate_unstable": self.gate_unstable}


def _check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or name not in RULES:
        raise ConfigError(f"{where}: unknown rule {name!r}; choose from {', '.join(RULES)}")
    return name


def _names(data: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str) or not isinstance(value, list):
        raise ConfigError(f"{where}: {key}: expected a list of rule names, got {value!r}")
    return [_check_name(v, f"{where}: {key}") for v in value]


def _tolerance(value: object, key: str, where: str) -> float:
    top = 1.0 if key == "differ_fraction" else math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value <= top and math.isfinite(value)):
        span = "in [0, 1]" if top == 1.0 else ">= 0"
        raise ConfigError(f"{where}: tolerance.{key}: expected a number {span}, got {value!r}")
    return float(value)


def _parse(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--rules: cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--rules: {path}: not UTF-8 text") from None
    toml = path.suffix.lower() == ".toml"
    if toml and tomllib is None:
        raise ConfigError(f"--rules: {path}: reading TOML needs Python 3.11 or tomli; "
                          "write the rules as YAML")
    try:
        return tomllib.loads(text) if toml else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:  # TOMLDecodeError is a ValueError
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"--rules: {path}: invalid {path.suffix.lstrip('.') or 'YAML'}: "
                          f"{first}") from None


def load_rules(path: Path | None = None, allow: Iterable[str] = (),
               fail: Iterable[str] = ()) -> Rules:
    """The default rules, overridden by the file at ``path`` (when given), then by
    ``allow`` and ``fail`` (``--allow``, ``--fail``).

    Raises:
        ConfigError: an unreadable or invalid file, an unknown key or rule name, a tolerance
            out of range; one line naming it.

    Example:
        >>> load_rules(allow=["error:grew"]).fails("error:grew")
        False
    """
    rules = Rules()
    if path is not None:
        path = Path(path)
        where = f"--rules {path}"
        data = _parse(path)
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping of {', '.join(_KEYS)}, got "
                              f"{type(data).__name__}")
        unknown = [k for k in data if k not in _KEYS]
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; choose from "
                              f"{', '.join(_KEYS)}")
        tolerance = data.get("tolerance") or {}
        if not isinstance(tolerance, dict) or any(k not in _TOLERANCES for k in tolerance):
            raise ConfigError(f"{where}: tolerance: expected a mapping of "
                              f"{', '.join(_TOLERANCES)}, got {tolerance!r}")
        gate = data.get("gate_unstable", False)
        if not isinstance(gate, bool):
            raise ConfigError(f"{where}: gate_unstable: expected true or false, got {gate!r}")
        rules = Rules(
            fraction_tolerance=_tolerance(tolerance.get("differ_fraction", 0.0),
                                          "differ_fraction", where),
            error_tolerance=_tolerance(tolerance.get("error", 0.0), "error", where),
            gate_unstable=gate,
        ).overridden(_names(data, "allow", where), _names(data, "fail", where), where)
    return rules.overridden(allow, fail)
