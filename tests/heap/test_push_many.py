"""TopNEngine.push_many: the columnar push, exactly push() per row in order (evictions included)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.errors import InvalidValueError

from .conftest import open_heap


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(-20, 20)), max_size=30),
       capacity=st.sampled_from([None, 1, 3]))
def test_push_many_is_push_per_row(heap_dirs, rows, capacity) -> None:
    options = {"kind": "topn", "order": "max", **({"capacity": capacity} if capacity else {})}
    one = open_heap(heap_dirs(), MemoryChangelogPartition("one", 0), **options)
    many = open_heap(heap_dirs(), MemoryChangelogPartition("many", 0), **options)
    evicted = [e for e in (one.push(item, score) for item, score in rows) if e is not None]
    assert many.push_many(pa.array([i for i, _ in rows], pa.string()), [s for _, s in rows]) == evicted
    assert list(one.top(100)) == list(many.top(100))
    one.close()
    many.close()


def test_push_many_payloads_and_lengths(tmp_path: Path) -> None:
    heap = open_heap(tmp_path / "h", MemoryChangelogPartition("h", 0), kind="topn", order="max")
    heap.push_many(["a", "b"], [1.0, 2.0], [{"x": 1}, None])
    assert [(e.item, e.score, e.payload) for e in heap.top(2)] == [("b", 2.0, None), ("a", 1.0, {"x": 1})]
    with pytest.raises(InvalidValueError):
        heap.push_many(["a"], [1.0, 2.0])
    heap.close()
