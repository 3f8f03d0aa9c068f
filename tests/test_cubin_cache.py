"""kernels/cubin_cache.py without a GPU: the key, atomic entries, bad entries ignored, off.

The GPU half (a second process loads the cubins the first one built, compiles nothing and
gives the same bits) is ``test_cubin_cache_second_process_compiles_nothing`` in
tests/test_kernels_gpu_launch.py.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from gate_residual_matrix.kernels import cubin_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_RESIDUAL_CUBIN_CACHE", str(tmp_path / "cubin"))
    monkeypatch.setattr(cubin_cache, "_VERSIONS", ["numba x; driver y"])
    return tmp_path / "cubin"


class _Dispatcher:
    def __init__(self, **options):
        self.targetoptions = options


def _key(name="k bfloat16", argtypes=("a",), cc=(9, 0), **options):
    return cubin_cache.key(name, _Dispatcher(**options), argtypes, cc)


def test_key_changes_with_every_input_that_decides_the_code(cache, monkeypatch):
    base = _key()
    assert base == _key()
    others = {_key(name="k float16"), _key(argtypes=("b",)), _key(cc=(10, 0)),
              _key(fastmath=True)}
    assert base not in others and len(others) == 4
    monkeypatch.setenv("NUMBA_OPT", "0")
    assert _key() != base
    monkeypatch.delenv("NUMBA_OPT")
    monkeypatch.setattr(cubin_cache, "_VERSIONS", ["numba x; driver z"])
    assert _key() != base
    monkeypatch.setattr(cubin_cache, "_SOURCE_DIGEST", ["another source"])
    assert _key() != base


def test_numbas_cpu_thread_settings_leave_the_key_alone(cache, monkeypatch):
    # the GPU host's cells run with NUMBA_NUM_THREADS set, its compile-ahead workers without
    base = _key()
    monkeypatch.setenv("NUMBA_NUM_THREADS", "2")
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert _key() == base
    monkeypatch.setenv("NUMBA_CUDA_DEFAULT_PTX_CC", "8.0")  # one that can decide the code
    assert _key() != base


def test_source_digest_covers_the_kernels_modules(monkeypatch):
    monkeypatch.setattr(cubin_cache, "_SOURCE_DIGEST", [])
    h = hashlib.sha256()
    for path in sorted(cubin_cache._KERNELS_DIR.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    assert cubin_cache.source_digest() == h.hexdigest()
    assert (cubin_cache._KERNELS_DIR / "gate_residual_kernels.py").exists()


def test_store_then_load_round_trip(cache):
    k = _key()
    assert cubin_cache.load(k) is None
    cubin_cache.store(k, b"\x7fELF cubin bytes", "_Z6kernel", "k bfloat16")
    assert cubin_cache.load(k) == (b"\x7fELF cubin bytes", "_Z6kernel")
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporaries left
    meta = json.loads((cache / f"{k}.json").read_text())
    assert meta["kernel"] == "k bfloat16" and meta["versions"] == "numba x; driver y"


@pytest.mark.parametrize("damage", ["cubin", "json", "sha", "entry", "missing cubin"])
def test_a_bad_entry_is_a_miss(cache, damage):
    k = _key()
    cubin_cache.store(k, b"cubin", "_Z6kernel", "k")
    cubin_path, meta_path = cache / f"{k}.cubin", cache / f"{k}.json"
    meta = json.loads(meta_path.read_text())
    if damage == "cubin":
        cubin_path.write_bytes(b"cubin, truncated or changed")
    elif damage == "json":
        meta_path.write_text("{not json")
    elif damage == "sha":
        meta_path.write_text(json.dumps({**meta, "sha256": "0" * 64}))
    elif damage == "entry":
        meta_path.write_text(json.dumps({**meta, "entry_name": ""}))
    else:
        cubin_path.unlink()
    assert cubin_cache.load(k) is None


def test_off_disables_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GATE_RESIDUAL_CUBIN_CACHE", "off")
    assert cubin_cache.cache_dir() is None
    assert cubin_cache.load("0" * 64) is None
    cubin_cache.store("0" * 64, b"x", "e", "k")  # a no-op, no error
    monkeypatch.delenv("GATE_RESIDUAL_CUBIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cubin_cache.cache_dir() == tmp_path / "gate-residual" / "cubin"


def test_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GATE_RESIDUAL_CUBIN_CACHE", str(blocker / "cubin"))
    monkeypatch.setattr(cubin_cache, "_VERSIONS", ["v"])
    cubin_cache.store(_key(), b"x", "e", "k")
    assert cubin_cache.load(_key()) is None
