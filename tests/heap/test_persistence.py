"""Local state on real backends: reopen reuses it without replay, a stale local copy catches up by
replaying [L, C), records after the checkpoint are trimmed (runtime.partition.recovery.recover_store), and the
stores work inside the runtime (TaskTestDriver crash/restart)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.runtime.partition.recovery import recover_store
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver


def content(store: Any) -> list[tuple]:
    return [tuple(e) for e in store]


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_reopen_reuses_local_state_and_drops_unflushed(heap_dirs, opener, backend) -> None:
    changelog = MemoryChangelogPartition()
    directory = heap_dirs()
    heap = opener(directory, changelog, backend=backend, capacity=50)
    for i in range(200):
        heap.push(f"i{i}", (i * 37) % 101, [i])
    heap.pop()
    heap.flush()
    committed = content(heap)
    offset = changelog.end_offset()
    assert heap.local_offset() == offset
    heap.push("unflushed", 1e9)
    heap.remove(committed[1][0])
    heap.close()  # no flush: both changes are lost
    changelog.drop_unflushed()

    heap = opener(directory, changelog, backend=backend, capacity=50)
    assert heap.local_offset() == offset
    recovery = recover_store(heap, changelog, offset, label="t")
    assert recovery.replayed == 0 and recovery.status == "ready"
    assert content(heap) == committed and len(heap) == 49
    heap.close()


@pytest.mark.parametrize("mode", ["topn", "reorder"])
def test_stale_local_copy_replays_tail_and_uncommitted_records_are_trimmed(heap_dirs, opener, mode) -> None:
    changelog = MemoryChangelogPartition()
    directory, stale = heap_dirs(), heap_dirs()
    options: dict[str, Any] = {"kind": mode, "backend": "rocksdb"}
    store = opener(directory, changelog, **options)

    def work(start: int, stop: int) -> None:
        for i in range(start, stop):
            if mode == "topn":
                store.push(f"i{i % 300}", i % 13)
                if i % 5 == 0:
                    store.pop()
            else:
                store.push({"i": i}, i - i % 17)
                if i % 50 == 49:
                    store.drain_until(i - 20)

    work(0, 1000)
    store.flush()
    store.close()
    shutil.copytree(directory, stale)  # a local copy at offset L
    store = opener(directory, changelog, **options)
    work(1000, 1100)
    store.flush()
    checkpoint, at_checkpoint = changelog.end_offset(), content(store)
    work(1100, 1300)
    store.flush()  # flushed, but the checkpoint never recorded it (crash before the checkpoint file)
    assert changelog.end_offset() > checkpoint
    store.close()

    for where in (stale, directory):  # local behind the checkpoint, then local ahead of it
        store = opener(where, changelog, **options)
        recovery = recover_store(store, changelog, checkpoint, label="t")
        assert recovery.local_offset is not None
        assert content(store) == at_checkpoint
        store.close()
        store = opener(where, changelog, **options)  # recovery made it durable
        assert content(store) == at_checkpoint
        store.close()


class TrendingTask(StreamTask):
    """Per input (page, views): running top-3 pages; buffers events and releases them in order."""

    def init(self, context: Any) -> None:
        self.top = context.store("top")
        self.buffer = context.store("buffer")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        page, ts = envelope.key, envelope.value
        self.top.push(page, (self.top.score(page) or 0) + 1)
        self.buffer.push(page, ts)
        for event in self.buffer.drain():
            collector.send("ordered", event.timestamp, event.event)


STORES = {
    "top": {"engine": "heap", "key_serde": "string", "value_serde": "json", "capacity": 3},
    "buffer": {"engine": "heap", "value_serde": "string", "kind": "reorder",
               "max_lateness": 5},
}


def test_runtime_crash_and_restart_with_task_test_driver(tmp_path) -> None:
    inputs = [(f"p{(i * 7) % 5}", i - (i * 3) % 5) for i in range(60)]

    def run(crash_at: int | None) -> tuple[list, list, float]:
        with TaskTestDriver(TrendingTask, stores=STORES, state_dir=tmp_path / f"run{crash_at}") as driver:
            for n, (page, ts) in enumerate(inputs):
                driver.send("views", page, ts, partition=0)
                if n % 10 == 9:
                    driver.commit()
                if n == crash_at:
                    driver.crash()
                    driver.restart()
            driver.commit()
            top = [tuple(e) for e in driver.store("top")]
            buffered = driver.store("buffer").watermark
            return top, driver.outputs("ordered"), buffered

    expected = run(None)
    assert len(expected[0]) == 3
    stamps = [ts for ts, _ in expected[1]]
    assert stamps == sorted(stamps) and len(stamps) > 40
    for crash_at in (14, 37):
        assert run(crash_at) == expected
