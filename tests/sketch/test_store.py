"""The sketch stores on the real inner key-value engine: options, flush deltas, changelog size,
restore bit-for-bit, datasketch export/import, merge, delete, meta checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from datasketch import HyperLogLog as DatasketchHLL

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.changelog import ChangelogRecord
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, IntSerde, StringSerde
from localstate.engines.sketch import (BloomFilterEngine, HyperLogLogEngine, QuantilesEngine, SketchEngineFactory,
                                       encode_item, rank_error)
from localstate.engines.sketch.hll import hash32_function
from localstate.engines.sketch.keys import META_KEY, name_prefix, split_key
from localstate.errors import ConfigError, InvalidValueError, RestoreError, StoreClosedError, StoreError


def open_store(directory: Path, changelog: MemoryChangelogPartition, key_serde: Any = None, **options: Any) -> Any:
    factory = SketchEngineFactory()
    validated = factory.validate_options("s", options)
    directory.mkdir(parents=True, exist_ok=True)
    return factory.create(StoreContext("job", "s", 0, directory, validated, key_serde or StringSerde(),
                                       BytesSerde(), changelog))


def compacted(changelog: MemoryChangelogPartition) -> dict[bytes, bytes | None]:
    last: dict[bytes, bytes | None] = {}
    for record in changelog.read(0):
        last[record.key] = record.value
    return {k: v for k, v in last.items() if v is not None}


# -- options --------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, path", [
    ({"kind": "hll", "precision": 3}, "stores.s.precision"),
    ({"kind": "hll", "precision": 17}, "stores.s.precision"),
    ({"kind": "count-min"}, "stores.s.kind"),
    ({}, "stores.s.kind"),
    ({"kind": "bloom", "error_rate": 1.5}, "stores.s.error_rate"),
    ({"kind": "bloom", "capacity": 0}, "stores.s.capacity"),
    ({"kind": "bloom", "precision": 12}, "stores.s.precision"),
    ({"kind": "quantiles", "k": 4}, "stores.s.k"),
    ({"kind": "quantiles", "hash": "fast"}, "stores.s.hash"),
    ({"kind": "hll", "hash": "md5"}, "stores.s.hash"),
    ({"kind": "hll", "precison": 12}, "stores.s.precison"),
])
def test_bad_options_are_reported_at_their_path(options: dict, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        SketchEngineFactory().validate_options("s", options)
    assert path in [p.path for p in info.value.problems], str(info.value)


def test_defaults_per_kind() -> None:
    factory = SketchEngineFactory()
    assert factory.validate_options("s", {"kind": "hll"})["precision"] == 12
    assert factory.validate_options("s", {"kind": "hll"})["hash"] == "datasketch"
    bloom = factory.validate_options("s", {"kind": "bloom"})
    assert (bloom["capacity"], bloom["error_rate"], bloom["hash"]) == (1_000_000, 0.01, "fast")
    assert factory.validate_options("s", {"kind": "quantiles"})["k"] == 200


def test_registered_entry_point_resolves_to_factory() -> None:
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="localstate.engines") if e.name == "sketch"]
    assert entry.load() is SketchEngineFactory


# -- HLL store ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_hll_flush_reopen_and_restore_are_bit_identical(tmp_path: Path, backend: str) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="hll", precision=10, backend=backend)
    assert isinstance(store, HyperLogLogEngine)
    assert store.local_offset() in (None, 0)
    store.add_many("page-1", [f"u{i}" for i in range(50_000)])
    store.add("page-2", 42)
    store.flush()
    offset = store.local_offset()
    assert offset == changelog.end_offset()
    regs = {n: store.registers(n) for n in ("page-1", "page-2")}
    assert store.names() == ["page-1", "page-2"]
    store.close()
    with pytest.raises(StoreClosedError):
        store.count("page-1")

    reopened = open_store(tmp_path / "a", changelog, kind="hll", precision=10, backend=backend)
    assert reopened.local_offset() == offset
    for name, reg in regs.items():
        assert np.array_equal(reopened.registers(name), reg)
    reopened.close()

    fresh = open_store(tmp_path / "b", changelog, kind="hll", precision=10, backend=backend)
    assert fresh.local_offset() is None or fresh.local_offset() == 0
    fresh.restore(changelog.read(0))
    fresh.flush()
    assert changelog.end_offset() == offset  # restore re-logs nothing
    for name, reg in regs.items():
        assert np.array_equal(fresh.registers(name), reg)
    assert fresh.count("page-1") == pytest.approx(50_000, rel=3 * fresh.standard_error)
    fresh.close()


def test_hll_flush_logs_only_changed_registers(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path, changelog, kind="hll", precision=8)
    store.add_many("x", [f"a{i}" for i in range(2000)])
    store.flush()
    first = changelog.end_offset()
    assert first <= 256 + 1  # registers + the store's meta record
    before = store.registers("x")
    store.add_many("x", [f"a{i}" for i in range(2000)])  # duplicates: nothing changes
    store.flush()
    assert changelog.end_offset() == first
    store.add_many("x", [f"b{i}" for i in range(300)])
    store.flush()
    changed = int(np.count_nonzero(store.registers("x") != before))
    assert changelog.end_offset() - first == changed > 0
    for record in changelog.read(first):
        name, suffix = split_key(record.key)
        index = int.from_bytes(suffix, "big")
        assert name == b"x" and record.value == bytes([store.registers("x")[index]])
    store.close()


def test_hll_changelog_of_1m_adds_is_bounded_by_sketch_size(tmp_path: Path) -> None:
    p = 12
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path, changelog, kind="hll", precision=p, hash="fast")
    total = 1_000_000
    for start in range(0, total, 100_000):
        store.add_many("page", np.arange(start, start + 100_000))
        store.flush()
    records = list(changelog.read(0))
    last = compacted(changelog)
    sketch_keys = [k for k in last if k != META_KEY]
    assert len(sketch_keys) <= 2 ** p
    key_size = len(name_prefix(b"page")) + 4
    compacted_bytes = sum(len(k) + len(v) for k, v in last.items())
    assert compacted_bytes <= 2 ** p * (key_size + 1) + 200
    # even uncompacted, the log is far smaller than the input (8 bytes per item)
    raw_bytes = sum(len(r.key) + len(r.value or b"") for r in records)
    assert raw_bytes < total * 8 / 50
    assert store.count("page") == pytest.approx(total, rel=3 * store.standard_error)
    store.close()


@pytest.mark.parametrize("hash_name", ["datasketch", "fast"])
def test_hll_datasketch_export_import(tmp_path: Path, hash_name: str) -> None:
    store = open_store(tmp_path, MemoryChangelogPartition(), kind="hll", precision=11, hash=hash_name)
    items = [f"item-{i}" for i in range(20_000)]
    store.add_many("s", items)
    exported = store.to_datasketch("s")
    reference = DatasketchHLL(p=11, hashfunc=hash32_function(hash_name))
    for item in items:
        reference.update(encode_item(item))
    assert exported.p == 11 and np.array_equal(exported.reg, reference.reg)
    assert exported.count() == pytest.approx(store.count("s"))
    exported.update(b"one more")  # keeps working with the right hash function
    store.add("s", b"one more")
    assert np.array_equal(exported.reg, store.registers("s"))

    store.from_datasketch("t", reference)
    assert np.array_equal(store.registers("t"), reference.reg)
    other = DatasketchHLL(p=11, hashfunc=hash32_function(hash_name))
    for item in ("x", "y", "z"):
        other.update(item.encode())
    store.merge("t", other, "s")
    expected = np.maximum(np.maximum(reference.reg, other.reg), store.registers("s"))
    assert np.array_equal(store.registers("t"), expected)
    with pytest.raises(InvalidValueError):
        store.from_datasketch("u", DatasketchHLL(p=12))
    if hash_name == "fast":
        with pytest.raises(InvalidValueError):
            store.from_datasketch("u", DatasketchHLL(p=11))  # sha1 registers in a fast-hash store
    store.close()


def test_delete_tombstones_every_unit(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="hll", precision=6)
    store.add_many("gone", [f"a{i}" for i in range(500)])
    store.add_many("kept", ["k"])
    store.flush()
    store.delete("gone")
    assert not store.exists("gone") and store.count("gone") == 0.0
    store.flush()
    assert store.names() == ["kept"]
    assert all(split_key(k)[0] != b"gone" for k in compacted(changelog) if k != META_KEY)
    store.close()
    rebuilt = open_store(tmp_path / "b", changelog, kind="hll", precision=6)
    rebuilt.restore(changelog.read(0))
    assert rebuilt.names() == ["kept"] and not rebuilt.registers("gone").any()
    rebuilt.close()


def loaded_past_a_checkpoint(directory: Path, changelog: MemoryChangelogPartition) -> tuple[Any, Any, int, dict]:
    """An HLL store whose sketch ``s`` is loaded in memory and flushed past a checkpoint: returns the
    store, the registers at the checkpoint, the checkpoint offset, and for every unit written after
    it the unit's value at the checkpoint (None: not set then) -- what the runtime's trim restores."""
    store = open_store(directory, changelog, kind="hll", precision=6)
    store.add_many("s", [f"a{i}" for i in range(100)])
    store.flush()
    committed = store.registers("s")
    checkpoint = changelog.end_offset()
    store.add_many("s", [f"b{i}" for i in range(400)])
    store.flush()
    assert not np.array_equal(store.registers("s"), committed)
    values = dict.fromkeys(r.key for r in changelog.read(checkpoint))
    for record in changelog.read(0, checkpoint):
        if record.key in values:
            values[record.key] = record.value
    return store, committed, checkpoint, values


def test_restore_on_loaded_sketch_applies_last_record_per_unit(tmp_path: Path) -> None:
    """The runtime's trim: records that set units back to checkpointed values."""
    changelog = MemoryChangelogPartition()
    store, committed, checkpoint, values = loaded_past_a_checkpoint(tmp_path, changelog)
    store.restore([ChangelogRecord(k, v, checkpoint + i) for i, (k, v) in enumerate(sorted(values.items()))])
    assert np.array_equal(store.registers("s"), committed)
    store.flush()
    store.close()
    # and what is durable locally is the trimmed state too
    again = open_store(tmp_path, changelog, kind="hll", precision=6)
    assert np.array_equal(again.registers("s"), committed)
    again.close()


