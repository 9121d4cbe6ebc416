"""Engine behaviour: coalescing, spills and the offset contract, errors, options, LMDB growth."""

from __future__ import annotations

import enum

import pytest

from localstate.core.codecs import FAST_ERRORS, fast_codec
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, StringSerde
from localstate.engines.kv import KeyValueEngine, KeyValueEngineFactory
from localstate.errors import ConfigError, InvalidValueError, SerdeError, StoreClosedError


def test_coalescing_one_record_per_key(opener) -> None:
    kv = opener(StringSerde(), IntSerde())
    kv.put("other", 1)
    kv.flush()
    before = opener.changelog.end_offset()
    for _ in range(10_000):
        kv.put("counter", (kv.get("counter") or 0) + 1)
    kv.flush()
    records = list(opener.changelog.read(before))
    assert len(records) == 1
    assert records[0].key == b"counter" and IntSerde().deserialize(records[0].value) == 10_000
    assert kv.local_offset() == before + 1


def test_flush_without_changes_logs_nothing(kv) -> None:
    kv.put("a", 1)
    kv.flush()
    end = kv.local_offset()
    kv.flush()
    assert kv.local_offset() == end == opener_end(kv)


def opener_end(kv) -> int:
    return kv.context.changelog.end_offset()


def test_spill_flushes_changelog_first_and_keeps_offset(opener, backend) -> None:
    kv = opener(write_batch_size=10)
    kv.put("first", 0)
    kv.flush()
    committed = kv.local_offset()
    for i in range(25):
        kv.put(f"k{i:02d}", i)
    assert kv.spills == 2
    assert kv.local_offset() == committed                    # a spill does not advance the offset
    flushed = {r.key for r in opener.changelog.read(0)}      # read() only sees flushed records
    on_backend = {k for k, _ in kv.backend.iterate(None, None)}
    assert on_backend - {b"first"} <= flushed                # nothing reached the backend unlogged
    assert len(on_backend) == 23                            # two spills of 11 keys + "first"
    if backend != "memory":
        kv.close()                                           # crash before the commit
        again = opener()
        assert again.local_offset() == committed             # data beyond it is in the changelog
        for key, _ in again.backend.iterate(None, None):
            assert key in flushed or key == b"first"


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_spill_before_first_commit_is_discarded_on_reopen(opener, backend) -> None:
    kv = opener(write_batch_size=5)
    for i in range(12):
        kv.put(f"k{i}", i)
    assert kv.spills == 2
    kv.close()
    again = opener()
    assert again.local_offset() is None
    assert list(again.all()) == []   # data without an offset is unusable: rebuilt from offset 0


def test_none_value_rejected(kv) -> None:
    with pytest.raises(InvalidValueError) as info:
        kv.put("k", None)
    assert "delete" in str(info.value) and "teststore" in str(info.value)
    with pytest.raises(InvalidValueError):
        kv.put_all({"k": None})
    assert kv.get("k") is None


def test_wrong_key_type(kv) -> None:
    for call in (lambda: kv.put(5, 1), lambda: kv.get(5), lambda: kv.delete(b"x"),
                 lambda: kv.get_all([1]), lambda: kv.range(1, 2), lambda: kv.prefix(3)):
        with pytest.raises(SerdeError) as info:
            call()
        assert "teststore" in str(info.value)
        assert info.value.context["store"] == "teststore"


def test_unencodable_string_key(kv) -> None:
    with pytest.raises(SerdeError) as info:
        kv.put("\ud800", 1)             # a lone surrogate cannot be UTF-8 encoded
    assert info.value.context["store"] == "teststore"
    with pytest.raises(SerdeError):
        kv.get("\ud800")


def test_unserializable_value(opener) -> None:
    kv = opener(StringSerde(), IntSerde())
    with pytest.raises(SerdeError) as info:
        kv.put("k", "not an int")
    assert info.value.context == {"store": "teststore", "partition": 0}
    assert kv.get("k") is None


