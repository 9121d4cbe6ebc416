"""The bulk restore path (read_columns -> KV restore_columns -> backend bulk_load) rebuilds exactly
the changelog's state on every backend: after compaction (gaps, dropped overwrites), with
tombstones over existing local data (partial replay), across several bulk runs (several SST
ingests / LMDB transactions, append and non-append), and the result equals the record path's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.core import backend as backend_module
from localstate.core.engine import ColumnRestore, StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import BytesSerde
from localstate.engines.kv import KeyValueEngineFactory

BACKENDS = ["rocksdb", "lmdb", "memory"]


def _engine(directory: Path, backend: str, changelog, **options):  # noqa: ANN001, ANN202
    directory.mkdir(parents=True, exist_ok=True)
    factory = KeyValueEngineFactory()
    validated = factory.validate_options("s", {"backend": backend, "restore_batch_size": 7, **options})
    context = StoreContext(job="j", store="s", partition=0, directory=directory, options=validated,
                           key_serde=BytesSerde(), value_serde=BytesSerde(), changelog=changelog)
    return factory.create(context)


def _log(changelog, rng: random.Random, count: int, keys: int, model: dict) -> None:  # noqa: ANN001
    """Append ``count`` random puts/deletes over ``keys`` keys, flushing now and then; keep ``model``."""
    for i in range(count):
        key = b"k%03d" % rng.randrange(keys)
        value = None if rng.random() < 0.25 else b"v%d-%d" % (i, rng.randrange(1000))
        changelog.append(key, value)
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
        if rng.random() < 0.1:
            changelog.flush()
    changelog.flush()


def _state(engine) -> dict:  # noqa: ANN001
    with engine.all() as items:
        return dict(items)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bulk runs of 16 keys: a restore spans many SST ingests / LMDB transactions / sorted merges."""
    monkeypatch.setattr(backend_module.KVBackend, "bulk_run_keys", 16)


def test_kv_engine_offers_the_column_path(tmp_path: Path, backend: str) -> None:
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    engine = _engine(tmp_path / "store", backend, changelog)
    assert isinstance(engine, ColumnRestore)
    engine.close()
    changelog.close()


@pytest.mark.parametrize("runs", ["one run", "many runs"])
def test_restore_exact_after_compaction(tmp_path: Path, backend: str, runs: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if runs == "many runs":
        monkeypatch.setattr(backend_module.KVBackend, "bulk_run_keys", 16)
    rng = random.Random(19)
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 512, "tombstone_retention": 0}, tmp_path / "log")
    changelog = system.partition("c", 0)
    model: dict[bytes, bytes] = {}
    _log(changelog, rng, 600, 90, model)
    changelog.roll()
    stats = system.compact("c", 0, changelog.flushed_end(), now=1e12)  # tombstones past retention dropped too
    assert stats.records_after < stats.records_before
    engine = _engine(tmp_path / "store", backend, changelog)
    recovery = recover_store(engine, changelog, changelog.flushed_end(), label="t")
    assert recovery.replayed == stats.records_after
    assert _state(engine) == model
    engine.close()
    # Reopened: the bulk-loaded state and its offset are durable.
    engine = _engine(tmp_path / "store", backend, changelog)
    if backend != "memory":
        assert engine.local_offset() == changelog.flushed_end()
        assert _state(engine) == model
    engine.close()
    changelog.close()


