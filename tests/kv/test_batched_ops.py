"""The kv engine's batched operations (``get_many``, ``put_many``, ``merge_many``) and encode-once.

Batched calls must leave exactly the state the per-key calls leave (read-your-writes, tombstones,
coalesced changelog records at flush): hypothesis drives two stores side by side, one with the
batched calls and one with the per-key loop, over random batches with repeated keys and key skew,
with a tiny cache so eviction happens, and compares reads, scans and the restored changelog.
A value is encoded once per put (once per surviving write in a batch), errors still come at put."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, Serde, StringSerde
from localstate.engines.kv import KeyValueEngine, KeyValueEngineFactory
from localstate.errors import InvalidValueError, SerdeError


def open_store(directory: Path, changelog: MemoryChangelogPartition, vserde: Serde, backend: str = "memory",
               **options: Any) -> KeyValueEngine:
    factory = KeyValueEngineFactory()
    options.setdefault("backend", backend)
    ctx = StoreContext("job", "batched", 0, directory, factory.validate_options("batched", options), StringSerde(),
                       vserde, changelog)
    return factory.create(ctx)


class CountingSerde(Serde[Any]):
    """A custom serde (JSON of ints and lists) that counts its ``serialize`` calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def serialize(self, obj: Any) -> bytes:
        self.calls += 1
        if not isinstance(obj, (int, list)) or isinstance(obj, bool):
            raise SerdeError(f"counting serde cannot encode {type(obj).__name__}")
        return repr(obj).encode()

    def deserialize(self, data: bytes) -> Any:
        return eval(data.decode())  # noqa: S307 - test data written by serialize above


# -- encode once ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["memory", "rocksdb", "lmdb"])
def test_each_put_encodes_its_value_once(tmp_path: Path, backend: str) -> None:
    serde = CountingSerde()
    changelog = MemoryChangelogPartition("c", 0)
    kv = open_store(tmp_path, changelog, serde, backend, cache_size=4)
    for i in range(10):
        kv.put(f"k{i % 3}", i)          # cached and uncached keys alike
    kv.put("list", [1, 2])
    assert serde.calls == 11
    kv.flush()                          # the flush encodes nothing again
    assert serde.calls == 11
    assert changelog.end_offset() == 4
    kv.put_many(["a", "b", "a", "a"], [1, 2, 3, 4])   # surviving writes: a=4, b=2
    assert serde.calls == 13
    kv.merge_many(["a", "c", "c"], [10, 1, 1])          # a=14, c=2
    assert serde.calls == 15
    kv.flush()
    assert serde.calls == 15
    assert kv.get_many(["a", "b", "c", "k0"]) == [14, 2, 2, 9]
    # errors still come at put, naming the store and the key; nothing is logged or applied
    end = changelog.end_offset()
    with pytest.raises(SerdeError) as info:
        kv.put("bad", "text")
    assert info.value.context["store"] == "batched" and "'bad'" in info.value.message
    with pytest.raises(SerdeError) as info:
        kv.put_many(["x", "bad2"], [1, "text"])
    assert "'bad2'" in info.value.message
    assert kv.get("x") is None          # the batch applied nothing
    with pytest.raises(InvalidValueError):
        kv.put_many(["y"], [None])
    kv.flush()
    assert changelog.end_offset() == end
    kv.close()