def test_decode_error_names_store_and_partition(opener) -> None:
    from localstate.core.changelog import ChangelogRecord
    kv = opener(StringSerde(), JsonSerde())
    kv.restore([ChangelogRecord(b"k", b"\xff not json", 0)])
    with pytest.raises(SerdeError) as info:
        kv.get("k")
    assert info.value.context == {"store": "teststore", "partition": 0}
    with pytest.raises(SerdeError):
        list(kv.all())


def test_closed_store(kv) -> None:
    kv.put("a", 1)
    kv.close()
    kv.close()  # idempotent
    for call in (lambda: kv.get("a"), lambda: kv.put("a", 1), lambda: kv.delete("a"), lambda: kv.all(),
                 lambda: kv.range("a", "b"), lambda: kv.flush(), lambda: kv.restore([]),
                 lambda: kv.get_all(["a"]), lambda: kv.approximate_count(), lambda: kv.local_offset()):
        with pytest.raises(StoreClosedError) as info:
            call()
        assert info.value.context["store"] == "teststore"



def test_lmdb_rejects_oversized_and_empty_keys(opener, backend) -> None:
    kv = opener(BytesSerde(), BytesSerde())
    if backend != "lmdb":
        kv.put(b"", b"empty key ok")
        kv.put(b"x" * 2000, b"long key ok")
        kv.flush()
        assert kv.get(b"") == b"empty key ok"
        return
    with pytest.raises(InvalidValueError):
        kv.put(b"x" * 2000, b"v")
    with pytest.raises(InvalidValueError):
        kv.put(b"", b"v")
    assert kv.get(b"x" * 2000) is None and kv.get(b"") is None
    kv.delete(b"x" * 2000)                  # cannot exist: nothing logged
    kv.flush()
    assert kv.local_offset() == 0 and kv.get_all([b"", b"y" * 600]) == {}


@pytest.mark.parametrize("backend", ["lmdb"])
def test_lmdb_map_grows(opener, backend) -> None:
    kv = opener(BytesSerde(), BytesSerde(), map_size=1 << 16, write_batch_size=10_000)
    value = b"v" * 4000
    kv.put_all((b"k%06d" % i, value) for i in range(2000))   # ~8 MB into a 64 KiB map
    kv.flush()
    assert kv.backend.grows >= 5
    kv.close()
    again = opener(BytesSerde(), BytesSerde(), map_size=1 << 16)
    assert again.local_offset() == 2000
    assert sum(1 for _ in again.all()) == 2000
    again.put(b"more", value * 100)
    again.flush()
    assert again.get(b"more") == value * 100


def problems(exc: ConfigError) -> dict[str, str]:
    return {p.path: p.message for p in exc.problems}


def test_unknown_and_ill_typed_options() -> None:
    f = KeyValueEngineFactory()
    with pytest.raises(ConfigError) as info:
        f.validate_options("counts", {"cache_sise": 5, "write_batch_size": "big", "backend": "redis",
                                      "compression": "brotli", "block_cache_size": "lots"})
    found = problems(info.value)
    assert set(found) == {"stores.counts.cache_sise", "stores.counts.write_batch_size", "stores.counts.backend",
                          "stores.counts.compression", "stores.counts.block_cache_size"}
    assert "cache_size" in found["stores.counts.cache_sise"]  # did you mean
    with pytest.raises(ConfigError) as info:
        f.validate_options("counts", {"cache_size": -1})
    assert "stores.counts.cache_size" in problems(info.value)


