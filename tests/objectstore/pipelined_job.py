"""A counting job with outputs on the ``objectstore`` changelog, for the pipelined-commit tests
(test_objectstore_pipelined.py), and its plain-Python model. As a child process:

    python pipelined_job.py '{"root": ..., "options": {...}, "records": N, "commit_every": M}'

opens partition 0 (recovering from the last checkpoint), feeds input records from the checkpointed
position up to ``records`` through the runtime (a commit every ``commit_every`` records), and closes.
``LOCALSTATE_CRASH_AT=point:n`` (with the test switch the tests set) kills it at a commit point.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from localstate.core.config import JobConfig, parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.stream import InputRecord
from localstate.runtime.partition.sink import StreamSink
from localstate.core.task import StreamTask
from localstate.streams.jsonl import read_jsonl

STREAM = "pipelined-counts-changelog"


class CountingTask(StreamTask):
    """Counts per key (every 11th record deletes its key instead) and emits each new count."""

    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        if envelope.value == "delete":
            self.counts.delete(envelope.key)
            collector.send("counts-out", envelope.key, 0)
            return
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts-out", envelope.key, count)


def input_record(i: int) -> tuple[str, Any]:
    return f"k{(i * 7) % 37}", "delete" if i % 11 == 0 else i


def expected(records: int) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Plain Python: the state and the outputs after the first ``records`` input records."""
    state: dict[str, int] = {}
    outputs: list[tuple[str, int]] = []
    for i in range(records):
        key, value = input_record(i)
        if value == "delete":
            state.pop(key, None)
            outputs.append((key, 0))
        else:
            state[key] = state.get(key, 0) + 1
            outputs.append((key, state[key]))
    return state, outputs


def job(root: Path, options: dict[str, Any], *, pipelined_commits: bool = True, commit_every: int = 400) -> JobConfig:
    """The job as a host with local directory ``root`` sees it; changelogs and checkpoints in ``options``'s storage."""
    return parse_job_config({
        "job": {"name": "pipelined", "partitions": 1, "task": "pipelined_job:CountingTask", "changelog": "objectstore",
                "commit_every": commit_every, "commit_interval": 10 ** 9, "pipelined_commits": pipelined_commits,
                "state_dir": str(root / "state")},
        "outputs": {"counts-out": {"system": "jsonl", "path": str(root / "out")}},
        "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}},
        "changelogs": {"objectstore": options}}, base_dir=root)


def open_instance(job_config: JobConfig) -> TaskInstance:
    """Partition 0 of the job, opened (recovered to the last checkpoint, outputs trimmed to it)."""
    instance = TaskInstance(job_config, 0, open_changelog_system(job_config), StreamSink(job_config), CountingTask)
    instance.open()
    return instance


def feed_until(instance: TaskInstance, records: int) -> None:
    """Feed input records from the instance's position up to ``records`` (committing as configured)."""
    start = instance.position("in")
    instance.feed((("in", InputRecord(i, *input_record(i), 0.0)) for i in range(start, records)), autocommit=True)


def outputs(root: Path) -> list[tuple[str, int]]:
    return [(line["key"], line["value"]) for line in read_jsonl(root / "out", 0)]


def main(argv: list[str]) -> int:
    params = json.loads(argv[0])
    instance = open_instance(job(Path(params["root"]), params["options"], commit_every=params["commit_every"]))
    print(f"opened at {instance.position('in')}", flush=True)
    feed_until(instance, params["records"])
    instance.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