def test_json_values_round_trip_through_the_pending_map(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition("j", 0)
    kv = open_store(tmp_path, changelog, JsonSerde(), cache_size=0)   # every read misses the cache
    kv.put("a", {"x": [1, 2]})
    kv.put_many(["b", "c"], ["s", 1.5])
    assert kv.get("a") == {"x": [1, 2]} and kv.get_many(["b", "c", "d"]) == ["s", 1.5, None]
    kv.merge_many(["c", "c"], [1.0, 2.0])
    assert kv.get("c") == 4.5
    kv.flush()
    assert sorted(kv.all()) == [("a", {"x": [1, 2]}), ("b", "s"), ("c", 4.5)]
    kv.close()


def test_merge_many_ops_and_results(tmp_path: Path) -> None:
    kv = open_store(tmp_path, MemoryChangelogPartition("m", 0), IntSerde())
    assert kv.merge_many(["a", "b", "a"], [1, 5, 2], results=True) == [1, 5, 3]
    assert kv.merge_many(["a", "b", "a"], [9, 2, 1], op="min", results=True) == [3, 2, 1]
    assert kv.merge_many(["a", "b", "c"], [0, 7, -4], op="max", results=True) == [1, 7, -4]
    assert kv.merge_many(["a"], [1]) is None
    assert kv.get_many(["a", "b", "c"]) == [2, 7, -4]
    with pytest.raises(InvalidValueError):
        kv.merge_many(["a"], [1], op="mul")
    with pytest.raises(InvalidValueError):
        kv.merge_many(["a", "b"], [1])
    with pytest.raises(SerdeError):     # out of the int serde's range: the failing row is not applied
        kv.merge_many(["b", "a"], [1, 2 ** 63])
    assert kv.get("a") == 2
    kv.close()


# -- batched == per-key ----------------------------------------------------------------------------------

KEYS = [f"k{i}" for i in range(12)]
# skewed: k0 is drawn far more often than the others
key = st.one_of(st.just("k0"), st.just("k0"), st.just("k1"), st.sampled_from(KEYS))
op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(key, st.integers(-50, 50)), max_size=30)),
    st.tuples(st.just("merge"), st.sampled_from(["add", "min", "max"]),
              st.lists(st.tuples(key, st.integers(-50, 50)), max_size=30)),
    st.tuples(st.just("get"), st.lists(key, max_size=20)),
    st.tuples(st.just("delete"), st.lists(key, max_size=4)),
    st.tuples(st.just("flush")),
)


def _per_key(kv: KeyValueEngine, step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "put":
        for k, v in step[1]:
            kv.put(k, v)
    elif kind == "merge":
        fold = {"add": lambda c, d: c + d, "min": min, "max": max}[step[1]]
        out = []
        for k, d in step[2]:
            current = kv.get(k)
            kv.put(k, d if current is None else fold(current, d))
            out.append(kv.get(k))
        return out
    elif kind == "get":
        return [kv.get(k) for k in step[1]]
    elif kind == "delete":
        kv.delete_all(step[1])
    else:
        kv.flush()
    return None


def _batched(kv: KeyValueEngine, step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "put":
        kv.put_many([k for k, _ in step[1]], [v for _, v in step[1]])
    elif kind == "merge":
        return kv.merge_many([k for k, _ in step[2]], [d for _, d in step[2]], op=step[1], results=True)
    elif kind == "get":
        return kv.get_many(step[1])
    elif kind == "delete":
        kv.delete_all(step[1])
    else:
        kv.flush()
    return None


@pytest.mark.parametrize("backend,vserde", [("memory", "int"), ("rocksdb", "int"), ("memory", "json"),
                                            ("lmdb", "json")])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(op, max_size=12), cache_size=st.sampled_from([0, 3, 100]),
       batch=st.sampled_from([4, 10000]))
def test_batched_calls_match_per_key_calls(backend: str, vserde: str, steps: list[tuple[Any, ...]], cache_size: int,
                                           batch: int) -> None:
    serde = IntSerde if vserde == "int" else JsonSerde
    with tempfile.TemporaryDirectory() as tmp:
        stores = []
        for name in ("one", "many"):
            (Path(tmp) / name).mkdir()
            changelog = MemoryChangelogPartition(name, 0)
            stores.append((open_store(Path(tmp) / name, changelog, serde(), backend, cache_size=cache_size,
                                      write_batch_size=batch), changelog))
        (one, one_log), (many, many_log) = stores
        for step in steps:
            assert _per_key(one, step) == _batched(many, step), step
        assert list(one.all()) == list(many.all())
        one.flush()
        many.flush()
        assert list(one.all()) == list(many.all())
        assert one.get_many(KEYS) == many.get_many(KEYS) == [one.get(k) for k in KEYS]

        def replayed(log: MemoryChangelogPartition) -> dict[bytes, bytes | None]:
            state: dict[bytes, bytes | None] = {}
            for record in log.read(0):
                state[record.key] = record.value
            return {k: v for k, v in state.items() if v is not None}

        assert replayed(one_log) == replayed(many_log)
        one.close()
        many.close()


raw_key = st.one_of(st.binary(min_size=0, max_size=3), st.sampled_from([b"k", b"\x00", b"x" * 600]))
raw_step = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(raw_key, st.binary(max_size=3)), max_size=6)),
    st.tuples(st.just("delete"), st.lists(raw_key, max_size=6)),
    st.tuples(st.just("flush")),
)