def test_rocksdb_passthrough_validation() -> None:
    f = KeyValueEngineFactory()
    with pytest.raises(ConfigError) as info:
        f.validate_options("counts", {"rocksdb": {"max_open_file": 10, "use_fsync": 1,
                                                  "target_file_size_base": "64MB"}})
    found = problems(info.value)
    assert set(found) == {"stores.counts.rocksdb.max_open_file", "stores.counts.rocksdb.use_fsync"}
    assert "max_open_files" in found["stores.counts.rocksdb.max_open_file"]
    ok = f.validate_options("counts", {"rocksdb": {"max_open_files": 100, "target_file_size_base": "8MB"}})
    assert ok["rocksdb"] == {"max_open_files": 100, "target_file_size_base": 8 << 20}


@pytest.mark.parametrize("backend", ["rocksdb"])
@pytest.mark.parametrize("compression", ["none", "snappy", "lz4", "zstd"])
def test_rocksdb_tuning_options_open(opener, backend, compression) -> None:
    kv = opener(compression=compression, block_cache_size="1MB", write_buffer_size="4MB", bloom_bits=0,
                rocksdb={"max_open_files": 64, "level_compaction_dynamic_level_bytes": True,
                         "max_bytes_for_level_multiplier": 8})
    kv.put("a", 1)
    kv.flush()
    assert kv.get("a") == 1


def test_rocksdb_write_ahead_logs_stay_bounded(tmp_path) -> None:
    """Every write also puts the local offset into the metadata column family: its write-ahead logs
    must be freed as the data's memtables flush (atomic flush), not kept until a reopen replays them."""
    import os

    from localstate.engines.backends.rocksdb import RocksDBBackend

    backend = RocksDBBackend(tmp_path, {"write_buffer_size": "1MB"}, store="s", partition=0)
    value = bytes(40)
    try:
        for commit in range(300):  # ~15 MB of writes: about fifteen 1 MB memtables
            backend.write([(b"user-%08d" % ((commit * 1000 + i) % 5000), value) for i in range(1000)],
                          {b"offset": str(commit).encode()})
        # A background flush may drop a log between the listing and its stat: count what is there.
        sizes = []
        for name in os.listdir(tmp_path):
            if name.endswith(".log"):
                try:
                    sizes.append(os.path.getsize(tmp_path / name))
                except FileNotFoundError:
                    pass
        assert len(sizes) <= 3, sizes
        assert sum(sizes) < 4 << 20
        assert backend.get_meta(b"offset") == b"299"
    finally:
        backend.close()
    reopened = RocksDBBackend(tmp_path, {"write_buffer_size": "1MB"}, store="s", partition=0)
    try:
        assert reopened.get_meta(b"offset") == b"299" and reopened.get(b"user-00000999") == value
    finally:
        reopened.close()


def test_inner_store_for_composing_engines(tmp_path) -> None:
    """How heap/sketch engines build an inner kv store: BytesSerde both ways, validated options."""
    from localstate.changelog.memory import MemoryChangelogPartition
    from localstate.core.engine import StoreContext
    f = KeyValueEngineFactory()
    options = f.validate_options("inner", {"backend": "memory", "cache_size": 0})
    changelog = MemoryChangelogPartition()
    ctx = StoreContext("j", "inner", 3, tmp_path, options, BytesSerde(), BytesSerde(), changelog)
    with f.create(ctx) as kv:
        kv.put(b"k", b"v")
        kv.flush()
        assert kv.local_offset() == 1 and changelog.records[0].key == b"k"


@pytest.mark.parametrize("backend", ["lmdb"])
def test_lmdb_map_grows_while_an_iterator_is_open(opener, backend) -> None:
    """Iterators hold no read transaction between steps, so growing the map is never blocked."""
    kv = opener(BytesSerde(), BytesSerde(), map_size=1 << 16, write_batch_size=100_000)
    kv.put_all((b"a%03d" % i, b"old") for i in range(100))
    kv.flush()
    it = kv.all()
    assert next(it) == (b"a000", b"old")
    kv.put_all((b"a%03d" % i, b"new" * 2000) for i in range(100))
    kv.put_all((b"b%04d" % i, b"x" * 4000) for i in range(1000))
    kv.flush()
    assert kv.backend.grows >= 3
    rest = list(it)
    assert rest == [(b"a%03d" % i, b"old") for i in range(1, 100)]


