"""State TTL on Spark: an event-time ttl store through the native input path, several micro-batches
and two partitions; what the task sees equals a plain-Python model of the store time (the watermark
read when each batch starts), and the state reader shows only live entries (docs/time/ttl.md)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.core.config import load_job_config
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.runtime.driver.views import load_checkpoints, store_entries
from localstate.streams.jsonl import read_jsonl, write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.spark

TTL, BATCH = 3.0, 50


def events(seed: int, n: int) -> list[tuple[str, float]]:
    rng = random.Random(seed)
    return [(f"k{rng.randrange(12)}", round(i * 0.1, 3)) for i in range(n)]


def expected(records: list[tuple[str, float]]) -> tuple[list[tuple[str, bool]], set[str]]:
    """What the task sees, batch by batch: the store time is the watermark (the largest timestamp
    fed) when the batch starts; a batch's writes expire ttl after it (after the first watermark for
    the first batch). Also the keys live at the end."""
    seen, expiry, now = [], {}, None
    for start in range(0, len(records), BATCH):
        batch = records[start:start + BATCH]
        for key, _ in batch:
            seen.append((key, key in expiry and (now is None or now < expiry[key])))
            expiry[key] = None if now is None else now + TTL
        watermark = max(ts for _, ts in records[:start + BATCH])
        for key in expiry:
            if expiry[key] is None:
                expiry[key] = watermark + TTL
        now = watermark
    return seen, {key for key, at in expiry.items() if now < at}


def test_event_time_ttl_on_the_native_path(tmp_path, spark_context):
    # each partition's own keys (repeating across partitions), small event times: the input says so
    path = write_counting_job(tmp_path, "ttl", job={"task": "ttl_task:SeenBefore"},
                              store={"backend": "rocksdb", "ttl": f"{TTL}s", "ttl_time": "event"},
                              outputs={"seen": {"system": "jsonl", "path": "seen"}},
                              events={"on_misrouted": "allow", "min_timestamp": False})
    per_partition = {p: events(p, 400) for p in range(2)}
    for p, records in per_partition.items():
        write_jsonl(tmp_path / "data", p, [{"key": k, "value": 1, "ts": ts} for k, ts in records])
    job = load_job_config(path)
    summary = SparkJobRunner(job, context=spark_context, batch_size=BATCH, progress=None).run()
    assert summary.batch_count >= 8
    checkpoints = load_checkpoints(job)
    for p, records in per_partition.items():
        seen, live = expected(records)
        assert [(r["key"], r["value"]) for r in read_jsonl(tmp_path / "seen", p)] == seen
        assert any(not was for _, was in seen[BATCH:])  # entries did expire
        shown = {entry.key for entry in store_entries(job, "counts", checkpoints, partitions=[p],
                                                      from_changelog=True)}
        assert shown == live  # the reader judges by the checkpoint's watermark: expired entries hidden