def _raw_store(directory: Path, changelog: MemoryChangelogPartition, backend: str, **options: Any) -> KeyValueEngine:
    """A store of raw bytes keys and values (as the timer store is): the engine's serde-free path."""
    factory = KeyValueEngineFactory()
    options["backend"] = backend
    ctx = StoreContext("job", "raw", 0, directory, factory.validate_options("raw", options), BytesSerde(),
                       BytesSerde(), changelog)
    return factory.create(ctx)


def _outcome(call: Any) -> Any:
    """What a call did: None, or the type of the typed error it raised and the message's end (its
    start names the key, as the caller passed it)."""
    try:
        call()
    except (InvalidValueError, SerdeError) as exc:
        return type(exc), exc.message.rpartition(" serializes to ")[2]
    return None


@pytest.mark.parametrize("backend", ["memory", "rocksdb", "lmdb"])
@settings(max_examples=30, deadline=None)
@given(steps=st.lists(raw_step, max_size=10), cache_size=st.sampled_from([0, 3]), batch=st.sampled_from([2, 10000]))
def test_raw_bytes_puts_and_batched_deletes_match_the_serde_path(backend: str, steps: list[tuple[Any, ...]],
                                                                 cache_size: int, batch: int) -> None:
    """Exact bytes keys skip the serde calls (put, and ``delete_all`` in one step): the state, the
    errors (a key the backend cannot hold, here lmdb's empty or 600-byte keys) and the replayed
    changelog are those of the per-key calls on bytearray keys, which take the serde's path."""
    with tempfile.TemporaryDirectory() as tmp:
        stores = []
        for name in ("raw", "serde"):
            (Path(tmp) / name).mkdir()
            changelog = MemoryChangelogPartition(name, 0)
            stores.append((_raw_store(Path(tmp) / name, changelog, backend, cache_size=cache_size,
                                      write_batch_size=batch), changelog))
        (raw, raw_log), (slow, slow_log) = stores
        for step in steps:
            if step[0] == "put":
                for k, v in step[1]:
                    assert _outcome(lambda: raw.put(k, v)) == _outcome(lambda: slow.put(bytearray(k), bytearray(v)))
            elif step[0] == "delete":
                raw.delete_all(step[1])
                for k in step[1]:
                    slow.delete(bytearray(k))
            else:
                raw.flush()
                slow.flush()
            assert list(raw.all()) == list(slow.all())
        raw.flush()
        slow.flush()
        # spills may split the per-key calls' records differently: the replayed state is the same
        assert {r.key: r.value for r in raw_log.read(0)} == {r.key: r.value for r in slow_log.read(0)}
        raw.close()
        slow.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb", "lmdb"])
@settings(max_examples=25, deadline=None)
@given(commits=st.lists(st.lists(st.tuples(st.binary(min_size=1, max_size=12),
                                           st.one_of(st.none(), st.binary(max_size=4))), max_size=30),
                        min_size=1, max_size=4),
       write_behind=st.booleans())
def test_a_raw_bytes_store_logs_each_commit_in_key_order(backend: str, commits: list[list[tuple[bytes, Any]]],
                                                         write_behind: bool) -> None:
    """A store whose keys and values are their own encodings (the timer store) logs its pending map as
    it stands, sorted in C: each flush's records are the last change of each key, in bytes order, and
    the state read back is the model's."""
    with tempfile.TemporaryDirectory() as tmp:
        changelog = MemoryChangelogPartition("raw", 0)
        kv = _raw_store(Path(tmp), changelog, backend, write_behind=write_behind)
        model: dict[bytes, bytes] = {}
        try:
            for changes in commits:
                last: dict[bytes, bytes | None] = {}
                for key, value in changes:
                    if value is None:
                        kv.delete(key)
                        model.pop(key, None)
                    else:
                        kv.put(key, value)
                        model[key] = value
                    last[key] = value
                logged = len(list(changelog.read(0)))
                kv.flush()
                assert [(r.key, r.value) for r in list(changelog.read(0))[logged:]] == sorted(last.items())
                assert dict(kv.all()) == model
        finally:
            kv.close()
