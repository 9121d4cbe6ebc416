"""One lifecycle: a user's TaskTestDriver test exercises exactly what their job runs.

The same job (event-time timers over a kv store, outputs to a JSON-lines stream) runs twice on the
same records: once with ``localstate run``'s runner on local Spark (micro-batches of 70 records per
partition, a worker SIGKILLed while it fires a timer in batch 1, then retried), once in a
TaskTestDriver fed the same micro-batches (``send_batch`` per partition, a commit after each, a
crash and restart in the middle of batch 1 of partition 0). Both must end with the same state, the
same pending timers, the same watermark and the same outputs in the same order."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the task module, as the Python workers import it

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate import TaskTestDriver
from localstate.core.config import load_job_config
from localstate.core.time import TIMER_STORE
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.streams.jsonl import read_jsonl, write_jsonl

pytestmark = pytest.mark.spark

PARTITIONS, BATCH, RECORDS = 2, 70, 230


def _job(directory: Path) -> Path:
    return write_counting_job(directory, "equivalence", partitions=PARTITIONS, job={"task": "timer_task:WindowCount"},
                              store={"backend": "rocksdb"}, events={"on_misrouted": "allow"},
                              outputs={"windows": {"system": "jsonl", "path": "windows"}},
                              time={"timers": True, "allowed_lateness": "2s"})


def _records(partition: int) -> list[tuple[str, float]]:
    rng = random.Random(partition)
    return [(f"k{rng.randrange(5)}", round(i * 0.1 + rng.uniform(0, 1.5), 3)) for i in range(RECORDS)]


def _state(instance: Any) -> dict[str, Any]:
    stores = instance.stores
    return {"counts": sorted(stores["counts"].engine.all()), "timers": sorted(stores[TIMER_STORE].engine.all()),
            "watermark": instance.time.watermark}


def _spark_state(job: Any, partition: int) -> dict[str, Any]:
    """The committed state of a partition the Spark runner left (opened once more, read, dropped)."""
    changelogs = open_changelog_system(job)
    instance = TaskInstance(job, partition, changelogs)
    try:
        instance.open()
        return _state(instance)
    finally:
        instance.abandon()
        changelogs.close()


def test_a_test_driver_run_and_a_spark_run_give_the_same_state_outputs_and_timers(tmp_path, spark_context):
    records = {p: _records(p) for p in range(PARTITIONS)}

    spark_job = load_job_config(_job(tmp_path / "spark"))
    for p, rows in records.items():
        write_jsonl(tmp_path / "spark" / "data", p, [{"key": k, "value": 1, "ts": ts} for k, ts in rows])
    marker = tmp_path / "killed-once"
    fault = {"partition": 0, "batch": 1, "point": "timer_fire", "after": 1, "marker": str(marker)}
    summary = SparkJobRunner(spark_job, context=spark_context, batch_size=BATCH, fault=fault, progress=None).run()
    assert marker.exists() and sum(b.failed_attempts for b in summary.batches) == 1

    test_job = load_job_config(_job(tmp_path / "driver"))
    with TaskTestDriver("timer_task:WindowCount", job=test_job) as driver:
        driver.declare_input("events", on_misrouted="allow", min_timestamp=0)  # as [inputs.events] says
        for batch, start in enumerate(range(0, RECORDS, BATCH)):
            for p in range(PARTITIONS):
                chunk = records[p][start:start + BATCH]
                driver.send_batch("events", [k for k, _ in chunk], [1] * len(chunk), partition=p,
                                  timestamps=[ts for _, ts in chunk])
                if batch == 1 and p == 0:
                    driver.crash()      # before the commit: this partition's batch is rolled back ...
                    driver.restart()    # ... and delivered again, as Spark retried it
            driver.commit()
        driver_states = {p: _state(driver.instances[p]) for p in range(PARTITIONS)}
        driver_outputs = {p: [(m.key, m.value) for m in driver.sink.streams.get(("windows", p), [])]
                          for p in range(PARTITIONS)}

    for p in range(PARTITIONS):
        assert _spark_state(spark_job, p) == driver_states[p]
        assert [(r["key"], r["value"]) for r in read_jsonl(tmp_path / "spark" / "windows", p)] == driver_outputs[p]
        assert driver_outputs[p], "some windows closed"
        assert checkpoint_store(spark_job).load(p).inputs == {"events": RECORDS}