def test_reopen_with_other_parameters_is_refused(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="hll", precision=10)
    store.add("s", "x")
    store.flush()
    store.close()
    with pytest.raises(StoreError, match="precision"):
        open_store(tmp_path / "a", changelog, kind="hll", precision=11)
    with pytest.raises(StoreError):
        open_store(tmp_path / "a", changelog, kind="quantiles")
    other = open_store(tmp_path / "b", changelog, kind="hll", precision=11)
    with pytest.raises(RestoreError):
        other.restore(changelog.read(0))
    other.close()


def test_names_through_key_serde(tmp_path: Path) -> None:
    store = open_store(tmp_path / "a", MemoryChangelogPartition(), key_serde=IntSerde(), kind="hll", precision=4)
    store.add(-5, "x")
    store.add(7, "y")
    assert store.names() == [-5, 7]
    store.close()
    raw = open_store(tmp_path / "b", MemoryChangelogPartition(), key_serde=BytesSerde(), kind="hll", precision=4)
    raw.add("page", "x")  # str names are accepted as UTF-8 with the bytes serde
    assert raw.names() == [b"page"] and raw.exists(b"page")
    raw.close()


# -- Bloom store ----------------------------------------------------------------------------------

def test_bloom_store_logs_changed_words_and_restores(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="bloom", capacity=20_000, error_rate=0.01)
    assert isinstance(store, BloomFilterEngine)
    members = [f"m{i}" for i in range(20_000)]
    store.add_many("f", members)
    store.add("g", b"alone")
    store.flush()
    words = store.words("f")
    assert changelog.end_offset() == int(np.count_nonzero(words)) + int(np.count_nonzero(store.words("g"))) + 1
    start = changelog.end_offset()
    store.add("f", "new-item")
    store.flush()
    assert 1 <= changelog.end_offset() - start <= store.hashes  # only the touched words
    assert store.contains_many("f", members).all() and store.contains("f", "new-item")
    assert not store.contains("nope", "m1")
    assert store.contains_many("nope", ["a", "b"]).tolist() == [False, False]
    words = store.words("f")
    store.close()
    fresh = open_store(tmp_path / "b", changelog, kind="bloom", capacity=20_000, error_rate=0.01)
    fresh.restore(changelog.read(0))
    assert np.array_equal(fresh.words("f"), words)
    fresh.merge("h", "f", "g")
    assert np.array_equal(fresh.words("h"), words | fresh.words("g"))
    assert fresh.estimated_count("f") == pytest.approx(20_001, rel=0.05)
    fresh.close()


