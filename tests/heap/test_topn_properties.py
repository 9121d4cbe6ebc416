"""Property tests of the top-N store against a reference model (a dict sorted on demand), including
capacity evictions, ties, infinities, and restore from the full and the compacted changelog."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition


class Model:
    """The specification: order by score (descending for max), ties by UTF-8 item bytes ascending."""

    def __init__(self, order: str, capacity: int | None) -> None:
        self.order = order
        self.capacity = capacity
        self.entries: dict[str, tuple[float, Any]] = {}

    def _key(self, item: str) -> tuple[float, bytes]:
        score = self.entries[item][0]
        return (-score if self.order == "max" else score, item.encode())

    def ordered(self) -> list[tuple[str, float, Any]]:
        return [(item, *self.entries[item]) for item in sorted(self.entries, key=self._key)]

    def push(self, item: str, score: float, payload: Any) -> tuple | None:
        self.entries[item] = (float(score), payload)
        evicted = None
        while self.capacity is not None and len(self.entries) > self.capacity:
            evicted = self.ordered()[-1]
            del self.entries[evicted[0]]
        return evicted

    def remove(self, item: str) -> tuple | None:
        if item not in self.entries:
            return None
        return (item, *self.entries.pop(item))

    def pop(self, worst: bool = False) -> tuple | None:
        if not self.entries:
            return None
        entry = self.ordered()[-1 if worst else 0]
        del self.entries[entry[0]]
        return entry


items = st.text(alphabet="abcé€", min_size=0, max_size=3)
scores = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.0, math.inf, -math.inf]),
                   st.integers(-3, 3), st.floats(allow_nan=False, width=64))
payloads = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=4), st.lists(st.integers(), max_size=2))
operations = st.lists(st.one_of(
    st.tuples(st.just("push"), items, scores, payloads),
    st.tuples(st.just("push"), items, scores, payloads),
    st.tuples(st.just("remove"), items),
    st.tuples(st.just("pop")),
    st.tuples(st.just("pop_worst")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("top"), st.integers(0, 3)),  # reads of the order between pushes (pushes are
    st.tuples(st.just("rank"), items),             # placed lazily, at the next read)
), max_size=60)


def as_tuple(entry: Any) -> tuple | None:
    return None if entry is None else (entry.item, entry.score, entry.payload)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, order=st.sampled_from(["max", "min"]),
       capacity=st.one_of(st.none(), st.integers(1, 4)), split=st.floats(0, 1))
def test_topn_matches_model_and_restores(heap_dirs, opener, compact, ops, order, capacity, split) -> None:
    changelog = MemoryChangelogPartition()
    options: dict[str, Any] = {"order": order, "backend": "memory"}
    if capacity is not None:
        options["capacity"] = capacity
    heap = opener(heap_dirs(), changelog, **options)
    model = Model(order, capacity)
    for op in ops:
        name = op[0]
        if name == "push":
            assert as_tuple(heap.push(op[1], op[2], op[3])) == model.push(op[1], op[2], op[3])
        elif name == "remove":
            assert as_tuple(heap.remove(op[1])) == model.remove(op[1])
        elif name == "pop":
            assert as_tuple(heap.pop()) == model.pop()
        elif name == "pop_worst":
            assert as_tuple(heap.pop_worst()) == model.pop(worst=True)
        elif name == "top":
            assert [as_tuple(e) for e in heap.top(op[1])] == model.ordered()[:op[1]]
        elif name == "rank":
            names = [entry[0] for entry in model.ordered()]
            assert heap.rank(op[1]) == (names.index(op[1]) if op[1] in names else None)
        else:
            heap.flush()
        assert len(heap) == len(model.entries)
    expected = model.ordered()
    assert [as_tuple(e) for e in heap] == expected
    assert [as_tuple(e) for e in heap.top(3)] == expected[:3]
    assert [as_tuple(e) for e in heap.bottom(2)] == expected[::-1][:2]
    assert as_tuple(heap.peek()) == (expected[0] if expected else None)
    for item, score, _ in expected:
        assert heap.score(item) == score
    heap.flush()
    records = list(changelog.read())
    heap.close()

    # A fresh store restored from the full changelog, and from the compacted one, is identical.
    for replay in (records, compact(records)):
        restored = opener(heap_dirs(), MemoryChangelogPartition(), **options)
        restored.restore(replay)
        assert [as_tuple(e) for e in restored] == expected
        restored.close()

    # Replaying a tail on a non-empty store (the runtime's [L, C) replay) gives the same heap.
    cut = int(len(records) * split)
    restored = opener(heap_dirs(), MemoryChangelogPartition(), **options)
    restored.restore(records[:cut])
    restored.restore(records[cut:])
    assert [as_tuple(e) for e in restored] == expected
    restored.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_tail_replay_on_large_heap_uses_incremental_path(heap_dirs, opener, ops) -> None:
    """With many untouched items the restore updates the order item by item instead of rebuilding."""
    changelog = MemoryChangelogPartition()
    heap = opener(heap_dirs(), changelog, backend="memory")
    model = Model("max", None)
    for i in range(200):
        heap.push(f"base{i:03d}", i % 7)
        model.push(f"base{i:03d}", i % 7, None)
    heap.flush()
    base = len(list(changelog.read()))
    for op in ops:
        if op[0] == "push":
            heap.push(op[1], op[2], op[3])
            model.push(op[1], op[2], op[3])
        elif op[0] == "remove":
            heap.remove(op[1])
            model.remove(op[1])
        elif op[0] == "pop":
            assert as_tuple(heap.pop()) == model.pop()
    heap.flush()
    records = list(changelog.read())
    heap.close()
    restored = opener(heap_dirs(), MemoryChangelogPartition(), backend="memory")
    restored.restore(records[:base])
    restored.restore(records[base:])
    assert [as_tuple(e) for e in restored] == model.ordered()
    assert restored.rank(model.ordered()[0][0]) == 0
    restored.close()


def test_restore_over_unplaced_items_keeps_the_order(heap_dirs, opener) -> None:
    """Items pushed but not yet placed in the order (no read since) stay consistent when a restore
    touches them: the restored value wins for the keys it names, the other pending changes stay."""
    changelog = MemoryChangelogPartition()
    heap = opener(heap_dirs(), changelog, backend="memory")
    model = Model("max", None)
    for i in range(100):
        heap.push(f"i{i:03d}", i % 9)
        model.push(f"i{i:03d}", i % 9, None)
    heap.flush()
    records = list(changelog.read())
    assert heap.top(1)  # everything placed
    for i in range(0, 100, 10):  # placed items moved to "unplaced" by an update, and new unplaced items
        heap.push(f"i{i:03d}", 50 + i)
        model.push(f"i{i:03d}", 50 + i, None)
        heap.push(f"new{i}", -i)
        model.push(f"new{i}", -i, None)
    tail = [record for record in records if record.key in (b"i010", b"i011", b"new")]
    heap.restore(tail)  # i010 (unplaced) goes back to its flushed score, i011 (placed) is rewritten
    model.push("i010", 10 % 9, None)
    assert [as_tuple(e) for e in heap] == model.ordered()
    assert heap.rank("i090") == 0 and heap.rank("new90") == len(model.entries) - 1
    heap.close()
