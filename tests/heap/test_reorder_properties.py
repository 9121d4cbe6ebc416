"""Property tests of the reorder buffer against a reference model: output totally ordered by
(timestamp, arrival), nothing lost or duplicated, late events per policy, identical after restore."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.engines.heap import LateEventError


class Model:
    def __init__(self, max_lateness: float | None, policy: str) -> None:
        self.max_lateness = max_lateness
        self.policy = policy
        self.buffer: list[tuple[float, int, Any]] = []
        self.seq = 0
        self.drained = float("-inf")
        self.max_ts = float("-inf")
        self.dropped = 0
        self.late: list[tuple[Any, Any]] = []

    @property
    def watermark(self) -> float:
        if self.max_lateness is None:
            return self.drained
        return max(self.drained, self.max_ts - self.max_lateness)

    def push(self, event: Any, ts: Any) -> bool:
        if ts < self.watermark:
            if self.policy == "drop":
                self.dropped += 1
            elif self.policy == "side_output":
                self.late.append((ts, event))
            return False
        self.buffer.append((ts, self.seq, event))
        self.seq += 1
        self.max_ts = max(self.max_ts, ts)
        return True

    def drain_until(self, wm: float) -> list[tuple[Any, Any]]:
        out = sorted(e for e in self.buffer if e[0] <= wm)
        self.buffer = [e for e in self.buffer if e[0] > wm]
        self.drained = max(self.drained, wm)
        return [(ts, event) for ts, _, event in out]

    def content(self) -> list[tuple[Any, Any]]:
        return [(ts, event) for ts, _, event in sorted(self.buffer)]


timestamps = st.one_of(st.integers(-5, 30), st.sampled_from([0.5, 2.25, -0.0, 7.0]))
events = st.one_of(st.integers(0, 9), st.text(max_size=3))
operations = st.lists(st.one_of(
    st.tuples(st.just("push"), events, timestamps),
    st.tuples(st.just("push"), events, timestamps),
    st.tuples(st.just("push"), events, timestamps),
    st.tuples(st.just("drain_until"), timestamps),
    st.tuples(st.just("drain")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("peek")),  # reads the order between pushes (pushes are placed lazily)
), max_size=60)


def pairs(events: Any) -> list[tuple[Any, Any]]:
    return [(e.timestamp, e.event) for e in events]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, max_lateness=st.one_of(st.none(), st.integers(0, 6)),
       policy=st.sampled_from(["drop", "side_output"]), split=st.floats(0, 1))
def test_reorder_matches_model_and_restores(heap_dirs, opener, compact, ops, max_lateness, policy, split) -> None:
    changelog = MemoryChangelogPartition()
    options: dict[str, Any] = {"kind": "reorder", "late_policy": policy, "backend": "memory"}
    if max_lateness is not None:
        options["max_lateness"] = max_lateness
    buf = opener(heap_dirs(), changelog, **options)
    model = Model(max_lateness, policy)
    released: list[tuple[Any, Any]] = []
    for op in ops:
        if op[0] == "push":
            assert buf.push(op[1], op[2]) == model.push(op[1], op[2])
        elif op[0] == "drain_until":
            out = pairs(buf.drain_until(op[1]))
            assert out == model.drain_until(op[1])
            released += out
        elif op[0] == "drain":
            if max_lateness is None:
                continue
            out = pairs(buf.drain())
            assert out == (model.drain_until(model.watermark) if model.max_ts != float("-inf") else [])
            released += out
        elif op[0] == "peek":
            head = buf.peek()
            assert (None if head is None else (head.timestamp, head.event)) == next(iter(model.content()), None)
        else:
            buf.flush()
        assert len(buf) == len(model.buffer)
        assert buf.watermark == model.watermark
    # Released output is totally ordered by timestamp; nothing lost or duplicated.
    assert [ts for ts, _ in released] == sorted(ts for ts, _ in released)
    assert pairs(buf) == model.content()
    assert buf.dropped_late == model.dropped
    assert pairs(buf.take_late()) == model.late
    assert buf.take_late() == []
    for (ts, _), e in zip(model.content(), buf):
        assert type(e.timestamp) is type(ts)  # int timestamps come back as ints
    buf.flush()
    records = list(changelog.read())
    state = (pairs(buf), buf.watermark, buf.max_timestamp, buf.next_sequence)
    buf.close()

    for replay in (records, compact(records)):
        restored = opener(heap_dirs(), MemoryChangelogPartition(), **options)
        restored.restore(replay)
        assert (pairs(restored), restored.watermark, restored.max_timestamp, restored.next_sequence) == state
        restored.close()
    cut = int(len(records) * split)
    restored = opener(heap_dirs(), MemoryChangelogPartition(), **options)
    restored.restore(records[:cut])
    restored.restore(records[cut:])
    assert (pairs(restored), restored.watermark, restored.max_timestamp, restored.next_sequence) == state
    # After restore the buffer continues exactly like the original would have.
    assert restored.push("next", 10 ** 6) is True
    restored.close()


def test_events_drained_before_flush_are_never_logged(heap_dirs, opener, changelog) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", backend="memory")
    for i in range(100):
        buf.push(i, i)
    assert [e.event for e in buf.drain_until(99)] == list(range(100))
    buf.flush()
    keys = [r.key for r in changelog.read()]
    assert len(keys) == 1  # only the meta record (sequence, watermark, max timestamp)
    buf.close()


def test_late_event_error_names_store_partition_timestamp_watermark(heap_dirs, opener, changelog) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", backend="memory", store="reorder-logs")
    buf.push("a", 10)
    buf.drain_until(10)
    with pytest.raises(LateEventError) as info:
        buf.push("late", 9)
    err = info.value
    assert err.context == {"store": "reorder-logs", "partition": 0, "timestamp": 9, "watermark": 10}
    assert err.hint and "late_policy" in err.hint
    assert buf.push("on time", 10) is True  # equal to the watermark is still in order
    assert pairs(buf.drain_until(11)) == [(10, "on time")]
    buf.close()


def test_max_lateness_duration_string_uses_timestamp_unit(heap_dirs, opener, changelog) -> None:
    buf = opener(heap_dirs(), changelog, kind="reorder", backend="memory", max_lateness="2s",
                 timestamp_unit="ms", late_policy="drop")
    assert buf.max_lateness == 2000.0
    buf.push("x", 10_000)
    assert buf.watermark == 8000.0
    assert buf.push("too late", 7999) is False
    assert buf.dropped_late == 1
    assert buf.push("ok", 8000) is True
    assert pairs(buf.drain()) == [(8000, "ok")]
    buf.close()
