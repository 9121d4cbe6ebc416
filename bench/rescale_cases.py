"""Workload of ``bench/rescale.py``: the job's task, its keys and values, and the steps it times.

The job keeps one kv store ``state`` (RocksDB, ``string`` keys and values): key ``user-%010d``, a
value of ``value_size`` characters of text (words of a random 4,096-word vocabulary, cut from a
corpus at random places: it compresses about as well as English text). Its task replaces the value
of the event's key (a get and a put), so the live state keeps its size while the job runs.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from localstate.core.task import StreamTask

__all__ = ["UpdateTask", "Corpus", "key_of", "KEY_BYTES", "restore", "read_state", "timed_call"]

KEY_BYTES = 15


def key_of(i: int) -> str:
    return "user-%010d" % i


class UpdateTask(StreamTask):
    """One get and one put of the event's key in the kv store ``state``."""

    def init(self, context: Any) -> None:
        self.state = context.store("state")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        state = self.state
        state.get(envelope.key)
        state.put(envelope.key, envelope.value)


class Corpus:
    """Text of random words to cut values from (a slice at a random place, so values differ)."""

    def __init__(self, value_size: int, chars: int = 32 << 20, seed: int = 45) -> None:
        rng = np.random.default_rng(seed)
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
        words = ["".join(map(chr, letters[rng.integers(0, 26, size=int(n))])) for n in rng.integers(2, 11, 4096)]
        picks = rng.integers(0, len(words), size=chars // 6 + 1)
        self.text = " ".join(words[i] for i in picks.tolist())[:chars]
        self.value_size = value_size
        self.rng = rng

    def values(self, count: int) -> list[str]:
        starts = self.rng.integers(0, len(self.text) - self.value_size, size=count).tolist()
        size, text = self.value_size, self.text
        return [text[s:s + size] for s in starts]

    def rows(self, records: int, batch: int = 100_000) -> Iterator[tuple[str, str, str]]:
        """``(store, key, value)`` of every live key, for the bootstrap."""
        for start in range(0, records, batch):
            stop = min(records, start + batch)
            for i, value in zip(range(start, stop), self.values(stop - start)):
                yield "state", key_of(i), value


def timed_call(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float, float]:
    """``fn(...)``'s result, wall seconds and CPU seconds of this process (every thread)."""
    cpu = time.process_time()
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started, time.process_time() - cpu


def restore(job: Any, work: Path) -> tuple[int, float, float]:
    """What a task does on a host without local state, for every partition of ``job`` (bound to an
    epoch, current or not): open its stores from its checkpoint (``StoreSet.open``: each changelog
    read up to the checkpoint's offset into a fresh RocksDB store), then close them. Returns the
    records restored, wall and CPU seconds (opening the changelog system and reading the checkpoints
    are not timed)."""
    from localstate.runtime.driver.views import load_checkpoints
    from localstate.runtime.layout import epoch_checkpoint_store, open_changelog_system
    from localstate.runtime.partition.stores import StoreSet
    from localstate.runtime.partition.timers import PartitionTime

    checkpoints = load_checkpoints(job)
    system = open_changelog_system(job)
    store = epoch_checkpoint_store(job)
    local = work / f"restore-{uuid.uuid4().hex[:8]}"
    replayed = 0

    def run() -> None:
        nonlocal replayed
        for partition in range(job.partitions):
            stores = StoreSet(job, partition, system, store, local, None, PartitionTime(job, partition, time.time))
            try:
                replayed += sum(r.replayed for r in stores.open(checkpoints[partition]))
            finally:
                stores.close_all(lambda step, what: step())
    try:
        _, wall, cpu = timed_call(run)
    finally:
        system.close()
        shutil.rmtree(local, ignore_errors=True)
    return replayed, wall, cpu


def read_state(job_file: Path) -> int:
    """The state reader's work without Spark: ``spark.read.format("localstate").option("job", ...)
    .option("store", "state")`` planned on the driver (``load_view``), then every Spark task's rows
    (one per job partition: the committed changelog read, coalesced, each key and value decoded),
    here one after the other in this process. Returns the rows."""
    from localstate.runtime.spark.state_source import ReadOptions, load_view

    view, _ = load_view(ReadOptions.parse({"job": str(job_file), "store": "state"}))
    rows = 0
    for piece in view.slices():
        for _ in view.rows(piece):
            rows += 1
    return rows
