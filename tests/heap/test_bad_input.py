"""Bad input: non-numeric / NaN / overflowing scores and timestamps, wrong serde types, late events
per policy, bad options, corrupt changelog records, use after close. Each error is typed and names
the store; a rejected call leaves the store unchanged."""

from __future__ import annotations

import math
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.changelog import ChangelogRecord
from localstate.core.serdes import IntSerde
from localstate.engines.heap import HeapEngineFactory, LateEventError
from localstate.errors import (ConfigError, InvalidValueError, RestoreError, SerdeError, StoreClosedError,
                               StoreError)


@pytest.fixture
def heap(heap_dirs, opener, changelog):
    store = opener(heap_dirs(), changelog, store="ranks", backend="memory")
    store.push("kept", 1.0, {"p": 1})
    yield store
    store.close()


@pytest.mark.parametrize("score", ["1", None, True, float("nan"), Decimal("1.5"), [1], 10 ** 400])
def test_bad_scores_raise_invalid_value_naming_store(heap, score) -> None:
    with pytest.raises(InvalidValueError) as info:
        heap.push("x", score)
    assert info.value.context == {"store": "ranks", "partition": 0}
    assert "score" in info.value.message and info.value.hint
    assert [e.item for e in heap] == ["kept"]  # unchanged


def test_numeric_types_and_infinities_are_accepted(heap) -> None:
    heap.push("np", np.float32(2.5))
    heap.push("frac", Fraction(3, 2))
    heap.push("int", 2)
    heap.push("top", math.inf)
    heap.push("bottom", -math.inf)
    assert [(e.item, e.score) for e in heap] == [
        ("top", math.inf), ("np", 2.5), ("int", 2.0), ("frac", 1.5), ("kept", 1.0), ("bottom", -math.inf)]
    assert all(type(e.score) is float for e in heap)


def test_wrong_serde_types_raise_serde_error_naming_store(heap) -> None:
    with pytest.raises(SerdeError) as info:
        heap.push(42, 1.0)  # string key serde
    assert info.value.context == {"store": "ranks", "partition": 0}
    assert "item" in info.value.message
    with pytest.raises(SerdeError) as info:
        heap.push("x", 1.0, object())  # json value serde
    assert info.value.context == {"store": "ranks", "partition": 0}
    assert "payload" in info.value.message
    with pytest.raises(SerdeError):
        heap.remove(b"bytes")
    assert [e.item for e in heap] == ["kept"] and heap.score("x") is None


def test_reorder_bad_timestamps(heap_dirs, opener, changelog) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", store="logs", backend="memory")
    for ts in ["1", None, float("nan"), math.inf, -math.inf, 2 ** 60, True]:
        with pytest.raises(InvalidValueError) as info:
            buf.push("e", ts)
        assert info.value.context == {"store": "logs", "partition": 0}
    with pytest.raises(InvalidValueError):
        buf.drain_until(float("nan"))
    with pytest.raises(SerdeError) as info:
        buf.push({1, 2}, 5)  # a set is not JSON
    assert info.value.context["store"] == "logs"
    assert len(buf) == 0 and buf.next_sequence == 0
    buf.push("ok", np.int64(5))
    assert [tuple(e) for e in buf.drain_until(math.inf)] == [(5, "ok")]  # inf watermark drains everything
    with pytest.raises(StoreError, match="max_lateness"):
        buf.drain()
    buf.close()


@pytest.mark.parametrize("policy", ["error", "drop", "side_output"])
def test_late_policies(heap_dirs, opener, changelog, policy) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", late_policy=policy, backend="memory")
    buf.push("a", 5)
    buf.push("b", 1)
    assert [e.event for e in buf.drain_until(5)] == ["b", "a"]
    if policy == "error":
        with pytest.raises(LateEventError) as info:
            buf.push("late", 4.5)
        assert info.value.context["timestamp"] == 4.5 and info.value.context["watermark"] == 5
    else:
        assert buf.push("late", 4.5) is False
        assert buf.push("late2", 3) is False
    assert len(buf) == 0
    assert buf.dropped_late == (2 if policy == "drop" else 0)
    late = buf.take_late()
    assert [tuple(e) for e in late] == ([(4.5, "late"), (3, "late2")] if policy == "side_output" else [])
    assert buf.take_late() == []
    buf.close()