# -- quantiles store ------------------------------------------------------------------------------

def test_quantiles_store_one_record_per_flush_and_exact_restore(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="quantiles", k=200)
    assert isinstance(store, QuantilesEngine)
    data = np.random.default_rng(3).normal(size=200_000)
    store.add_many("lat", data[:100_000])
    store.flush()
    after_first = changelog.end_offset()
    assert after_first == 2  # meta + one serialised sketch
    store.add_many("lat", data[100_000:])
    store.add("lat", 0.5)
    store.flush()
    assert changelog.end_offset() == after_first + 1
    blob = store.serialized("lat")
    assert len(blob) < 8 * 4 * 200  # bounded by k, not by the 200k inputs
    ordered = np.sort(np.append(data, 0.5))
    points = ordered[::500]
    truth = np.searchsorted(ordered, points, side="right") / ordered.size
    assert np.abs(store.cdf("lat", points) - truth).max() <= rank_error(200)
    assert store.quantile("lat", 0.0) == ordered[0] and store.quantile("lat", 1.0) == ordered[-1]
    assert abs(store.rank("lat", 0.0) - 0.5) <= rank_error(200)
    assert np.isnan(store.quantile("missing", 0.5))
    store.close()

    fresh = open_store(tmp_path / "b", changelog, kind="quantiles", k=200)
    fresh.restore(changelog.read(0))
    assert fresh.serialized("lat") == blob
    # continuing after restore equals continuing without failure
    reference = open_store(tmp_path / "c", MemoryChangelogPartition(), kind="quantiles", k=200, backend="memory")
    reference.add_many("lat", data[:100_000])
    reference.add_many("lat", data[100_000:])
    reference.add("lat", 0.5)
    more = np.random.default_rng(4).uniform(size=50_000)
    fresh.add_many("lat", more)
    reference.add_many("lat", more)
    assert fresh.serialized("lat") == reference.serialized("lat")
    fresh.merge("all", "lat")
    assert fresh.count("all") == fresh.count("lat")
    with pytest.raises(InvalidValueError):
        fresh.add_many("lat", ["not a number"])
    fresh.close()
    reference.close()