class _Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize("value", [0, 1, -1, 2**63 - 1, -2**63, _Level.HIGH, 2**63, -2**63 - 1, True, 1.0, "1"])
def test_int_fast_codec_matches_serde(value) -> None:
    """The engine's builtin-speed int codec gives the serde's bytes, or refuses what the serde refuses."""
    serialize, deserialize = fast_codec(IntSerde())
    try:
        expected = IntSerde().serialize(value)
    except SerdeError:
        with pytest.raises(FAST_ERRORS):
            serialize(value)
        return
    try:
        data = serialize(value)
    except FAST_ERRORS:
        assert type(value) is not int   # only subclasses (IntEnum) may take the serde's path
        return
    assert data == expected and deserialize(data) == IntSerde().deserialize(data) == value


def test_fast_path_matches_reference_methods(opener, backend) -> None:
    """The per-instance get/put closures behave exactly like the class's reference methods: same
    bytes pending, same errors, same reads (from the cache, pending writes and the backend)."""
    kv = opener(StringSerde(), IntSerde(), cache_size=4, write_batch_size=1000)
    cases = [("a", 0), ("b", -5), ("c", 2**63 - 1), ("d", _Level.HIGH), ("e", 2**63), ("f", True),
             ("g", 1.5), ("h", None), (5, 1), ("\ud800", 1), ("x" * 600, 1), ("", 2)]

    def outcome(call) -> object:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - comparing outcomes
            return type(exc)
        return "ok"

    for key, value in cases:
        fast = outcome(lambda: kv.put(key, value))
        fast_pending = dict(kv._dirty)
        kv._dirty.clear()
        reference = outcome(lambda: KeyValueEngine.put(kv, key, value))
        assert (key, fast) == (key, reference)
        assert fast_pending == kv._dirty
        kv.flush()
    for cache_cleared in (True, False):
        for key, _ in cases:
            if cache_cleared:
                kv._cache.clear()
            assert outcome(lambda: kv.get(key)) == outcome(lambda: KeyValueEngine.get(kv, key))
            if outcome(lambda: kv.get(key)) == "ok":
                assert kv.get(key) == KeyValueEngine.get(kv, key)


def test_reads_see_every_write_path(opener, backend) -> None:
    """Backend reads (cache off) see commits, spills and restores: LMDB's shared read transaction
    is renewed by every write."""
    from localstate.core.changelog import ChangelogRecord
    kv = opener(StringSerde(), IntSerde(), cache_size=0, write_batch_size=2)
    kv.put("a", 1)
    kv.flush()
    assert kv.get("a") == 1
    kv.put("a", 2)
    assert kv.get("a") == 2                      # pending
    kv.flush()
    assert kv.get("a") == 2                      # backend
    kv.put_all({"a": 3, "b": 3, "c": 3})         # the third pending key spills
    assert kv.spills == 1 and kv.get("a") == 3 and kv.get("c") == 3
    kv.restore([ChangelogRecord(b"a", IntSerde().serialize(4), 9), ChangelogRecord(b"b", None, 10)])
    assert kv.get("a") == 4 and kv.get("b") is None and kv.get_all(["a", "b", "c"]) == {"a": 4, "c": 3}
    kv.delete("c")
    kv.flush()
    assert kv.get("c") is None and dict(kv.all()) == {"a": 4}


def test_int_value_decode_error(opener) -> None:
    from localstate.core.changelog import ChangelogRecord
    kv = opener(StringSerde(), IntSerde())
    kv.restore([ChangelogRecord(b"k", b"\x01\x02\x03", 0)])   # not 8 bytes
    with pytest.raises(SerdeError) as info:
        kv.get("k")
    assert info.value.context == {"store": "teststore", "partition": 0}