def test_partial_replay_deletes_existing_keys(tmp_path: Path, backend: str, small_runs: None) -> None:
    """Local state at offset L, replay [L, C): tombstones in the bulk runs delete keys the store
    already holds (RocksDB: deletions inside an ingested SST file), later values override."""
    if backend == "memory":
        pytest.skip("the memory backend keeps nothing across a reopen: it always restores from 0")
    rng = random.Random(5)
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    model: dict[bytes, bytes] = {}
    engine = _engine(tmp_path / "store", backend, changelog)
    for i in range(60):
        engine.put(b"k%03d" % i, b"first-%d" % i)
        model[b"k%03d" % i] = b"first-%d" % i
    engine.flush()
    local = engine.local_offset()
    engine.close()
    for i in range(0, 60, 3):  # written by another instance after L: deletes and overwrites
        changelog.append(b"k%03d" % i, None)
        model.pop(b"k%03d" % i)
    for i in range(1, 60, 3):
        changelog.append(b"k%03d" % i, b"second-%d" % i)
        model[b"k%03d" % i] = b"second-%d" % i
    _log(changelog, rng, 200, 80, model)
    engine = _engine(tmp_path / "store", backend, changelog)
    assert engine.local_offset() == local
    recovery = recover_store(engine, changelog, changelog.flushed_end(), label="t")
    assert recovery.replayed == changelog.flushed_end() - local
    assert _state(engine) == model
    for i in range(0, 60, 3):
        if b"k%03d" % i not in model:
            assert engine.get(b"k%03d" % i) is None
    engine.close()
    changelog.close()


def test_column_path_equals_record_path(tmp_path: Path, backend: str, small_runs: None) -> None:
    rng = random.Random(11)
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 700}, tmp_path / "log")
    changelog = system.partition("c", 0)
    model: dict[bytes, bytes] = {}
    _log(changelog, rng, 400, 50, model)
    end = changelog.flushed_end()
    by_columns = _engine(tmp_path / "columns", backend, changelog)
    by_columns.restore_columns(changelog.read_columns(0, end))
    by_records = _engine(tmp_path / "records", backend, changelog)
    by_records.restore(changelog.read(0, end))
    assert _state(by_columns) == _state(by_records) == model
    by_columns.close()
    by_records.close()
    changelog.close()


def test_restore_columns_drops_stale_cache(tmp_path: Path, backend: str) -> None:
    """Values cached or pending in the engine are superseded by the restored ones."""
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    engine = _engine(tmp_path / "store", backend, changelog)
    engine.put(b"a", b"pending")
    assert engine.get(b"a") == b"pending"
    other = system.reader("c", 0)
    changelog.append(b"a", b"restored")
    changelog.append(b"b", None)
    changelog.flush()
    engine.restore_columns(other.read_columns(0))
    assert engine.get(b"a") == b"restored" and engine.get(b"b") is None
    engine.close()
    other.close()
    changelog.close()


def test_bulk_load_leaves_no_file_behind(tmp_path: Path, small_runs: None) -> None:
    """RocksDB's SST files are moved into the database: nothing is left in the store directory."""
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    _log(changelog, random.Random(3), 200, 100, {})
    engine = _engine(tmp_path / "store", "rocksdb", changelog)
    recover_store(engine, changelog, changelog.flushed_end(), label="t")
    engine.close()
    assert not list((tmp_path / "store").rglob("bulk-load.sst.tmp"))
    changelog.close()


def test_restore_columns_after_write_behind_commit(tmp_path: Path, backend: str) -> None:
    """With write_behind, a commit's backend write may still run when a restore starts: the bulk
    load waits for it, and the restored values win over the committed (in-flight) ones."""
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    engine = _engine(tmp_path / "store", backend, changelog, write_behind=True)
    for i in range(200):
        engine.put(b"k%03d" % i, b"committed")
    engine.flush()  # the backend write may run in the background now
    other = system.reader("c", 0)
    start = changelog.flushed_end()
    changelog.append_many([(b"k%03d" % i, None if i % 2 else b"restored") for i in range(100)])
    changelog.flush()
    engine.restore_columns(other.read_columns(start))
    engine.flush()
    state = _state(engine)
    assert all(state[b"k%03d" % i] == b"restored" for i in range(0, 100, 2))
    assert all(b"k%03d" % i not in state for i in range(1, 100, 2))
    assert all(state[b"k%03d" % i] == b"committed" for i in range(100, 200))
    engine.close()
    other.close()
    changelog.close()
