"""Timers on Spark: event-time timers through the native input path (several micro-batches, two
partitions) and the DataFrame step, with exact outputs against plain Python; and a standing run that
fires a processing-time timer with no new input, then stays idle (no Spark job)."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the task module, as the Python workers import it
from timer_task import window_end  # noqa: E402

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.core.config import load_job_config, parse_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import checkpoint_store
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.streams.jsonl import read_jsonl, write_jsonl

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
LATENESS = 2.0
START_TIMEOUT = 180.0


def job_file(tmp_path: Path, task: str, partitions: int = 2) -> Path:
    """A counting job (tests/counting_job.py) running ``timer_task:<task>`` with timers, its windows
    (or reports) written to the JSON-lines output ``windows`` in ``out``."""
    # Each partition's records are its own (keys repeat across partitions) and their event times small
    # numbers: the input says so (on_misrouted, min_timestamp).
    return write_counting_job(tmp_path, "timers", partitions=partitions, job={"task": f"timer_task:{task}"},
                              store={"backend": "rocksdb"}, outputs={"windows": {"system": "jsonl", "path": "windows"}},
                              time={"timers": True, "allowed_lateness": f"{LATENESS}s"},
                              events={"on_misrouted": "allow", "min_timestamp": False})


def events(seed: int, n: int) -> list[tuple[str, float]]:
    """``n`` (key, ts) pairs, out of order by less than the allowed lateness: no record is late."""
    rng = random.Random(seed)
    return [(f"k{rng.randrange(6)}", round(i * 0.1 + rng.uniform(0, 1.5), 3)) for i in range(n)]


def expected_windows(records: list[tuple[str, float]]) -> list[tuple[str, list[float]]]:
    """The windows of one partition that close by its final watermark, with their counts, in firing
    order (end, then key)."""
    watermark = max(ts for _, ts in records) - LATENESS
    counts = Counter((window_end(ts), key) for key, ts in records)
    return [(key, [end, count]) for (end, key), count in sorted(counts.items()) if end <= watermark]


def test_event_time_timers_on_the_native_path_fire_once_with_exact_counts(tmp_path, spark_context):
    path = job_file(tmp_path, "WindowCount")
    per_partition = {p: events(p, 400) for p in range(2)}
    for p, records in per_partition.items():
        write_jsonl(tmp_path / "data", p, [{"key": k, "value": 1, "ts": ts} for k, ts in records])
    job = load_job_config(path)
    summary = SparkJobRunner(job, context=spark_context, batch_size=70, progress=None).run()
    assert summary.batch_count >= 6
    for p, records in per_partition.items():
        fired = [(r["key"], r["value"]) for r in read_jsonl(tmp_path / "windows", p)]
        assert fired == expected_windows(records)
        checkpoint = checkpoint_store(job).load(p)
        assert checkpoint.watermark == max(ts for _, ts in records) - LATENESS


def test_a_worker_killed_while_timers_fire_is_retried_and_each_timer_fires_once(tmp_path, spark_context):
    path = job_file(tmp_path, "WindowCount")
    per_partition = {p: events(p + 7, 300) for p in range(2)}
    for p, records in per_partition.items():
        write_jsonl(tmp_path / "data", p, [{"key": k, "value": 1, "ts": ts} for k, ts in records])
    job = load_job_config(path)
    marker = tmp_path / "killed-once"
    # 100 records are 10s of event time: the watermark passes a window's end in every batch.
    fault = {"partition": 0, "batch": 1, "point": "timer_fire", "after": 1, "marker": str(marker)}
    summary = SparkJobRunner(job, context=spark_context, batch_size=100, fault=fault, progress=None).run()
    assert marker.exists(), "the worker of partition 0 should have been SIGKILLed firing a timer in batch 1"
    assert [b.failed_attempts for b in summary.batches] == [0, 1, 0]
    for p, records in per_partition.items():
        assert [(r["key"], r["value"]) for r in read_jsonl(tmp_path / "windows", p)] == expected_windows(records)


def test_event_time_timers_in_the_dataframe_step(spark_context, tmp_path):
    from pyspark.sql import SparkSession

    from localstate.spark import run_batch

    spark = SparkSession(spark_context)
    job = parse_job_config({
        "job": {"name": "df-timers", "partitions": 2, "task": "timer_task:WindowCount", "state_dir": str(tmp_path),
                "pythonpath": [str(HERE)]},
        "time": {"timers": True, "allowed_lateness": LATENESS},
        "stores": {"counts": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int"}},
    }, base_dir=tmp_path)
    records = events(11, 300)
    halves = [records[:150], records[150:]]
    fired = []
    for batch_id, half in enumerate(halves):
        df = spark.createDataFrame([{"user": k, "ts": ts} for k, ts in half], "user string, ts double")
        out = run_batch(df, job, key="user", order_by="ts", batch_id=batch_id).collect()
        fired += [(row.key, row.value) for row in out if row.stream == "windows"]
    import json

    got = Counter((json.loads(key), tuple(json.loads(value))) for key, value in fired)
    expected: Counter = Counter()
    for p in range(2):
        mine = [(k, ts) for k, ts in records if partition_for(k, 2) == p]
        # The DataFrame step sorts each batch by ts: a partition's watermark is its largest ts so far.
        expected.update((key, tuple(value)) for key, value in expected_windows(mine))
    assert got == expected and max(got.values()) == 1


def test_a_standing_run_fires_a_due_processing_time_timer_without_input(tmp_path, spark_context):
    path = job_file(tmp_path, "ReportLater", partitions=1)
    write_jsonl(tmp_path / "data", 0, [{"key": k, "value": 1, "ts": 1_700_000_001.0} for k in ("a", "b", "a")])
    job = load_job_config(path)
    lines: list[str] = []
    runner = SparkJobRunner(job, context=spark_context, progress=lines.append)
    summaries: list = []
    thread = threading.Thread(target=lambda: summaries.append(runner.run(until_drained=False)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while len(read_jsonl(tmp_path / "windows", 0) if (tmp_path / "windows").exists() else []) < 2 \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        while len(lines) < 2 and time.monotonic() < deadline:  # the timer's batch, saved
            time.sleep(0.1)
        reported = [(r["key"], r["value"]) for r in read_jsonl(tmp_path / "windows", 0)]
        assert sorted(reported) == [("a", "idle"), ("b", "idle")]
        batches = len(lines)
        time.sleep(3)  # idle with no timer pending: no batch (the poll finds nothing to plan)
        assert len(lines) == batches
    finally:
        runner.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    [summary] = summaries
    assert summary.batches[0].records_in == 3
    assert summary.batches[-1].records_in == 0       # the timer's batch had no input
    checkpoint = checkpoint_store(job).load(0)
    assert checkpoint.next_timer is None
