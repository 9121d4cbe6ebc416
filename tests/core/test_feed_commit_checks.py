"""An autocommitting feed asks its commit policy only where a commit can be due: exactly every
``commit_every`` records, right after a record whose ``process()`` asked for a commit or a shutdown,
and, under a time-based policy, once every :data:`CHECK_EVERY` records (the clock is read that often,
not once per record)."""

from __future__ import annotations

from localstate import StreamTask
from localstate.runtime.partition.committer import CHECK_EVERY, ConfiguredCommits
from localstate.testing.driver import TaskTestDriver

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


class Asker(StreamTask):
    """Counts per key; the key ``commit`` asks for a commit, ``stop`` for a shutdown."""

    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        if envelope.key == "commit":
            coordinator.commit()
        elif envelope.key == "stop":
            coordinator.shutdown()


def _rows(keys):
    return [("views", key, 1, None) for key in keys]


def test_commit_every_commits_at_exactly_every_n_records_within_one_feed():
    with TaskTestDriver(Asker, stores=STORES, commit_every=7) as driver:
        instance = driver.instances[0]
        driver.send_rows(_rows(f"k{i % 3}" for i in range(20)), partition=0)
        assert instance.committer.commits == 2
        assert instance.checkpoints.load(0).inputs == {"views": 14}
        assert instance.committer.processed == 6


def test_a_commit_the_task_asks_for_comes_right_after_its_record():
    with TaskTestDriver(Asker, stores=STORES) as driver:  # commit_interval 5 s: the driver's clock stays at 0
        instance = driver.instances[0]
        driver.send_rows(_rows(["a"] * 10 + ["commit"] + ["b"] * 19), partition=0)
        assert instance.committer.commits == 1
        assert instance.checkpoints.load(0).inputs == {"views": 11}


def test_a_shutdown_the_task_asks_for_stops_the_feed_right_after_its_record():
    with TaskTestDriver(Asker, stores=STORES) as driver:
        instance = driver.instances[0]
        driver.send_rows(_rows(["a"] * 5 + ["stop"] + ["b"] * 20), partition=0)
        assert instance.position("views") == 6
        assert driver.store("counts").get("b") is None


def test_a_time_based_policy_reads_the_clock_once_per_check_every_records_not_per_record():
    with TaskTestDriver(Asker, stores=STORES) as driver:
        instance = driver.instances[0]
        instance.committer.policy = ConfiguredCommits(interval=5.0)  # the driver's own never comes due
        reads = []
        clock = instance.committer.clock
        instance.committer.clock = lambda: reads.append(1) or clock()
        records = 100 * CHECK_EVERY
        driver.send_rows(_rows(f"k{i % 5}" for i in range(records)), partition=0)
        assert instance.position("views") == records
        assert 100 <= len(reads) <= 100 + 2  # one per CHECK_EVERY records, and the feed's end
        driver.advance(6)  # the interval passed: the next feed's check commits
        commits = instance.committer.commits
        driver.send_rows(_rows(["x"]), partition=0)
        assert instance.committer.commits == commits + 1
