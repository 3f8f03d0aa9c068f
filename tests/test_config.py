"""Tests for runner.config.matrix: the shipped matrix, round trips, content hashes, bad configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from gate_residual_matrix import ops
from gate_residual_matrix.runner.config.matrix import (
    DTYPES,
    INDEX_DTYPES,
    Case,
    FrozenMap,
    load_matrix,
    parse_matrix,
)
from gate_residual_matrix.runner.errors import ConfigError

# the registered implementations after the first three, as messages list them
KNOWN_IMPLEMENTATIONS = ops.get("gate_residual").implementation_names
KNOWN_REST = "".join(f"{n}, " for n in KNOWN_IMPLEMENTATIONS[3:])

MATRIX = Path(__file__).parent.parent / "matrix.yaml"


def shipped() -> dict[str, Any]:
    """The shipped matrix.yaml as plain data, a fresh copy each call."""
    return yaml.safe_load(MATRIX.read_text())


def test_shipped_matrix_loads() -> None:
    m = load_matrix(MATRIX)
    assert m.problem.sizes == {"D": 5376, "G": 9} and m.problem.dtype == "bfloat16"
    assert [c.id for c in m.cases][:5] == ["1", "257", "4097", "32768", "257-specials"]
    assert m.implementations[:3] == ("eager", "numba", "fp64")
    assert set(m.implementations) == set(KNOWN_IMPLEMENTATIONS)  # every one
    assert (m.baseline, m.accuracy_reference, m.repeats) == ("eager", "fp64", 3)
    assert (m.timing.warmup, m.timing.iters) == (2, 10)
    assert m.batch_invariance is not None
    assert list(m.modes) == ["plain", "deterministic", "tf32", "inference",
                             "vllm_batch_invariant", "sglang_ieee"]
    assert dict(m.modes["plain"].env) == {} and m.modes["plain"].torch.deterministic is None
    assert dict(m.modes["deterministic"].env) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert m.modes["deterministic"].torch.deterministic is True
    assert m.modes["tf32"].torch.tf32 is True and m.modes["inference"].torch.inference_mode
    assert dict(m.modes["vllm_batch_invariant"].env) == {"VLLM_BATCH_INVARIANT": "1"}
    assert dict(m.modes["sglang_ieee"].env) == {"TRITON_F32_DEFAULT": "ieee"}
    assert [n for n, mode in m.modes.items() if mode.runs_on("cpu")] == ["plain",
                                                                          "deterministic"]
    assert all(mode.runs_on("cuda") for mode in m.modes.values())
    kinds = {name: s.kind for name, s in m.stacks.items()}
    assert kinds["host"] == "host" and next(iter(kinds)) == "host"
    assert len([k for k in kinds.values() if k == "docker"]) >= 4  # docs/containers.md
    assert m.targets == ("cuda", "cpu")


def test_defaults_filled_in() -> None:
    data = shipped()
    for key in ("repeats", "timing", "accuracy_reference"):
        del data[key]
    m = parse_matrix(data)
    assert (m.repeats, m.timing.warmup, m.timing.iters, m.accuracy_reference) == (3, 5, 50, None)


def test_round_trip() -> None:
    m = load_matrix(MATRIX)
    assert parse_matrix(m.to_dict()) == m
    assert parse_matrix(yaml.safe_load(yaml.safe_dump(m.to_dict()))) == m
    assert m.to_dict()["modes"]["plain"] == {"env": {}, "torch": {}}  # unset targets: absent
    assert m.to_dict()["timing"] == {"warmup": 2, "iters": 10, "targets": ["cuda"]}
    assert m.to_dict()["modes"]["tf32"] == {"env": {}, "torch": {"tf32": True},
                                            "targets": ["cuda"]}


def test_shipped_cases_cover_every_dtype_pair_with_the_reference_cases() -> None:
    m = load_matrix(MATRIX)
    pairs = {(d, i) for d in DTYPES for i in INDEX_DTYPES}
    for dtype, index_dtype in pairs:
        mine = [c for c in m.cases if m.case_dtypes(c) == (dtype, index_dtype)]
        assert sorted(c.n for c in mine if not c.specials) == [1, 257, 4097, 32768]
        assert [c.n for c in mine if c.specials] == [257]
        on_cpu = {c.n for c in mine if c.runs_on("cpu")}
        # the CPU runs the problem's dtypes at N <= 257 only (matrix.yaml says why)
        expected = {1, 257} if (dtype, index_dtype) == ("bfloat16", "int64") else set()
        assert on_cpu == expected, (dtype, index_dtype)
        assert all(c.runs_on("cuda") for c in mine)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("specials", [False, True])
def test_case_dtypes_and_ids(dtype: str, index_dtype: str, specials: bool) -> None:
    data = shipped()
    data["cases"] = [{"n": 3, "specials": specials, "dtype": dtype, "index_dtype": index_dtype}]
    (case,) = parse_matrix(data).cases
    base = "3-specials" if specials else "3"
    assert case.base_id == base
    assert parse_matrix(data).case_dtypes(case) == (dtype, index_dtype)
    if (dtype, index_dtype) == ("bfloat16", "int64"):  # the problem's: the id stays as it was
        assert case.id == base and case.dtype is None and case.index_dtype is None
        assert parse_matrix(data).to_dict()["cases"] == [{"n": 3, "specials": specials}]
    else:
        assert case.id == f"{base}-{dtype}-{index_dtype}"
        assert (case.dtype, case.index_dtype) == (dtype, index_dtype)


def test_a_case_naming_one_dtype_gets_the_other_from_the_problem() -> None:
    data = shipped()
    data["problem"]["index_dtype"] = "int32"
    data["cases"] = [{"n": 5, "dtype": "float32"}, {"n": 5, "index_dtype": "int64"},
                     {"n": 6, "dtype": None}, {"n": 7, "index_dtype": "int32"}]
    m = parse_matrix(data)
    assert [c.id for c in m.cases] == ["5-float32-int32", "5-bfloat16-int64", "6", "7"]
    assert [m.case_dtypes(c) for c in m.cases] == [("float32", "int32"), ("bfloat16", "int64"),
                                                  ("bfloat16", "int32"), ("bfloat16", "int32")]
    assert parse_matrix(m.to_dict()) == m


def test_spelled_out_problem_dtypes_do_not_change_the_content() -> None:
    data = shipped()
    for case in data["cases"][:5]:
        case.update(dtype="bfloat16", index_dtype="int64")
    assert parse_matrix(data).content_hash() == load_matrix(MATRIX).content_hash()


def test_case_and_mode_targets() -> None:
    data = shipped()
    data["cases"] = [{"n": 1}, {"n": 2, "targets": ["cuda"]}, {"n": 3, "targets": ["cpu"]}]
    data["modes"] = {"plain": {}, "gpu": {"targets": ["cuda"]}}
    m = parse_matrix(data)
    assert [c.runs_on("cpu") for c in m.cases] == [True, False, True]
    assert [c.runs_on("cuda") for c in m.cases] == [True, True, False]
    assert m.modes["gpu"].targets == ("cuda",) and m.modes["plain"].targets is None
    assert m.to_dict()["cases"][1] == {"n": 2, "specials": False, "targets": ["cuda"]}
    assert parse_matrix(m.to_dict()) == m


def test_round_trip_with_env_and_torch_settings() -> None:
    data = shipped()
    data["modes"] = {"det": {"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                             "torch": {"deterministic": True, "tf32": False}}, "plain": {}}
    m = parse_matrix(data)
    assert m.modes["det"].env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert m.modes["det"].torch.tf32 is False and m.modes["det"].torch.inference_mode is None
    assert m.to_dict()["modes"]["det"]["torch"] == {"deterministic": True, "tf32": False}
    assert list(m.modes) == ["det", "plain"]  # file order
    assert parse_matrix(m.to_dict()) == m


def test_matrix_is_frozen_and_hashable() -> None:
    m = load_matrix(MATRIX)
    with pytest.raises(pydantic.ValidationError):
        m.repeats = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.modes["new"] = m.modes["plain"]  # type: ignore[index]
    assert isinstance(m.modes, FrozenMap) and isinstance(m.cases, tuple)
    assert hash(m) == hash(load_matrix(MATRIX))


def test_content_hash_is_stable() -> None:
    h = load_matrix(MATRIX).content_hash()
    assert len(h) == 64 and int(h, 16) >= 0
    assert load_matrix(MATRIX).content_hash() == h
    reordered = dict(reversed(list(shipped().items())))  # key order in the file is not content
    assert parse_matrix(reordered).content_hash() == h
    spelled_out = shipped()
    spelled_out["cases"][0]["specials"] = False  # a default, written out
    assert parse_matrix(spelled_out).content_hash() == h


@pytest.mark.parametrize("change", [
    lambda d: d["problem"].update(seed=d["problem"]["seed"] + 1),
    lambda d: d["cases"].append({"n": 3}),
    lambda d: d["cases"][4].update(specials=False, n=258),
    lambda d: d.update(repeats=4),
    lambda d: d["modes"]["plain"].update(env={"X": "1"}),
    lambda d: d.update(targets=["cuda"]),
])
def test_content_hash_changes_with_content(change: Callable[[dict[str, Any]], None]) -> None:
    data = shipped()
    change(data)
    assert parse_matrix(data).content_hash() != load_matrix(MATRIX).content_hash()


def test_known_implementations_can_be_given() -> None:
    data = shipped()
    data["implementations"] = ["eager", "triton", "fp64"]
    with pytest.raises(ConfigError, match=r"implementations\[1\]: expected one of eager, numba"):
        parse_matrix(data)
    m = parse_matrix(data, known_implementations=(*KNOWN_IMPLEMENTATIONS, "triton"))
    assert m.implementations == ("eager", "triton", "fp64")
    with pytest.raises(ConfigError, match=r"expected one of eager, fp64, numba, got \"triton\""):
        parse_matrix(data, known_implementations=frozenset({"numba", "fp64", "eager"}))  # sorted


def test_case_ids() -> None:
    assert Case(n=257).id == "257" and Case(n=257, specials=True).id == "257-specials"
    assert Case(n=257, specials=True, dtype="float32", index_dtype="int32").id == \
        "257-specials-float32-int32"


@dataclasses.dataclass
class Whole:
    """Returned by a change that replaces the whole document rather than edit it in place."""

    data: Any


# (test id, change to the shipped data, key path, a fragment of the rest of the message)
BAD: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("unknown top-level key", lambda d: d.update(case=[]), "case", 'got unknown key "case"'),
    ("unknown nested key", lambda d: d["problem"].update(d=1), "problem.d", "one of the keys D, G"),
    ("D a string", lambda d: d["problem"].update(D="5376"), "problem.D",
     'integer >= 1, got "5376"'),
    ("D a bool", lambda d: d["problem"].update(D=True), "problem.D", "integer >= 1, got true"),
    ("D a float", lambda d: d["problem"].update(D=5376.0), "problem.D", "integer >= 1, got 5376.0"),
    ("D zero", lambda d: d["problem"].update(D=0), "problem.D", "integer >= 1, got 0"),
    ("G zero", lambda d: d["problem"].update(G=0), "problem.G", "integer >= 1, got 0"),
    ("N zero", lambda d: d["cases"][2].update(n=0), "cases[2].n", "integer >= 1, got 0"),
    ("negative seed", lambda d: d["problem"].update(seed=-1), "problem.seed", ">= 0, got -1"),
    ("seed too big", lambda d: d["problem"].update(seed=2**64), "problem.seed", "<= 9223372"),
    ("unknown dtype", lambda d: d["problem"].update(dtype="bf16"), "problem.dtype",
     'one of bfloat16, float16, float32, got "bf16"'),
    ("unknown index dtype", lambda d: d["problem"].update(index_dtype="int16"),
     "problem.index_dtype", 'one of int64, int32, got "int16"'),
    ("missing problem key", lambda d: d["problem"].pop("G"), "problem.G", "the key is missing"),
    ("specials not a bool", lambda d: d["cases"][0].update(specials="yes"), "cases[0].specials",
     'true or false, got "yes"'),
    ("empty cases", lambda d: d.update(cases=[]), "cases", "a non-empty list, got an empty list"),
    ("cases a mapping", lambda d: d.update(cases={"n": 1}), "cases", "a list, got a mapping"),
    ("duplicate case", lambda d: d["cases"].append({"n": 4097}), "cases[30]", 'second "4097"'),
    ("duplicate specials case", lambda d: d["cases"].append({"n": 257, "specials": True}),
     "cases[30]", 'a second "257-specials"'),
    ("duplicate case in other dtypes", lambda d: d["cases"].append(
        {"n": 257, "dtype": "float16", "index_dtype": "int32", "targets": ["cpu"]}),
     "cases[30]", 'a second "257-float16-int32"'),
    ("duplicate case spelled in the problem's dtypes", lambda d: d["cases"].append(
        {"n": 257, "dtype": "bfloat16"}), "cases[30]", 'a second "257"'),
    ("case dtype unknown", lambda d: d["cases"][1].update(dtype="float8"), "cases[1].dtype",
     'one of bfloat16, float16, float32, got "float8"'),
    ("case dtype not a string", lambda d: d["cases"][1].update(dtype=16), "cases[1].dtype",
     "one of bfloat16, float16, float32, got 16"),
    ("case index dtype unknown", lambda d: d["cases"][1].update(index_dtype="int16"),
     "cases[1].index_dtype", 'one of int64, int32, got "int16"'),
    ("unknown case key", lambda d: d["cases"][1].update(dtypes=["float16"]), "cases[1].dtypes",
     "one of the keys n, specials, grouped, dtype, index_dtype, targets"),
    ("case target unknown", lambda d: d["cases"][1].update(targets=["gpu"]),
     "cases[1].targets[0]", 'one of cuda, cpu, got "gpu"'),
    ("case targets a string", lambda d: d["cases"][1].update(targets="cuda"),
     "cases[1].targets", 'a list, got "cuda"'),
    ("case targets empty", lambda d: d["cases"][1].update(targets=[]), "cases[1].targets",
     "a non-empty list, got an empty list"),
    ("case target twice", lambda d: d["cases"][1].update(targets=["cuda", "cuda"]),
     "cases[1].targets[1]", 'unique targets, got a second "cuda"'),
    ("case target not a matrix target", lambda d: d.update(targets=["cpu"]),
     "cases[2].targets[0]", "one of the matrix's targets (cpu), got \"cuda\""),
    ("mode target unknown", lambda d: d["modes"]["plain"].update(targets=["tpu"]),
     "modes.plain.targets[0]", 'one of cuda, cpu, got "tpu"'),
    ("mode targets empty", lambda d: d["modes"]["plain"].update(targets=[]),
     "modes.plain.targets", "a non-empty list"),
    ("mode target not a matrix target",
     lambda d: (d.update(targets=["cuda"]), d["modes"]["plain"].update(targets=["cpu"])),
     "modes.plain.targets[0]", "one of the matrix's targets (cuda), got \"cpu\""),
    ("timing target unknown", lambda d: d["timing"].update(targets=["tpu"]),
     "timing.targets[0]", 'one of cuda, cpu, got "tpu"'),
    ("timing target not a matrix target",
     lambda d: d.update(targets=["cpu"], cases=[{"n": 1}], modes={"plain": {}}),
     "timing.targets[0]", "one of the matrix's targets (cpu), got \"cuda\""),
    ("unknown implementation", lambda d: d["implementations"].append("triton"),
     "implementations[11]", 'one of eager, numba, fp64, ' + KNOWN_REST + 'got "triton"'),
    ("duplicate implementation", lambda d: d["implementations"].append("numba"),
     "implementations[11]", 'unique names, got a second "numba"'),
    ("empty implementations", lambda d: d.update(implementations=[]), "implementations",
     "non-empty list"),
    ("baseline not in implementations", lambda d: d.update(implementations=["numba", "fp64"]),
     "baseline", 'one of implementations (numba, fp64), got "eager"'),
    ("accuracy reference not in implementations",
     lambda d: d.update(implementations=["eager", "numba"]), "accuracy_reference", '"fp64"'),
    ("baseline is the accuracy reference", lambda d: d.update(baseline="fp64"), "baseline",
     'other than accuracy_reference, got "fp64"'),
    ("repeats zero", lambda d: d.update(repeats=0), "repeats", "integer >= 1, got 0"),
    ("timing iters zero", lambda d: d.update(timing={"iters": 0}), "timing.iters", ">= 1"),
    ("negative warmup", lambda d: d.update(timing={"warmup": -1}), "timing.warmup", ">= 0"),
    ("mode name with /", lambda d: d.update(modes={"a/b": {}}), 'modes["a/b"]',
     'a-z 0-9 _ . - starting with a letter or digit, got "a/b"'),
    ("mode name with ;", lambda d: d.update(modes={"x;rm": {}}), 'modes["x;rm"]', 'got "x;rm"'),
    ("mode name upper case", lambda d: d.update(modes={"Plain": {}}), "modes.Plain", "a-z"),
    ("mode name a YAML int", lambda d: d.update(modes={1: {}}), "modes[1]", "a string, got 1"),
    ("mode name ends in a newline", lambda d: d.update(modes={"plain\n": {}}), 'modes["plain\\n"]',
     'got "plain\\n"'),
    ("top-level key a YAML bool", lambda d: d.update({True: 1}), "top level",
     "string keys, got the key true"),
    ("nested key null", lambda d: d["problem"].update({None: 1}), "problem",
     "string keys, got the key null"),
    ("mode null", lambda d: d.update(modes={"plain": None}), "modes.plain",
     "a mapping, got null"),
    ("empty modes", lambda d: d.update(modes={}), "modes", "a non-empty mapping"),
    ("unknown mode key", lambda d: d["modes"]["plain"].update(envs={}), "modes.plain.envs",
     "one of the keys env, torch"),
    ("env name lower case", lambda d: d["modes"]["plain"].update(env={"path": "x"}),
     "modes.plain.env.path", "environment variable name"),
    ("env name ends in a newline", lambda d: d["modes"]["plain"].update(env={"A\n": "x"}),
     'modes.plain.env["A\\n"]', "environment variable name"),
    ("env name with a dash", lambda d: d["modes"]["plain"].update(env={"A-B": "x"}),
     "modes.plain.env.A-B", 'got "A-B"'),
    ("env value with a newline", lambda d: d["modes"]["plain"].update(env={"A": "1\nB=2"}),
     "modes.plain.env.A", 'no newline or NUL, got "1\\nB=2"'),
    ("env value with NUL", lambda d: d["modes"]["plain"].update(env={"A": "1\0"}),
     "modes.plain.env.A", "no newline or NUL"),
    ("env value not a string", lambda d: d["modes"]["plain"].update(env={"A": 1}),
     "modes.plain.env.A", "a string, got 1"),
    ("unknown torch setting", lambda d: d["modes"]["plain"].update(torch={"benchmark": True}),
     "modes.plain.torch.benchmark", "one of the keys deterministic, tf32, inference_mode"),
    ("torch setting not a bool", lambda d: d["modes"]["plain"].update(torch={"tf32": 1}),
     "modes.plain.torch.tf32", "true or false, got 1"),
    ("bad stack kind", lambda d: d.update(stacks={"host": {"kind": "podman"}}),
     "stacks.host.kind", 'one of host, docker, got "podman"'),
    ("stack not a mapping", lambda d: d["stacks"].update(host="host"), "stacks.host",
     'a mapping, got "host"'),
    ("stack kind missing", lambda d: d.update(stacks={"host": {}}), "stacks.host.kind",
     "the key is missing"),
    ("unknown stack key", lambda d: d["stacks"]["host"].update(image="x"), "stacks.host.image",
     'the key kind, got unknown key "image"'),
    ("stack name with a space", lambda d: d.update(stacks={"my host": {"kind": "host"}}),
     'stacks["my host"]', "a-z 0-9"),
    ("empty stacks", lambda d: d.update(stacks={}), "stacks", "a non-empty mapping"),
    ("cell ids collide", lambda d: d.update(stacks={"a-b": {"kind": "host"}, "a": {"kind": "host"}},
                                            modes={"c": {}, "b-c": {}}),
     "modes.b-c", 'cell id "a-b-c-<target>" twice'),
    ("unknown target", lambda d: d.update(targets=["gpu"]), "targets[0]",
     'one of cuda, cpu, got "gpu"'),
    ("duplicate target", lambda d: d.update(targets=["cpu", "cpu"]), "targets[1]",
     'unique targets, got a second "cpu"'),
    ("targets a string", lambda d: d.update(targets="cuda"), "targets", 'a list, got "cuda"'),
    ("empty targets", lambda d: d.update(targets=[]), "targets", "a non-empty list"),
    ("schema_version 2", lambda d: d.update(schema_version=2), "schema_version",
     "newer than this runner"),
    ("schema_version 0", lambda d: d.update(schema_version=0), "schema_version",
     "expected 1, got 0"),
    ("schema_version missing", lambda d: d.pop("schema_version"), "schema_version",
     "the key is missing"),
    ("op other", lambda d: d.update(op="gate_norm"), "op",
     f'one of {", ".join(ops.OPS)}, got "gate_norm"'),
    ("top level a list", lambda d: Whole([d]), "top level", "a mapping, got a list"),
    ("top level a string", lambda d: Whole("gate_residual"), "top level", 'a mapping, got "gate_'),
    ("top level empty", lambda d: Whole(None), "top level", "a mapping, got an empty document"),
    ("a YAML date", lambda d: d["problem"].update(seed=__import__("datetime").date(2026, 11, 29)),
     "problem.seed", 'an integer, got a date "2026-11-29"'),
]


@pytest.mark.parametrize(("change", "path", "fragment"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_config(change: Callable[[dict[str, Any]], Any], path: str, fragment: str) -> None:
    data = shipped()
    result = change(data)
    if isinstance(result, Whole):
        data = result.data
    with pytest.raises(ConfigError) as info:
        parse_matrix(data)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"matrix.yaml: {path}: expected "), message
    assert fragment in message, message
    assert info.value.__cause__ is not None


def test_first_error_counts_the_others() -> None:
    data = shipped()
    data["problem"].update(D=0, G=0)
    data["repeats"] = 0
    with pytest.raises(ConfigError, match=r"^matrix.yaml: problem.D: .* \(\+2 more\)$"):
        parse_matrix(data)


def test_source_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^conf/m.yaml: repeats: "):
        parse_matrix({**shipped(), "repeats": 0}, source="conf/m.yaml")


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "matrix.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "fragment"), [
    ("schema_version: 1\nop: [gate_residual\n", "invalid YAML"),
    ("problem:\n  D: 1\n D: 2\n", "line 3, column 2: invalid YAML"),
    ("problem:\n  D: 1\n  D: 2\n", 'line 3, column 3: invalid YAML: duplicate key "D"'),
    ("modes: {plain: {}}\nmodes: {det: {}}\n",
     'line 2, column 1: invalid YAML: duplicate key "modes"'),
    ("a: &x 1\nb: *y\n", "invalid YAML"),
    ("x: !!python/object:os.system {}\n", "invalid YAML"),
    (b"op: \xff\xfe\n", "cannot read the matrix file"),
])
def test_bad_yaml_file(tmp_path: Path, text: str | bytes, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{path}: ") and fragment in message, message
    assert info.value.__cause__ is not None


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    old = "timing:\n  warmup: 2"
    text = MATRIX.read_text().replace(old, "timing:\n  <<: {warmup: 1, iters: 7}\n  warmup: 2")
    assert text != MATRIX.read_text()
    m = load_matrix(write(tmp_path, text))
    assert (m.timing.warmup, m.timing.iters) == (2, 10)


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "top level: expected a mapping, got an empty document"),
    ("# only a comment\n", "top level: expected a mapping, got an empty document"),
    ("- 1\n- 2\n", "top level: expected a mapping, got a list"),
    ("problem: {D: 0}\n", "schema_version: expected a value, got nothing"),
])
def test_bad_matrix_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"^{path}: ") as info:
        load_matrix(path)
    assert fragment in str(info.value) and len(str(info.value).splitlines()) == 1


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_matrix(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: cannot read the matrix file: " \
        "No such file or directory"
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the matrix file"):
        load_matrix(tmp_path)


def test_shipped_file_edited_on_disk(tmp_path: Path) -> None:
    text = MATRIX.read_text().replace("  - {n: 4097, targets: [cuda]}", "  - {n: 0}")
    expected = r"matrix.yaml: cases\[2\].n: expected an integer >= 1, got 0$"
    with pytest.raises(ConfigError, match=expected):
        load_matrix(write(tmp_path, text))


def test_library_distributions_are_the_registry_s_versioned_ones() -> None:
    """``libraries.versions`` may name exactly the distributions whose library
    implementations run per version (RL-Kernel runs from a source tree)."""
    pytest.importorskip("torch")  # the implementations import torch; the rest of this file not
    import importlib

    from gate_residual_matrix.runner.config.matrix import LIBRARY_DISTRIBUTIONS

    modules = [importlib.import_module(f"gate_residual_matrix.ops.{op}.libraries")
               for op in ops.OPS]
    versioned = {impl.distribution for m in modules for impl in m.LIBRARIES}
    assert set(LIBRARY_DISTRIBUTIONS) == versioned - {"RL-Kernel"}
