"""Child process of the timer kill tests: a job whose every record registers event-time timers (and
deletes some), committing every N records, with exactly-once file outputs. Usage:

    python timer_crash_job.py STATE_DIR RECORDS COMMIT_EVERY [CHANGELOG]   # process (the rest of) the input, close

CHANGELOG is ``file`` (default) or ``objectstore`` (in STATE_DIR/shared: pipelined commits).

Set LOCALSTATE_CRASH_AT=point:n (with LOCALSTATE_TESTING=1, which tests/conftest.py sets) to make it
SIGKILL itself at a commit-protocol or firing point: ``process``, ``timer_fire``, ``after_timers``,
``mid_flush``, ``after_flush``, ``after_checkpoint``, and with the objectstore ``commit_pending``.
"""

import sys

from localstate.core.config import parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.task import Envelope, StreamTask
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink

LATENESS = 3.0


class TimerTask(StreamTask):
    """Per record: count the key, and set a timer 5s (event time) after the record that reports the
    count then; every 4th record cancels the timer its predecessor set. A firing also sets a follow-up
    timer 1s later for keys ending in "0", the first time (timers registered while firing). Every 5th
    record also sets a processing-time timer 3 seconds ahead of the partition's clock, which here is
    its input position (0.1 s a record: deterministic across restarts)."""

    def init(self, context):
        self.counts = context.kv("counts")
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        self.timers.register_event_time(envelope.key, envelope.timestamp + 5)
        if envelope.offset % 5 == 0:
            self.timers.register_processing_time(envelope.key, self.timers.processing_time() + 3)
        if envelope.offset % 4 == 3:
            previous_key, previous_ts = input_record(envelope.offset - 1)
            self.timers.delete_event_time(previous_key, previous_ts + 5)

    def on_timer(self, key, timestamp, collector, coordinator):
        if self.timers.firing_domain == "processing":
            collector.send("fired", key, [timestamp, "processing"])
            return
        collector.send("fired", key, [timestamp, self.counts.get(key)])
        if key.endswith("0") and timestamp == int(timestamp):
            self.timers.register_event_time(key, timestamp + 1.5)


def clock_at(position: int) -> float:
    """The partition's processing time once ``position`` records were processed."""
    return 1000 + position * 0.1


def input_record(i: int) -> tuple[str, float]:
    """Record ``i``: its key and its event timestamp (out of order by up to 2 seconds)."""
    return f"k{(i * 7) % 11}", float(1000 + i + (i * 5) % 3 - 1)


def job(state_dir: str, commit_every: int, changelog: str = "file"):
    return parse_job_config({
        "job": {"name": "timers", "task": "timer_crash_job:TimerTask", "commit_every": commit_every,
                "commit_interval": 10 ** 9, "state_dir": state_dir, "changelog": changelog},
        "changelogs": {"objectstore": {"url": f"{state_dir}/shared"}} if changelog == "objectstore" else {},
        "time": {"timers": True, "allowed_lateness": LATENESS, "timer_backend": "rocksdb"},
        "outputs": {"fired": {"system": "jsonl", "path": f"{state_dir}/fired"}},
        "stores": {"counts": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int"}}})


def main() -> None:
    state_dir, records, commit_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    config = job(state_dir, commit_every, sys.argv[4] if len(sys.argv) > 4 else "file")
    instance = TaskInstance(config, 0, open_changelog_system(config), StreamSink(config), TimerTask,
                            processing_clock=lambda: clock_at(instance.position("input")))
    instance.open()
    for i in range(instance.position("input"), records):
        key, ts = input_record(i)
        instance.process(Envelope("input", 0, i, key, None, ts))
    instance.close(commit=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
