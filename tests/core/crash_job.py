"""Child process for the kill -9 tests: a counting job over a deterministic input, committing
every N records and resuming from its checkpoint. Usage:

    python crash_job.py STATE_DIR run  RECORDS COMMIT_EVERY   # process (the rest of) the input
    python crash_job.py STATE_DIR dump OUT.json               # open (recovering) and dump the stores

Set LOCALSTATE_CRASH_AT=point:n (with the test-only switch LOCALSTATE_TESTING=1, which tests/conftest.py
sets for every test and its children) to make it SIGKILL itself at a commit-protocol point.
"""

import json
import sys
from pathlib import Path

from localstate.core.config import parse_job_config
from localstate.core.layout import open_changelog_system
from localstate.runtime.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask


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


def job(state_dir: str, commit_every: int = 1000):
    return parse_job_config({
        "job": {"name": "crash", "task": "crash_job:CountingTask", "commit_every": commit_every,
                "commit_interval": 10 ** 9, "state_dir": state_dir},
        "stores": {"per_key": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int",
                               "write_batch_size": 50},
                   "per_bucket": {"engine": "kv", "backend": "lmdb", "key_serde": "int", "value_serde": "int"}}})


def main() -> None:
    state_dir, mode = sys.argv[1], sys.argv[2]
    config = job(state_dir, int(sys.argv[4]) if mode == "run" else 1000)
    changelogs = open_changelog_system(config)
    instance = TaskInstance(config, 0, changelogs, task_factory=CountingTask)
    instance.open()
    if mode == "run":
        records = int(sys.argv[3])
        start = instance.position("input")
        for i in range(start, records):
            key, value = input_record(i)
            instance.process(Envelope("input", 0, i, key, value))
        instance.close(commit=True)
        print("done")
    else:
        dump = {name: [[k, v] for k, v in store.engine.all()] for name, store in instance.stores.items()}
        dump["position"] = instance.position("input")
        Path(sys.argv[3]).write_text(json.dumps(dump))
        instance.close(commit=False)


if __name__ == "__main__":
    main()