def test_late_event_error_carries_lateness_and_survives_pickling(heap_dirs, opener, changelog) -> None:
    """The typed error of ``late_policy = "error"`` (localstate.errors.LateEventError) names the event
    timestamp, the watermark and max_lateness, with a hint; Spark pickles task errors to the driver."""
    import pickle

    from localstate import errors

    buf = opener(heap_dirs(), changelog, kind="reorder", store="logs", backend="memory", max_lateness="2s",
                 timestamp_unit="ms")
    buf.push("new", 10_000)
    with pytest.raises(errors.LateEventError) as info:
        buf.push("old", 7_999)
    error = info.value
    assert LateEventError is errors.LateEventError and isinstance(error, errors.InvalidValueError)
    assert (error.timestamp, error.watermark, error.max_lateness) == (7_999, 8_000.0, 2_000.0)
    assert error.context["store"] == "logs" and error.context["max_lateness"] == 2_000.0
    assert "max_lateness" in error.hint and "side_output" in error.hint
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is errors.LateEventError and (copy.timestamp, copy.watermark) == (7_999, 8_000.0)
    assert str(copy) == str(error)
    assert len(buf) == 1 and buf.push("at the watermark", 8_000) is True  # not late: released in order
    buf.close()


def test_options_are_validated_at_their_config_path() -> None:
    factory = HeapEngineFactory()
    cases = {
        "stores.s.order": {"order": "middle"},
        "stores.s.capacity": {"capacity": 0},
        "stores.s.kind": {"kind": "heap"},
        "stores.s.max_lateness": {"kind": "reorder", "max_lateness": "soon"},
        "stores.s.late_policy": {"kind": "reorder", "late_policy": "ignore"},
        "stores.s.backend": {"backend": "leveldb"},
        "stores.s.rocksdb.max_open_filez": {"rocksdb": {"max_open_filez": 3}},
    }
    for path, raw in cases.items():
        with pytest.raises(ConfigError) as info:
            factory.validate_options("s", raw)
        assert [p.path for p in info.value.problems] == [path], (raw, info.value)
    with pytest.raises(ConfigError) as info:
        factory.validate_options("s", {"kind": "reorder", "capacity": 5})
    assert info.value.problems[0].path == "stores.s.capacity"
    with pytest.raises(ConfigError) as info:
        factory.validate_options("s", {"max_lateness": 5})
    assert info.value.problems[0].path == "stores.s.max_lateness"
    ok = factory.validate_options("s", {"kind": "reorder", "max_lateness": "250ms", "block_cache_size": "8MB"})
    assert ok["max_lateness"] == "250ms" and ok["block_cache_size"] == 8 << 20 and "kv" not in ok


def test_corrupt_records_raise_restore_error_with_offset(heap_dirs, opener, changelog) -> None:
    heap = opener(heap_dirs(), changelog, store="ranks", backend="memory")
    with pytest.raises(RestoreError) as info:
        heap.restore([ChangelogRecord(b"a", b"\x00" * 9, 0), ChangelogRecord(b"b", b"\x01", 1)])
    assert info.value.context == {"store": "ranks", "partition": 0, "offset": 1}
    heap.close()
    buf = opener(heap_dirs(), changelog, kind="reorder", store="logs", backend="memory")
    with pytest.raises(RestoreError) as info:
        buf.restore([ChangelogRecord(b"short", b"x", 7)])
    assert info.value.context["offset"] == 7
    buf.close()


