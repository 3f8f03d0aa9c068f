"""What the runner knows about an op: :class:`OpSpec` (stdlib only, no torch).

An op lives in ``ops/<name>/``: its ``__init__`` defines ``SPEC`` (an :class:`OpSpec`), and
its implementations module (``SPEC.implementations_module``) defines ``IMPLEMENTATIONS``, a
tuple of :class:`contract.base.Implementation`. The runner reads the spec and never
names an op's tensors: inputs are built from :attr:`OpSpec.inputs`, outputs compared and
labelled by :attr:`OpSpec.outputs`, the batch-invariance checks slice the inputs that have N
rows, the tables read the labels the report carries (``tensors``, schema version 2).

Shapes are written in size symbols: ``"N"`` (the case's rows) and the op's problem sizes
(:attr:`OpSpec.sizes`, keys of the matrix's ``problem``), e.g. ``("G", "D")``.

Example::

    >>> from gate_residual_matrix.ops import get
    >>> spec = get("gate_residual")
    >>> spec.shape("gate", n=257, sizes={"D": 5376, "G": 9})
    (9, 5376)
    >>> spec.labels()["gate"]
    'grad_gate'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

ROWS = "N"
"""The size symbol of a case's rows."""


@dataclass(frozen=True)
class Output:
    """One tensor an implementation returns: its table ``label`` (``"grad_gate"``) and
    ``shape`` in size symbols. ``grad_of``: the input it is the gradient of (None for the
    forward output)."""

    label: str
    shape: tuple[str, ...]
    grad_of: str | None = None


@dataclass(frozen=True)
class OpSpec:
    """One op as the runner sees it.

    ``name``: the matrix's ``op`` and the reports' ``op``. ``formula``: the forward, in
    eager PyTorch. ``sizes``: the problem's size keys besides dtype, index_dtype and seed
    (``("D", "G")``), each an integer >= 1. ``inputs``: floating-point inputs in build order,
    name -> shape (the upstream gradient ``upstream`` among them); ``index``: the integer
    input, shape (N,), values in [0, ``groups``) where ``groups`` is a size key.
    ``outputs``: key -> :class:`Output`, the forward output first (``forward``), then the
    gradients. ``zero_rows``: inputs whose rows, set to zero, make a row contribute exact
    zeros to every gradient with ``groups`` rows (the padded batch-invariance check).
    ``bitwise``: the outputs our kernel claims bitwise equal to eager (the others are sums
    in a documented order: repeatable, not eager's bits). ``implementations_module``: the
    module that defines ``IMPLEMENTATIONS``; ``implementation_names``: their names, in the
    order a matrix lists them (kept beside the module so configs load without torch;
    tests/test_ops.py checks the two agree). ``cell_prefix``: put before
    ``<stack>-<mode>-<target>`` in the cell ids (report file names), so two ops' cells never
    share an id. ``bytes_moved(n, sizes, itemsize)``: (forward, forward+backward) bytes
    that must move, for bandwidth figures. ``library_distributions``: the distributions
    whose versions ``libraries.versions`` may expand (their rows run per version).
    ``reference_names``: implementation names in foreign reference reports -> ours, for the
    seed comparison table (runner/tables/model/seed.py).

    An op without an integer input (a norm) has ``index`` and ``groups`` None. An op with
    several forward outputs (``add_rms_norm``: ``out`` and ``h``) lists them first, each with
    ``grad_of`` None; ``upstreams`` then maps each forward output to the input that holds its
    upstream gradient (default: the first forward output to ``upstream``).
    ``library_modules``: per library distribution, the modules its rows load kernel-only
    (every layout a version has used): what the kernel wheelhouse keeps of its wheels.
    """

    name: str
    formula: str
    sizes: tuple[str, ...]
    inputs: Mapping[str, tuple[str, ...]]
    index: str | None
    groups: str | None
    upstream: str
    outputs: Mapping[str, Output]
    zero_rows: tuple[str, ...]
    bitwise: tuple[str, ...]
    implementations_module: str
    implementation_names: tuple[str, ...]
    bytes_moved: Callable[[int, Mapping[str, int], int], tuple[int, int]]
    cell_prefix: str = ""
    library_distributions: tuple[str, ...] = ()
    reference_names: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default_factory=tuple)
    upstreams: Mapping[str, str] = field(default_factory=dict)
    library_modules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def forward(self) -> str:
        """The first forward output's key (the first of :attr:`outputs`)."""
        return next(iter(self.outputs))

    @property
    def forwards(self) -> tuple[str, ...]:
        """Every forward output's key (those with no ``grad_of``), in order."""
        return tuple(k for k, o in self.outputs.items() if o.grad_of is None)

    @property
    def grads(self) -> tuple[str, ...]:
        """The gradient outputs' keys, in order."""
        return tuple(k for k, o in self.outputs.items() if o.grad_of is not None)

    def upstream_of(self) -> dict[str, str]:
        """Forward output -> the input holding its upstream gradient, in forward order."""
        return dict(self.upstreams) or {self.forward: self.upstream}

    def gradient_inputs(self) -> tuple[str, ...]:
        """The inputs that are upstream gradients (never differentiated)."""
        return tuple(self.upstream_of().values())

    def labels(self) -> dict[str, str]:
        """Output key -> table label, in order."""
        return {k: o.label for k, o in self.outputs.items()}

    def row_inputs(self) -> tuple[str, ...]:
        """Inputs with N rows (the index included, where the op has one), in build order."""
        rows = tuple(k for k, s in self.inputs.items() if s[0] == ROWS)
        return (*rows, self.index) if self.index else rows

    def row_outputs(self) -> tuple[str, ...]:
        """Outputs with N rows: each row depends on that row of the inputs alone."""
        return tuple(k for k, o in self.outputs.items() if o.shape[0] == ROWS)

    def group_outputs(self) -> tuple[str, ...]:
        """Outputs without N rows: sums over rows (those that share an index value, for
        ``groups`` rows; every row, for a parameter's gradient such as ``grad_weight``)."""
        return tuple(k for k, o in self.outputs.items() if o.shape[0] != ROWS)

    def shape(self, tensor: str, *, n: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shape of an input or output for ``n`` rows and the problem's ``sizes``;
        ``KeyError`` names the known tensors."""
        symbols = self.inputs.get(tensor) or (self.outputs[tensor].shape
                                              if tensor in self.outputs else None)
        if self.index and tensor == self.index:
            symbols = (ROWS,)
        if symbols is None:
            known = ", ".join([*self.inputs, *([self.index] if self.index else []),
                               *self.outputs])
            raise KeyError(f"{self.name} has no tensor {tensor!r}; choose from {known}")
        return tuple(n if s == ROWS else int(sizes[s]) for s in symbols)

    def table(self) -> dict[str, dict]:
        """The report's ``tensors``: key -> ``{"label", "shape"}`` (schema version 2)."""
        return {k: {"label": o.label, "shape": list(o.shape)} for k, o in self.outputs.items()}
