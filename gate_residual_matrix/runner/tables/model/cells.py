"""Readable reports as the tables see them: one :class:`CellReport` per report, with its label,
the facets the filters select on, and what identifies its set-up (:func:`configuration`).

The tables never read a report's JSON layout for these: a :class:`CellReport` wraps one readable
report (ours or foreign) with its label and its facets (op, stack, mode, target, dtype, gpu).

A foreign report (the RL-Kernel reference layout) has no ``cell`` or ``problem``: its mode is
taken from ``environment.mode_environment`` when it names exactly one, its target is ``cuda``
when it names a GPU, and its stack and dtype are unknown (``None``), so a ``--stack`` or
``--dtype`` filter leaves it out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gate_residual_matrix.runner.reports.store import LoadedReport
from gate_residual_matrix.runner.tables.model.values import ABSENT, text
from gate_residual_matrix.runner.untrusted.names import shown

__all__ = ["CellReport", "cell_label", "configuration", "image_of", "load_cells"]

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:()+/@,=-]")


def cell_label(report: LoadedReport) -> str:
    """Our cell id, or ``reference:<file stem> (<gpu>)`` for a foreign report.

    The label is shown in notes and code spans as well as in table cells, so any character
    outside letters, digits, space and ``._:()+/@,=-`` (a file name or GPU string may hold
    backticks, ``<``, newlines) becomes ``?``.
    """
    data = report.data or {}
    if report.origin == "ours":
        label = str(data["cell"]["id"])
    else:
        gpu = (data.get("environment") or {}).get("gpu") or "unknown GPU"
        label = f"reference:{shown(report.path.stem)} ({gpu})"
    return _LABEL_UNSAFE.sub("?", text(label))


@dataclass(frozen=True)
class CellReport:
    """One readable report as the tables see it (the matrix's cell itself, stack × mode ×
    target, is :class:`runner.plan.cells.Cell`; a foreign report has no such cell).

    ``index`` is the cell's position in the list the tables were built from (the HTML page
    filters rows by it); facets are ``None`` where the report does not say.
    """

    index: int
    report: LoadedReport
    label: str
    op: str | None
    stack: str | None
    mode: str | None
    target: str | None
    dtype: str | None
    gpu: str | None

    @property
    def data(self) -> dict[str, Any]:
        """The report's JSON (empty for none)."""
        return self.report.data or {}

    @property
    def origin(self) -> str:
        """``ours`` or ``foreign``."""
        return str(self.report.origin)

    @property
    def ours(self) -> bool:
        """Whether the report is one of ours (not the reference layout)."""
        return self.report.origin == "ours"

    @property
    def status(self) -> str:
        """The cell status; :data:`ABSENT` for a foreign report (it has none)."""
        return str(self.data.get("status") or ABSENT)

    @property
    def reason(self) -> str | None:
        """Why the cell has its status, where the report says."""
        return self.data.get("reason")

    @property
    def results(self) -> dict[str, Any]:
        """``results``: implementation -> its entry."""
        return self.data.get("results") or {}

    @property
    def environment(self) -> dict[str, Any]:
        """``environment``: versions, GPU, driver, project commit."""
        return self.data.get("environment") or {}

    @cached_property
    def cases(self) -> tuple[str, ...]:
        """The report's case ids as strings, in its order (computed once: a report may list
        20,000 cases and the tables ask for them per implementation and pair)."""
        return tuple(str(c) for c in self.data.get("cases", []))

    @cached_property
    def case_set(self) -> frozenset[str]:
        """:attr:`cases` as a set, for membership tests."""
        return frozenset(self.cases)

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Facts the tables derive from this report once per cell and reuse (a case's
        dtypes: :func:`runner.tables.model.cases.case_dtypes`); empty at first."""
        return {}

    def in_order(self, keys: Iterable[str]) -> list[str]:
        """``keys`` (case ids of some per-case map) in the report's case order, then those
        it does not list in their own order; linear in the cases and keys.

        Example:
            >>> cell.in_order(["4097", "9", "1"])   # cases [1, 257, 4097]
            ['1', '4097', '9']
        """
        keys = list(dict.fromkeys(keys))
        present = set(keys)
        listed = self.case_set
        return [c for c in self.cases if c in present] + [k for k in keys if k not in listed]

    def per_case(self, impl: str, key: str, case: str) -> Any:
        """``results[impl][key][case]`` (e.g. ``key="sha256"``), None where absent."""
        return ((self.results.get(impl) or {}).get(key) or {}).get(case)

    def facet(self, name: str) -> str:
        """A facet's value for display and filtering, :data:`ABSENT` when unknown."""
        value = getattr(self, name)
        return ABSENT if value is None else str(value)


