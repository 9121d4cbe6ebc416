"""Child process of the kill -9 tests of transactional Kafka outputs: counts records per key over a
deterministic input and sends each key's running count to a Kafka output, committing every
COMMIT_EVERY records through TaskInstance.commit (the commit path of the continuous runtime: the
partition saves its checkpoint, then commits its output transaction). Usage:

    python txn_crash_job.py STATE_DIR BOOTSTRAP_SERVERS TOPIC RECORDS

LOCALSTATE_CRASH_AT=point:n (with LOCALSTATE_TESTING=1) SIGKILLs it at a commit-protocol point.
"""

import sys

from localstate.core.config import parse_job_config
from localstate.core.task import Envelope, StreamTask
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink

COMMIT_EVERY = 40


def input_key(i: int) -> str:
    return f"k{(i * 31) % 11}"


class RunningCount(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("out", envelope.key, count)


def job(state_dir: str, servers: str, topic: str):
    return parse_job_config({
        "job": {"name": "txn-crash", "task": "txn_crash_job:RunningCount", "commit_every": COMMIT_EVERY,
                "commit_interval": 10 ** 9, "state_dir": state_dir},
        "outputs": {"out": {"system": "kafka", "bootstrap_servers": servers, "topic": topic, "value_serde": "int"}},
        "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}}})


def main() -> None:
    state_dir, servers, topic, records = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config = job(state_dir, servers, topic)
    instance = TaskInstance(config, 0, open_changelog_system(config), StreamSink(config), task_factory=RunningCount)
    instance.open()
    for i in range(instance.position("input"), records):
        instance.process(Envelope("input", 0, i, input_key(i), 1))
    instance.close(commit=True)
    print("done")


if __name__ == "__main__":
    main()
