"""Child process for the kill -9 tests: a counting job over a deterministic input, committing
every N records and resuming from its checkpoint. Usage:

    python crash_job.py STATE_DIR run  RECORDS COMMIT_EVERY   # process (the rest of) the input
    python crash_job.py STATE_DIR dump OUT.json               # open (recovering) and dump the stores

With a last argument ``batch`` the job is the batch task's (``CountingBatchTask``, fed batches of 1 to
120 rows, its running totals also sent to a jsonl output ``running``, which the dump includes).

Set LOCALSTATE_CRASH_AT=point:n (with the test-only switch LOCALSTATE_TESTING=1, which tests/conftest.py
sets for every test and its children) to make it SIGKILL itself at a commit-protocol point.
"""

import json
import sys
from pathlib import Path

from localstate.core.config import parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.stream import InputRecord
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink
from localstate.core.task import BatchTask, Envelope, StreamTask


class CountingTask(StreamTask):
    def init(self, context):
        self.per_key = context.store("per_key")
        self.per_bucket = context.store("per_bucket")

    def process(self, envelope, collector, coordinator):
        self.per_key.put(envelope.key, (self.per_key.get(envelope.key) or 0) + envelope.value)
        bucket = len(envelope.key) % 7
        self.per_bucket.put(bucket, (self.per_bucket.get(bucket) or 0) + 1)
        if envelope.offset % 13 == 0:  # deletes must be exactly-once too
            self.per_key.delete(f"gone-{envelope.offset % 5}")
        elif envelope.offset % 13 == 1:
            self.per_key.put(f"gone-{envelope.offset % 5}", envelope.offset)


class CountingBatchTask(BatchTask):
    """CountingTask a batch at a time (``merge_many``, the deletes and puts of ``gone-*`` keys applied
    in row order), and each row's running total sent to ``running``."""

    def init(self, context):
        self.per_key = context.store("per_key")
        self.per_bucket = context.store("per_bucket")

    def process_batch(self, batch, collector, coordinator):
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        totals = self.per_key.merge_many(keys, values, results=True)
        self.per_bucket.merge_many([len(key) % 7 for key in keys], [1] * len(keys))
        gone = {}
        for offset in batch.column("offset").to_pylist():
            if offset % 13 == 0:
                gone[f"gone-{offset % 5}"] = None
            elif offset % 13 == 1:
                gone[f"gone-{offset % 5}"] = offset
        for key, value in gone.items():  # the last change of each key in the batch is the one that stays
            if value is None:
                self.per_key.delete(key)
            else:
                self.per_key.put(key, value)
        collector.send_batch("running", keys, totals)


def batch_size(offset: int) -> int:
    """The size of the batch starting at ``offset`` (1..120, varying)."""
    return 1 + (offset * 7919) % 120


def expected_outputs(records: int) -> list[list]:
    """The ``running`` output of the first ``records`` records: each key's running total."""
    totals: dict[str, int] = {}
    out = []
    for i in range(records):
        key, value = input_record(i)
        totals[key] = totals.get(key, 0) + value
        out.append([key, totals[key]])
    return out


def input_record(i: int) -> tuple[str, int]:
    return f"user-{(i * 7919) % 97}", 1 + i % 3


def expected_state(records: int) -> tuple[dict[str, int], dict[int, int]]:
    """Plain Python: per_key and per_bucket after the first ``records`` input records."""
    per_key: dict[str, int] = {}
    per_bucket: dict[int, int] = {}
    for i in range(records):
        key, value = input_record(i)
        per_key[key] = per_key.get(key, 0) + value
        per_bucket[len(key) % 7] = per_bucket.get(len(key) % 7, 0) + 1
        if i % 13 == 0:
            per_key.pop(f"gone-{i % 5}", None)
        elif i % 13 == 1:
            per_key[f"gone-{i % 5}"] = i
    return per_key, per_bucket


def job(state_dir: str, commit_every: int = 1000, batch: bool = False):
    outputs = {"outputs": {"running": {"system": "jsonl", "path": f"{state_dir}/running"}}} if batch else {}
    return parse_job_config({
        "job": {"name": "crash", "task": f"crash_job:{'CountingBatchTask' if batch else 'CountingTask'}",
                "commit_every": commit_every, "commit_interval": 10 ** 9, "state_dir": state_dir},
        **outputs,
        "stores": {"per_key": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int",
                               "write_batch_size": 50},
                   "per_bucket": {"engine": "kv", "backend": "lmdb", "key_serde": "int", "value_serde": "int"}}})


def main() -> None:
    state_dir, mode = sys.argv[1], sys.argv[2]
    batch = sys.argv[-1] == "batch"
    config = job(state_dir, int(sys.argv[4]) if mode == "run" else 1000, batch)
    changelogs = open_changelog_system(config)
    if batch:
        instance = TaskInstance(config, 0, changelogs, StreamSink(config), task_factory=CountingBatchTask)
    else:
        instance = TaskInstance(config, 0, changelogs, task_factory=CountingTask)
    instance.open()
    if mode == "run":
        records = int(sys.argv[3])
        start = instance.position("input")
        if batch:
            i = start
            while i < records:
                end = min(records, i + batch_size(i))
                instance.feed([("input", InputRecord(j, *input_record(j))) for j in range(i, end)], autocommit=True)
                i = end
        else:
            for i in range(start, records):
                key, value = input_record(i)
                instance.process(Envelope("input", 0, i, key, value))
        instance.close(commit=True)
        print("done")
    else:
        dump = {name: [[k, v] for k, v in store.engine.all()] for name, store in instance.stores.items()}
        dump["position"] = instance.position("input")
        if batch:
            dump["running"] = [list(item) for item in instance.sink.outputs["running"].read(0)]
        Path(sys.argv[3]).write_text(json.dumps(dump))
        instance.close(commit=False)


if __name__ == "__main__":
    main()