def test_use_after_close_raises_store_closed(heap) -> None:
    heap.close()
    for call in (lambda: heap.push("a", 1), heap.pop, heap.peek, lambda: heap.top(1), lambda: len(heap),
                 heap.flush, heap.local_offset, lambda: list(heap)):
        with pytest.raises(StoreClosedError) as info:
            call()
        assert info.value.context["store"] == "ranks"
    heap.close()  # idempotent


def test_int_item_serde_orders_ties_numerically(heap_dirs, opener, changelog) -> None:
    """The tie-break is the serialized item bytes: with the int serde that is numeric order."""
    heap = opener(heap_dirs(), changelog, key_serde=IntSerde(), backend="memory", order="min")
    for item in [5, -3, 12, 0]:
        heap.push(item, 1.0)
    heap.push(7, 0.5)
    assert [e.item for e in heap] == [7, -3, 0, 5, 12]
    heap.close()


def test_failed_restore_leaves_a_consistent_order(heap_dirs, opener, changelog) -> None:
    heap = opener(heap_dirs(), changelog, backend="memory")
    for i in range(50):
        heap.push(f"i{i:02d}", i)
    good = [ChangelogRecord(b"i07", bytes.fromhex("4059000000000000") + b"\x00", 0)]  # score 100.0
    with pytest.raises(RestoreError):
        heap.restore(good + [ChangelogRecord(b"bad", b"\x07", 1)])
    assert [e.item for e in heap][:2] == ["i07", "i49"]  # what was applied is in order, nothing stale
    assert len(list(heap)) == len(heap) == 50
    heap.close()


def test_kind_picks_the_heap_variant() -> None:
    factory = HeapEngineFactory()
    assert factory.validate_options("s", {})["kind"] == "topn"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kind never warns
        ok = factory.validate_options("s", {"kind": "reorder", "max_lateness": 5})
    assert ok["kind"] == "reorder" and "mode" not in ok
    with pytest.raises(ConfigError) as info:
        factory.validate_options("s", {"kind": "heap"})
    assert [p.path for p in info.value.problems] == ["stores.s.kind"]
    with pytest.raises(ConfigError) as info:
        factory.validate_options("s", {"kind": "topn", "max_lateness": 5})
    assert info.value.problems[0].path == "stores.s.max_lateness"
    assert 'kind = "reorder"' in info.value.problems[0].message


@pytest.mark.parametrize("raw, advice", [
    ({"mode": "reorder", "max_lateness": 5}, 'write kind = "reorder" instead'),
    ({"mode": "topn", "kind": "topn"}, 'write kind = "topn" instead'),
    ({"kind": "topn", "mode": "reorder"}, 'write kind = "reorder" instead'),
])
def test_the_removed_mode_option_says_to_write_kind(raw, advice) -> None:
    with pytest.raises(ConfigError) as info:
        HeapEngineFactory().validate_options("s", raw)
    assert [p.path for p in info.value.problems] == ["stores.s.mode"]
    message = info.value.problems[0].message
    assert "'mode' was removed" in message and advice in message and "unknown option" not in message


def test_the_removed_nested_kv_table_says_to_write_its_keys_at_the_top_level() -> None:
    with pytest.raises(ConfigError) as info:
        HeapEngineFactory().validate_options("s", {"kv": {"block_cache_size": "8MB"}, "capacity": 0})
    problems = {p.path: p.message for p in info.value.problems}
    assert set(problems) == {"stores.s.kv", "stores.s.capacity"}  # reported with the other problems
    assert "'kv' was removed" in problems["stores.s.kv"] and "top level" in problems["stores.s.kv"]
    assert "block_cache_size" in problems["stores.s.kv"]


def test_kind_opens_the_matching_engine(heap_dirs, opener, changelog) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", backend="memory")
    assert type(buf).__name__ == "ReorderBufferEngine" and buf.kind == "reorder"
    buf.close()
    top = opener(heap_dirs(), MemoryChangelogPartition("other", 0), kind="topn", backend="memory")
    assert type(top).__name__ == "TopNEngine"
    top.close()
