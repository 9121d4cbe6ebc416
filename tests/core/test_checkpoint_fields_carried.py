"""Every path that writes a checkpoint carries every field the last committed one had.

The checkpoint an instance saves when it opens (it takes a new generation to fence stale writers)
is a commit point like any other: a crash right after it leaves it as *the* committed checkpoint.
So it must carry everything the checkpoint it follows recorded: the input positions and their
identities, the outputs, the DataFrame batch, the watermark, the next processing-time timer (a
restarted standing driver plans a batch for a due timer from it), the state formats, the manifests.

The fields are enumerated from :class:`Checkpoint` itself: a field added later is checked here too,
and the test fails until the committed history below populates it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import parse_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import MemorySink

CHANGED_AT_OPEN = {"generation"}
"""what an open may change: it takes the next generation"""
PER_HOST = {"attempt"}
"""cluster mode: the attempt that prepared the checkpoint (a new attempt names itself)"""
RESOLVED_AT_OPEN = {"transactions"}
"""the output transactions a checkpoint left open: the open commits them before saving its own
checkpoint, which names none (tests/kafka/test_kafka_transaction_kills.py kills around it)"""
STARTED_AT_OPEN = {"commit_stats"}
"""the per-commit figures count per open (named by its generation): an open's checkpoint has none"""
SET_BY_DRIVER = {"home"}
"""cluster mode: where the committed attempt ran, set by the Spark driver on the checkpoint it commits
(an instance never writes it; an open's checkpoint stays in the executor's memory on a cluster)"""


class TimerTask(StreamTask):
    def init(self, context):
        self.counts = context.kv("counts")
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        self.timers.register_processing_time(envelope.key, self.timers.processing_time() + 60)
        collector.send("out", envelope.key, envelope.value)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("out", key, "fired")


def _job(state_dir: Path, changelog: str):
    changelogs = {"objectstore": {"url": str(state_dir / "shared")}} if changelog == "objectstore" else {}
    return parse_job_config({
        "job": {"name": "carried", "task": "unused:Unused", "commit_interval": 10 ** 9, "state_dir": str(state_dir),
                "changelog": changelog},
        "time": {"timers": True},
        "changelogs": changelogs,
        "stores": {"counts": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int",
                              "ttl": "1h"}},
    }, base_dir=state_dir)


def _committed_history(job: Any, attempt: str | None) -> Checkpoint:
    """Run and commit one batch that sets every field a checkpoint has; returns what was saved."""
    sink = MemorySink()
    changelogs = open_changelog_system(job)
    instance = TaskInstance(job, 0, changelogs, sink, TimerTask, clock=lambda: 5_000.0,
                            processing_clock=lambda: 5_000.0, attempt=attempt)
    instance.open()
    instance.input_ids["events"] = "topic-id-1"
    instance.batch = 7
    instance.feed([("events", InputRecord(i, f"k{i}", i, 4_000.0 + i)) for i in range(5)])
    instance.commit()
    for offset in (5, 6):  # the first commit's figures (commit_stats) reach a later checkpoint: the next one,
        # or pipelined (objectstore) the one after, once its save ended
        instance.feed([("events", InputRecord(offset, f"k{offset}", offset, 4_000.0 + offset))])
        instance.commit()
    instance.close(commit=False)
    changelogs.close()
    saved = checkpoint_store(job).load(0)
    assert saved is not None
    return saved


def _unset(checkpoint: Checkpoint) -> list[str]:
    defaults = Checkpoint(checkpoint.partition)
    return [f.name for f in dataclasses.fields(Checkpoint)
            if f.name not in CHANGED_AT_OPEN | SET_BY_DRIVER | RESOLVED_AT_OPEN | {"partition"} and getattr(checkpoint, f.name) == getattr(defaults, f.name)]


@pytest.mark.parametrize("changelog,attempt", [("file", None), ("objectstore", "a1")])
def test_an_open_followed_by_a_crash_leaves_a_checkpoint_with_every_field(tmp_path: Path, changelog: str,
                                                                          attempt: str | None) -> None:
    job = _job(tmp_path, changelog)
    before = _committed_history(job, attempt)
    unset = _unset(before)
    # every field is set by the history, but those its setting cannot have (no manifests without them)
    assert unset == ([] if changelog == "objectstore" else ["attempt", "manifests"]), unset
    assert before.next_timer == 5_060.0

    changelogs = open_changelog_system(job)
    reopened = TaskInstance(job, 0, changelogs, MemorySink(), TimerTask, clock=lambda: 5_001.0,
                            processing_clock=lambda: 5_001.0, attempt=attempt and "a2")
    reopened.open()
    reopened.abandon()  # the crash: nothing after the open's own checkpoint
    changelogs.close()
    after = checkpoint_store(job).load(0)
    assert after is not None and after.generation == before.generation + 1
    for f in dataclasses.fields(Checkpoint):
        if f.name in CHANGED_AT_OPEN | RESOLVED_AT_OPEN or (f.name in PER_HOST and attempt is not None):
            continue
        if f.name in STARTED_AT_OPEN:
            assert getattr(after, f.name) is None, f.name
            continue
        assert getattr(after, f.name) == getattr(before, f.name), f"the open dropped or changed {f.name!r}"


def test_a_restarted_standing_driver_sees_the_due_timer_after_an_open_and_a_crash(tmp_path: Path) -> None:
    """The example of the class: the due processing-time timer stays in the committed checkpoint
    through any number of opens that crash before their first commit."""
    job = _job(tmp_path, "file")
    _committed_history(job, None)
    for _ in range(3):
        changelogs = open_changelog_system(job)
        instance = TaskInstance(job, 0, changelogs, MemorySink(), TimerTask, clock=lambda: 5_002.0,
                                processing_clock=lambda: 5_002.0)
        instance.open()
        instance.abandon()
        changelogs.close()
        assert checkpoint_store(job).load(0).next_timer == 5_060.0
