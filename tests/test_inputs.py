"""Inputs are a pure function of their arguments, with pinned bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gate_residual_matrix.contract import compare
from gate_residual_matrix.contract import inputs as inputs_module
from gate_residual_matrix.contract.inputs import special_values, splitmix64, to_storage
from gate_residual_matrix.ops.gate_residual.inputs import make_inputs


def test_splitmix64_reference_values():
    # SplitMix64 from state 0: the published first outputs (Vigna's splitmix64.c)
    assert [int(v) for v in splitmix64(0, 3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_pinned_sha256_catches_drift_across_versions():
    """If numpy or torch ever changed these bits, every cross-version comparison would be void."""
    x = make_inputs(n=5, d=7, g=3, dtype="bfloat16", index_dtype="int64", seed=42, specials=True)
    assert x.sha256() == PINNED


PINNED = {  # written down on 2026-11-29 (numpy 2.4.6, torch 2.13.0+cpu, x86-64)
    "residual": "99493c1073db0bd3d88cc606db2ce404b69dbbea3188d857cbf19a71a461336f",
    "gate": "3c3a045414f5adf074bba7500d80e7857bbd23440290ee36ac21a75be7ac2c69",
    "y": "9996a3e8bf18e15c016e81445ef021962db1468e34a573d3ea71c68646ab7d81",
    "grad_out": "3d0bfa8f2eea2e7cae0a0f4b5f452be76d8a9b2f6fe6703df49b45c560c36ad3",
    "index": "761a65a9c434e01df9fe88f5837e49445c14d094f5c17b68e0ebf6baf33cf664",
}


def test_same_arguments_same_bits_and_case_id_matters():
    a = make_inputs(n=9, d=4, g=3, dtype="float16", index_dtype="int32", seed=7)
    b = make_inputs(n=9, d=4, g=3, dtype="float16", index_dtype="int32", seed=7)
    c = make_inputs(n=9, d=4, g=3, dtype="float16", index_dtype="int32", seed=8)
    assert a.sha256() == b.sha256() != c.sha256()
    assert a.tensors["index"].dtype == torch.int32
    assert int(a.tensors["index"].max()) < 3


def test_specials_are_planted_and_exact():
    x = make_inputs(n=200, d=64, g=4, dtype="bfloat16", index_dtype="int64", seed=3,
                    specials=True).tensors["y"].float()
    assert torch.isnan(x).any() and torch.isinf(x).any()
    assert (x == 0).any() and ((x.abs() < torch.finfo(torch.bfloat16).tiny) & (x != 0)).any()
    for dtype, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16),
                       ("float32", torch.float32)):
        values = special_values(dtype)
        finite = values[np.isfinite(values)]
        assert np.array_equal(torch.from_numpy(finite).to(tdt).double().numpy(), finite)


def test_bf16_rounding_matches_torch_for_finite_values():
    rng = np.random.default_rng()
    values = (rng.standard_normal(100_000) * np.exp(rng.uniform(-80, 80, 100_000)))
    ours = to_storage(values, "bfloat16")
    theirs = torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


def test_standard_values_have_unit_variance():
    y = make_inputs(n=300, d=50, g=2, dtype="float32", index_dtype="int64", seed=5).tensors["y"]
    assert abs(float(y.mean())) < 0.05 and 0.95 < float(y.std()) < 1.05


def test_blocks_do_not_change_the_bits(fresh_seed, monkeypatch):
    """make_inputs builds large tensors in blocks; any block size gives the same bits."""
    rng = np.random.default_rng(fresh_seed)
    n, d = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    whole = make_inputs(n=n, d=d, g=5, dtype="float16", index_dtype="int64", seed=fresh_seed,
                        specials=True)
    monkeypatch.setattr("gate_residual_matrix.contract.inputs._BLOCK", int(rng.integers(1, 17)))
    blocked = make_inputs(n=n, d=d, g=5, dtype="float16", index_dtype="int64",
                          seed=fresh_seed, specials=True)
    assert blocked.sha256() == whole.sha256()


def test_a_multi_block_case_has_the_bits_of_the_h200_report():
    """Case 4097 (22M elements per tensor, six blocks) as the H200 cell recorded it."""
    import json
    from pathlib import Path

    report = json.loads((Path(__file__).parent / "data" / "h200" / "host-plain-cuda.json")
                        .read_text())
    p = report["problem"]
    x = make_inputs(n=4097, d=p["D"], g=p["G"], dtype=p["dtype"], index_dtype=p["index_dtype"],
                    seed=p["seed"])
    assert x.sha256() == report["inputs"]["4097"]["sha256"]
    assert x.index_counts(p["G"]) == report["inputs"]["4097"]["index_counts"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("specials", [False, True])
def test_the_parallel_generator_gives_the_numpy_definitions_bits(fresh_seed, monkeypatch,
                                                                 dtype, specials):
    """Large tensors come from the numba twin of the numpy definition: the same bits, NaN,
    infinities, zeros and subnormals included, at a fresh seed and size."""
    rng = np.random.default_rng(fresh_seed)
    n, d = int(rng.integers(20, 90)), int(rng.integers(30, 200))
    kw = {"n": n, "d": d, "g": 7, "dtype": dtype, "index_dtype": "int32", "seed": fresh_seed,
          "specials": specials}
    monkeypatch.setattr("gate_residual_matrix.contract.inputs._PARALLEL_AT_LEAST",
                        1 << 62)  # numpy only
    reference = make_inputs(**kw)
    monkeypatch.setattr("gate_residual_matrix.contract.inputs._PARALLEL_AT_LEAST",
                        1)  # numba for every tensor
    assert inputs_module._parallel_kernel() is not None, "numba could not compile here"
    parallel = make_inputs(**kw)
    assert parallel.sha256() == reference.sha256()
    for name, t in reference.tensors.items():
        assert torch.equal(compare.bits(t), compare.bits(parallel.tensors[name])), name


def test_parallel_bf16_rounding_matches_numpy_definition():
    """The numba twin of bf16_bits gives the same bits on every float32 pattern class:
    random words (NaN payloads of both signs included), ties, infinities, zeros, extremes."""
    from gate_residual_matrix.contract import inputs as I

    rng = np.random.default_rng()
    words = rng.integers(0, 2**32, size=(1 << 17), dtype=np.uint64).astype(np.uint32)
    edge = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFFFFFFF,
                     0, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 1, 0x00008000, 0x00018000,
                     0x3F808000, 0x3F818000], dtype=np.uint32)
    words[:edge.size] = edge
    kernel = I._bf16_kernel()
    assert kernel is not None, "numba is a dependency: the parallel path must compile here"
    got = np.empty(words.size, dtype=np.uint16)
    kernel(words, got)
    with np.errstate(invalid="ignore"):
        want = I.bf16_bits(words.view(np.float32))
    assert np.array_equal(got, want)
    via_storage = I.to_storage(words.view(np.float32), "bfloat16").view(torch.int16).numpy()
    assert np.array_equal(via_storage.view(np.uint16), want)


@pytest.mark.parametrize("specials", [False, True])
def test_values_read_from_the_input_cache_have_the_bits_of_a_fresh_build(
        fresh_seed, monkeypatch, tmp_path, specials):
    """The first build stores each tensor's values, a second build reads them (nothing is
    kept in the process: the files are all it shares): the same bits in every dtype, bf16
    reading float32's files unless specials (their tables differ) name files of its own;
    a damaged file is computed again, an unwritable folder costs only time."""
    from gate_residual_matrix.contract import input_cache

    rng = np.random.default_rng(fresh_seed)
    n, d = int(rng.integers(20, 60)), int(rng.integers(30, 90))
    kw = {"n": n, "d": d, "g": 5, "index_dtype": "int64", "seed": fresh_seed,
          "specials": specials}
    fresh = {dt: make_inputs(dtype=dt, **kw) for dt in ("float32", "bfloat16")}
    monkeypatch.setenv(input_cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(input_cache, "AT_LEAST", 1)
    computed = []
    real = inputs_module._values32

    def counting(*args):
        computed.append(args[2])
        return real(*args)

    monkeypatch.setattr(inputs_module, "_values32", counting)
    first = make_inputs(dtype="float32", **kw)
    files = sorted((tmp_path / "cache").glob("*.npy"))
    # one file per float stream: residual, gate, y, grad_out (the index is not one)
    assert len(files) == len(computed) == 4
    del computed[:]
    again = {dt: make_inputs(dtype=dt, **kw) for dt in ("float32", "bfloat16")}
    # bf16 without specials reads float32's files; with specials the tables differ
    assert len(computed) == (4 if specials else 0)
    for dt, x in again.items():
        assert x.sha256() == fresh[dt].sha256()
    assert first.sha256() == fresh["float32"].sha256()
    # damaged files: not an .npy, empty (a crash before the data reached the disk), the
    # right header and length but zeros at the end (torn): each computed again, replaced
    for damage in (lambda b: b"not an npy file", lambda b: b"",
                   lambda b: b[:-64] + bytes(64)):
        files[0].write_bytes(damage(files[0].read_bytes()))
        del computed[:]
        assert make_inputs(dtype="float32", **kw).sha256() == fresh["float32"].sha256()
        assert len(computed) == 1
        del computed[:]
        make_inputs(dtype="float32", **kw)  # the file it wrote back is whole
        assert computed == []
    # a folder that cannot be written (here: a file in its place): the same bits, no files
    monkeypatch.setenv(input_cache.ENV, str(files[0]))
    assert make_inputs(dtype="float32", **kw).sha256() == fresh["float32"].sha256()