def _cell(index: int, report: LoadedReport) -> CellReport:
    data = report.data or {}
    env = data.get("environment") or {}
    gpu = env.get("gpu") or None
    if report.origin == "ours":
        cell, problem = data["cell"], data.get("problem") or {}
        stack, mode, target = cell["stack"], cell["mode"], cell["target"]
        dtype = problem.get("dtype")
    else:
        modes = list(env.get("mode_environment") or {})
        stack, dtype = None, None
        mode = modes[0] if len(modes) == 1 else None
        target = "cuda" if gpu else None
    return CellReport(index, report, cell_label(report), data.get("op"), stack, mode, target, dtype,
                gpu)


def load_cells(reports: Iterable[LoadedReport]) -> list[CellReport]:
    """The readable reports as cells: ours first, then foreign ones, each in the given order.

    Example:
        >>> [c.label for c in load_cells(read_reports(Path("reports")))]
        ['host-plain-cuda', 'reference:gate_residual_b200 (NVIDIA B200)']
    """
    readable = [r for r in reports if r.ok]
    ordered = [r for r in readable if r.origin == "ours"]
    ordered += [r for r in readable if r.origin != "ours"]
    return [_cell(i, r) for i, r in enumerate(ordered)]


def image_of(data: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(tag, digest) from the report's ``image`` (a string or an object), else None."""
    image = data.get("image") or (data.get("environment") or {}).get("image")
    if isinstance(image, str):
        return image, None
    if isinstance(image, Mapping):
        tag = image.get("tag") or image.get("name")
        digest = image.get("digest") or image.get("repo_digest") or image.get("id")
        return (str(tag) if tag else None), (str(digest) if digest else None)
    return None, None


def configuration(cell: CellReport) -> dict[str, str]:
    """What identifies a cell's set-up, flat: versions, GPU, driver, mode, image, problem
    (the A/B's first table and ``summary.json``'s cells)."""
    d, env = cell.data, cell.environment
    cap = env.get("capability")
    project = env.get("project") or {}
    out = {"origin": cell.origin, "op": d.get("op"), "stack": cell.stack, "mode": cell.mode,
           "target": cell.target, "backend": (d.get("cell") or {}).get("backend"),
           "gpu": cell.gpu, "capability": ".".join(map(str, cap)) if cap else None,
           "driver": env.get("driver"), "cuda": env.get("cuda"), "python": env.get("python"),
           "torch": env.get("torch"), "tf32": env.get("tf32"), "platform": env.get("platform")}
    out.update({f"library {k}": v for k, v in sorted((env.get("libraries") or {}).items())})
    modes = env.get("mode_environment")
    out["mode environment"] = json.dumps(modes, sort_keys=True) if modes is not None else None
    out["image"], out["image digest or id"] = image_of(d)
    image = d.get("image") or env.get("image")
    if isinstance(image, Mapping):
        out["base image"] = image.get("base_image")
        out.update({f"pin {k}": v for k, v in sorted((image.get("pins") or {}).items())})
    out.update({f"problem {k}": v for k, v in (d.get("problem") or {}).items()})
    out["cases"] = ", ".join(cell.cases) or None
    out["project commit"] = project.get("commit")
    return {k: ABSENT if v is None else text(v) for k, v in out.items()}
