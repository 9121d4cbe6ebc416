"""The heap's local layout (one segment row per flush, compacted into a snapshot; see
``localstate.engines.heap.base``): reopen after compactions is exact, undecodable or foreign local
state is discarded and rebuilt from the changelog, and items are not bound by LMDB's key limits."""

from __future__ import annotations

from typing import Any

import pytest

import localstate.engines.heap.base as heap_base
from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.registry import open_backend
from localstate.runtime.partition.recovery import recover_store
from localstate.engines.heap.options import backend_options_of


def content(store: Any) -> list[tuple]:
    return [tuple(e) for e in store]


def segments(store: Any) -> list[bytes]:
    with store._backend.iterate(None, None) as rows:
        return [key for key, _ in rows]


@pytest.mark.parametrize("mode", ["topn", "reorder"])
def test_compaction_bounds_segments_and_reopen_is_exact(heap_dirs, opener, monkeypatch, mode) -> None:
    monkeypatch.setattr(heap_base, "_COMPACT_SLACK", 8)  # compact after 4 x live + 8 stored pairs
    changelog = MemoryChangelogPartition()
    directory = heap_dirs()
    options: dict[str, Any] = {"kind": mode, "backend": "rocksdb"}
    store = opener(directory, changelog, **options)
    most = 0
    for step in range(60):
        for i in range(20):
            n = step * 20 + i
            if mode == "topn":
                store.push(f"k{n % 37}", (n * 7) % 11, {"n": n} if n % 3 else None)
                if n % 4 == 0:
                    store.pop()
            else:
                store.push({"n": n}, n - n % 5)
                if n % 10 == 9:
                    store.drain_until(n - 12)
        store.flush()
        most = max(most, len(segments(store)))
        if step % 20 == 19:  # reopen from local state only: identical, nothing to replay
            expected, offset = content(store), changelog.end_offset()
            store.close()
            store = opener(directory, changelog, **options)
            assert store.local_offset() == offset
            assert recover_store(store, changelog, offset, label="t").replayed == 0
            assert content(store) == expected
    assert store._segment_pairs <= 4 * store._live_count() + 8 + 20 * 2
    assert most < 30, "compaction must keep the number of segments small"
    store.close()


def test_undecodable_local_state_is_rebuilt_from_the_changelog(heap_dirs, opener) -> None:
    changelog = MemoryChangelogPartition()
    directory = heap_dirs()
    store = opener(directory, changelog, backend="rocksdb")
    for i in range(50):
        store.push(f"p{i}", i % 7, [i])
    store.flush()
    expected, offset = content(store), changelog.end_offset()
    first = segments(store)[0]
    store.close()
    backend = open_backend("rocksdb", directory, backend_options_of("heap", {"backend": "rocksdb"}))
    backend.write([(first, b"\x00 not marshal data")])
    backend.close()

    store = opener(directory, changelog, backend="rocksdb")
    assert store.local_offset() is None and len(store) == 0  # discarded, not trusted
    recovery = recover_store(store, changelog, offset, label="t")
    assert recovery.status == "rebuilt" and content(store) == expected
    store.close()
    store = opener(directory, changelog, backend="rocksdb")
    assert store.local_offset() == offset and content(store) == expected
    store.close()


def test_local_state_of_another_mode_is_discarded(heap_dirs, opener) -> None:
    changelog = MemoryChangelogPartition()
    directory = heap_dirs()
    store = opener(directory, changelog, backend="lmdb")
    store.push("a", 1.0)
    store.flush()
    store.close()
    buffer = opener(directory, MemoryChangelogPartition(), backend="lmdb", kind="reorder")
    assert buffer.local_offset() is None and len(buffer) == 0
    buffer.close()


def test_items_beyond_lmdb_key_limits_are_fine(heap_dirs, opener, changelog) -> None:
    """Items live inside segment values, so LMDB's key limits (1..511 bytes) do not apply to them."""
    directory = heap_dirs()
    store = opener(directory, changelog, backend="lmdb")
    for n, item in enumerate(("", "x" * 600, "kept")):
        store.push(item, float(n))
    store.flush()
    expected, offset = content(store), changelog.end_offset()
    store.close()
    store = opener(directory, changelog, backend="lmdb")
    assert store.local_offset() == offset and content(store) == expected
    assert [e.item for e in store] == ["kept", "x" * 600, ""]
    store.close()