def test_docs_example_runs() -> None:
    path = Path(__file__).parents[2] / "docs" / "snippets" / "sketch" / "engine_direct.py"  # in docs/sketch.md
    exec(compile(path.read_text(), str(path), "exec"), {})


def test_empty_and_numpy_inputs(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    hll = open_store(tmp_path / "h", changelog, kind="hll", precision=8, backend="memory")
    hll.add_many("e", [])
    hll.add_many("e", iter([]))
    hll.flush()
    assert hll.names() == [] and hll.count("e") == 0.0
    hll.add_many("n", np.array(["a", "b"]))
    hll.add_many("n", np.array([b"c"]))
    hll.add_many("n", np.array([1, 2], dtype=np.uint16))
    reference = open_store(tmp_path / "r", MemoryChangelogPartition(), kind="hll", precision=8, backend="memory")
    for item in ("a", "b", b"c", 1, 2):
        reference.add("n", item)
    assert np.array_equal(hll.registers("n"), reference.registers("n"))
    with pytest.raises(InvalidValueError):
        hll.add_many("n", np.array([1.5]))
    with pytest.raises(InvalidValueError):
        hll.add("n", 2.0)
    hll.close()
    reference.close()
    bloom = open_store(tmp_path / "b", changelog, kind="bloom", capacity=100, backend="memory")
    bloom.add_many("f", (x for x in ["a", "b"]))
    assert bloom.contains_many("f", []).shape == (0,)
    assert bloom.contains_many("f", ("a", "b")).all()
    bloom.close()
