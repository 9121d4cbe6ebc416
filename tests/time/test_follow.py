"""The continuous mode's partition loop (:class:`FollowingPartition`) on a real instance, without
Spark: records appended between rounds are processed and committed once the partition has caught
up; an idle partition commits nothing; a backlog is read in bounded rounds; a processing-time timer
fires once, after it is due, with no later record, across a crash; and a crash anywhere between two
rounds loses nothing and applies nothing twice (a plain-Python count is the model)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from itertools import islice
from pathlib import Path

from hypothesis import given, settings, strategies as st

from counting_job import SPARK_TESTS, final_counts, write_counting_job
from localstate.core.config import load_job_config
from localstate.core.stream import open_input, open_output
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.follow import FollowingPartition
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink
from localstate.streams import jsonl
from localstate.streams.jsonl import write_jsonl

sys.path.insert(0, str(SPARK_TESTS))  # count_task / timer_task, as the job's pythonpath says


class Partition:
    """Partition 0 of a one-partition job, opened as a continuous run opens it."""

    def __init__(self, job_file: Path) -> None:
        self.job = load_job_config(job_file)
        self.changelogs = open_changelog_system(self.job)
        self.sink = StreamSink(self.job)
        self.instance = TaskInstance(self.job, 0, self.changelogs, self.sink)
        self.instance.open()
        self.follower = FollowingPartition(self.instance, {n: open_input(self.job, n) for n in self.job.inputs})

    def crash(self) -> None:
        """What a SIGKILL leaves: nothing after the last commit counts."""
        self.instance.abandon()
        self.sink.close()
        self.changelogs.close()

    def close(self) -> None:
        self.follower.finish()
        self.instance.close(commit=False)
        self.sink.close()
        self.changelogs.close()


def _job(tmp_path: Path, **job: object) -> Path:
    (tmp_path / "data").mkdir(parents=True, exist_ok=True)
    (tmp_path / "data" / "0.jsonl").touch()
    return write_counting_job(tmp_path, "follow", partitions=1, job=job)


def _append(tmp_path: Path, keys: list[str]) -> None:
    write_jsonl(tmp_path / "data", 0, [{"key": k, "value": 1, "ts": 1_700_000_000.0} for k in keys])


def _emitted(job_file: Path) -> dict[str, list[int]]:
    job = load_job_config(job_file)
    output = open_output(job, "counts-out")
    try:
        out: dict[str, list[int]] = {}
        for key, count in output.read(0):
            out.setdefault(key, []).append(count)
        return out
    finally:
        output.close()


def test_appended_records_are_committed_once_caught_up_and_an_idle_partition_commits_nothing(tmp_path):
    job_file = _job(tmp_path, commit_interval="1h")  # no interval commit: only the caught-up one
    part = Partition(job_file)
    try:
        _append(tmp_path, ["a", "b", "a"])
        assert part.follower.step() == 3
        assert part.follower.caught_up
        # Committed: the checkpoint holds the positions, and the outputs are there for a reader.
        assert part.instance.checkpoints.load(0).inputs == {"events": 3}
        assert _emitted(job_file) == {"a": [1, 2], "b": [1]}
        commits = part.follower.commits
        for _ in range(5):  # idle rounds: nothing to commit, no checkpoint written
            assert part.follower.step() == 0
        assert part.follower.commits == commits
        _append(tmp_path, ["b"])
        assert part.follower.step() == 1
        assert part.follower.commits == commits + 1
        assert _emitted(job_file) == {"a": [1, 2], "b": [1, 2]}
    finally:
        part.close()


def test_a_backlog_is_read_in_bounded_rounds(tmp_path):
    job_file = _job(tmp_path, commit_interval="1h")
    keys = [f"k{i % 13}" for i in range(1000)]
    _append(tmp_path, keys)
    part = Partition(job_file)
    part.follower.round_records = 300
    try:
        rounds = []
        while not rounds or not part.follower.caught_up:
            rounds.append(part.follower.step())
        assert rounds == [300, 300, 300, 100]
        assert part.follower.commits == 1  # committed once caught up (the interval never came)
    finally:
        part.close()
    assert final_counts(load_job_config(job_file)) == Counter(keys)


def test_a_backlog_round_resumes_the_file_where_the_last_round_stopped(tmp_path):
    # A round that stopped in the middle of its read would leave no remembered byte position: every
    # later round would read the file again from its first line (a backlog read in quadratic time).
    job_file = _job(tmp_path, commit_interval="1h")
    keys = [f"k{i % 13}" for i in range(1000)]
    _append(tmp_path, keys)
    inode = os.stat(tmp_path / "data" / "0.jsonl").st_ino
    part = Partition(job_file)
    part.follower.round_records = 300
    try:
        resumed = []
        while not part.follower.caught_up:
            part.follower.step()
            position = part.instance.position("events")
            resumed.append(any(key[1:] == (inode, position) for key in jsonl._POSITIONS))
        assert part.instance.position("events") == 1000
        assert resumed == [True] * 4
    finally:
        part.close()
    assert final_counts(load_job_config(job_file)) == Counter(keys)


def test_a_batch_task_behind_gets_each_round_as_the_columns_of_one_read(tmp_path):
    # Bounding a round by each input's end (not by a cut in the middle of the read) keeps a batch
    # task's columnar read: one batch per round's chunk, not batches of records built row by row.
    job_file = _job(tmp_path, commit_interval="1h", task="count_task:CountByKeyBatch")
    keys = [f"k{i % 13}" for i in range(10_000)]
    _append(tmp_path, keys)
    part = Partition(job_file)
    part.follower.round_records = 5000
    task = part.instance.task
    sizes: list[int] = []
    process_batch = task.process_batch
    task.process_batch = lambda batch, collector, coordinator: (sizes.append(batch.num_rows),
                                                               process_batch(batch, collector, coordinator))
    try:
        while not part.follower.caught_up:
            part.follower.step()
        assert sizes == [5000, 5000]
    finally:
        part.close()
    assert final_counts(load_job_config(job_file)) == Counter(keys)


def test_a_processing_time_timer_fires_once_after_it_is_due_with_no_later_record_across_a_crash(tmp_path):
    job_file = write_counting_job(tmp_path, "follow-timer", partitions=1,
                                  job={"task": "timer_task:ReportLater", "commit_interval": "1h"},
                                  outputs={"windows": {"system": "file", "path": "windows"}}, time={"timers": True})
    (tmp_path / "data").mkdir()
    _append(tmp_path, ["x"])
    part = Partition(job_file)
    seen = time.time()
    part.follower.step()  # x seen: its timer is due 2 s (processing time) from now, committed
    part.crash()  # crashed after the commit: the timer is in the committed state

    part = Partition(job_file)
    try:
        assert part.follower.next_wakeup() is not None
        while part.follower.next_wakeup() is not None:  # no record arrives: the clock alone fires it
            time.sleep(min(0.05, part.follower.next_wakeup() or 0.0))
            part.follower.step()
        fired_at = time.time()
        for _ in range(3):
            part.follower.step()
    finally:
        part.close()
    job = load_job_config(job_file)
    output = open_output(job, "windows")
    try:
        assert list(output.read(0)) == [("x", "idle")]  # once
    finally:
        output.close()
    assert fired_at >= seen + 2.0  # never before it was due (the processing clock is wall time)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["step", "crash"])), min_size=1, max_size=6))
def test_a_crash_in_the_middle_of_a_round_loses_nothing_and_applies_nothing_twice(tmp_path_factory, script):
    tmp_path = tmp_path_factory.mktemp("follow-model")
    job_file = _job(tmp_path, commit_interval="1h", commit_every=7)
    model: Counter[str] = Counter()
    part = Partition(job_file)
    try:
        for n, action in script:
            keys = [f"k{(n + i) % 5}" for i in range(n)]
            _append(tmp_path, keys)
            model.update(keys)
            if action == "crash":
                # Half a backlog read: the feed commits every 7 records, the rest of the round is not
                # committed (not caught up) when the process dies.
                part.follower.round_records = max(1, n // 2)
                part.follower.step()
                part.crash()
                part = Partition(job_file)
            else:
                part.follower.step()
        while part.follower.step() or not part.follower.caught_up:
            pass
    finally:
        part.close()
    assert _emitted(job_file) == {key: list(range(1, n + 1)) for key, n in model.items()}


def test_a_read_stopped_early_remembers_where_to_resume(tmp_path):
    # A round over several inputs stops its merged read at a record limit, and the merge has read one
    # record of each input ahead. Either way the next read must find a remembered byte position at
    # its start: else it reads the file again from its first line (quadratic in a backlog).
    job_file = _job(tmp_path)
    _append(tmp_path, [f"k{i}" for i in range(500)])
    source = open_input(load_job_config(job_file), "events")
    path = tmp_path / "data" / "0.jsonl"
    inode = os.stat(path).st_ino
    for start, taken in ((0, 1), (0, 137), (137, 200), (337, 163)):
        jsonl._POSITIONS.clear()
        reader = source.read(0, start, 500)
        records = list(islice(reader, taken))
        reader.close()
        assert [(r.offset, r.key) for r in records] == [(i, f"k{i}") for i in range(start, start + taken)]
        resume = start + taken
        for next_start in (resume, resume - 1):  # all fed; the last one read ahead, not fed
            assert (str(path), inode, next_start) in jsonl._POSITIONS
            if next_start < 500:
                again = next(iter(source.read(0, next_start, 500)))  # from the remembered byte position
                assert (again.offset, again.key) == (next_start, f"k{next_start}")
