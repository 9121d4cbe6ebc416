"""Tasks and job configs for the DataFrame entry point tests (imported by the Python workers too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localstate.core.config import JobConfig, parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext

HERE = Path(__file__).resolve().parent


class CountAndRank(StreamTask):
    """Counts rows per key (kv store ``counts``), ranks keys by count (heap store ``top``), and sends
    the running count and the row's page to ``counts``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")
        self.top = context.store("top")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        self.top.push(envelope.key, count)
        collector.send("counts", envelope.key, [count, envelope.value["page"], envelope.timestamp])


class CountAndRankBatch(BatchTask):
    """:class:`CountAndRank` as a batch task (the same state and outputs)."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")
        self.top = context.store("top")

    def process_batch(self, batch: Any, collector: Collector, coordinator: Coordinator) -> None:
        keys = batch.column("key").to_pylist()
        counts = self.counts.merge_many(keys, [1] * len(keys), results=True)
        for key, count in zip(keys, counts):
            self.top.push(key, count)
        pages = batch.column("value").field("page").to_pylist()
        collector.send_batch("counts", keys, list(map(list, zip(counts, pages, batch.column("timestamp").to_pylist()))))


def job_config(state_dir: Path, partitions: int = 2, name: str = "df-counts",
               task: str = "dataframe_tasks:CountAndRank") -> JobConfig:
    return parse_job_config({
        "job": {"name": name, "partitions": partitions, "task": task,
                "state_dir": str(state_dir)},
        "spark": {"pythonpath": [str(HERE)]},
        "stores": {
            "counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"},
            "top": {"engine": "heap", "key_serde": "string", "value_serde": "json", "order": "max"},
        },
    }, base_dir=HERE)


def read_state(job: JobConfig) -> tuple[dict[str, int], dict[str, float]]:
    """Every partition's committed kv counts and heap scores, read by opening the partitions."""
    counts: dict[str, int] = {}
    scores: dict[str, float] = {}
    changelogs = open_changelog_system(job)
    try:
        for partition in range(job.partitions):
            instance = TaskInstance(job, partition, changelogs)
            instance.open()
            try:
                with instance.stores["counts"].engine.all() as items:
                    counts.update(items)
                top = instance.stores["top"].engine
                scores.update((entry.item, entry.score) for entry in top.top(1_000_000))
            finally:
                instance.close(commit=False)
    finally:
        changelogs.close()
    return counts, scores


def expected_outputs(batches: list[list[dict[str, Any]]]) -> tuple[dict[str, int], list[tuple[int, str, int, str]]]:
    """Plain Python: each batch's rows fed per key in (ts, input order): the final counts and every
    output row as (batch, key, count, page)."""
    counts: dict[str, int] = {}
    rows = []
    for batch_id, batch in enumerate(batches):
        for row in sorted(batch, key=lambda r: r["ts"]):
            counts[row["user"]] = counts.get(row["user"], 0) + 1
            rows.append((batch_id, row["user"], counts[row["user"]], row["page"]))
    return counts, rows
