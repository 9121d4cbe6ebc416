"""Child process of the windows kill tests: a tumbling count and a session sum over out-of-order
records with late ones, committing every N records, with exactly-once file outputs. Usage:

    python window_crash_job.py STATE_DIR RECORDS COMMIT_EVERY   # process (the rest of) the input, close

LOCALSTATE_CRASH_AT=point:n (with LOCALSTATE_TESTING=1, which tests/conftest.py sets) makes it
SIGKILL itself at a commit-protocol or firing point (``process``, ``timer_fire``, ``after_timers``,
``mid_flush``, ``after_flush``, ``after_checkpoint``).
"""

import sys

from localstate.core.config import parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.task import Envelope, StreamTask
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink
from localstate.windows import Session, Tumbling, WindowedAggregation, count, sum_of

ALLOWED_LATENESS = 2.0
TUMBLING = Tumbling(10)
SESSIONS = Session(3)


class WindowTask(StreamTask):
    def init(self, context):
        self.tumbling = WindowedAggregation(context, TUMBLING, count(), store="counts", output="tumbling",
                                            late_output="late")
        self.sessions = WindowedAggregation(context, SESSIONS, sum_of(), store="sessions", output="sessions",
                                            lateness=1.0)

    def process(self, envelope, collector, coordinator):
        self.tumbling.add(envelope.key, envelope.value, envelope.timestamp, collector)
        self.sessions.add(envelope.key, envelope.value, envelope.timestamp, collector)


def input_record(i: int) -> tuple[str, int, float]:
    """Record ``i``: key, value and event time (out of order by up to 6 s; every 37th 40 s late)."""
    return f"k{(i * 7) % 5}", i % 13, 1000.0 + i * 0.5 + (i * 5) % 7 - 3 - (40.0 if i % 37 == 36 else 0.0)


def job(state_dir: str, commit_every: int):
    outputs = {name: {"system": "jsonl", "path": f"{state_dir}/{name}"} for name in ("tumbling", "sessions", "late")}
    return parse_job_config({
        "job": {"name": "windows", "task": "window_crash_job:WindowTask", "commit_every": commit_every,
                "commit_interval": 10 ** 9, "state_dir": state_dir},
        "time": {"timers": True, "allowed_lateness": ALLOWED_LATENESS},
        "outputs": outputs,
        "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"},
                   "sessions": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "json"}}})


def main() -> None:
    state_dir, records, commit_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    config = job(state_dir, commit_every)
    instance = TaskInstance(config, 0, open_changelog_system(config), StreamSink(config), WindowTask)
    instance.open()
    for i in range(instance.position("input"), records):
        key, value, ts = input_record(i)
        instance.process(Envelope("input", 0, i, key, value, ts))
    instance.close(commit=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
