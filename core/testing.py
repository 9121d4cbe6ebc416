"""``TaskTestDriver``: unit-test a StreamTask without Spark, on the real engines and changelogs.

    driver = TaskTestDriver(PageViewCounter, stores={"counts": {"engine": "kv", "key_serde": "string",
                                                                "value_serde": "int"}})
    driver.send("page-views", "alice", {"page": "/"})
    driver.commit()
    driver.crash(); driver.restart()        # uncommitted work is rolled back and its inputs replayed
    assert driver.store("counts").get("alice") == 1

Inputs are kept as a replayable log per stream partition, like Kafka: after ``restart()`` every
record after the checkpointed position is delivered again.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from localstate.core.config import JobConfig, parse_job_config
from localstate.core.partitioner import partition_for
from localstate.core.recovery import StoreRecovery
from localstate.core.runtime import MemorySink, TaskInstance, open_changelog_system
from localstate.core.task import Envelope, StreamTask

__all__ = ["TaskTestDriver"]


class TaskTestDriver:
    """Drives every partition of a job in this process. Commits only when asked (or when the task's
    coordinator asks), unless ``commit_every`` is given."""

    def __init__(self, task: type[StreamTask] | Callable[[], StreamTask] | str, *,
                 stores: Mapping[str, Mapping[str, Any]] | None = None, partitions: int = 1,
                 state_dir: str | Path | None = None, changelog: str = "file",
                 changelog_options: Mapping[str, Any] | None = None, commit_every: int | None = None,
                 window_interval: float | None = None, allow_pickle: bool = False, job_name: str = "test-job",
                 job: JobConfig | None = None) -> None:
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="localstate-test-")
            state_dir = self._tmp.name
        if job is None:
            job_table: dict[str, Any] = {"name": job_name, "partitions": partitions, "task": "unused:Unused",
                                         "changelog": changelog, "allow_pickle": allow_pickle,
                                         # Commits happen when the test asks, never on a timer.
                                         "commit_interval": 10 ** 9, "state_dir": str(state_dir)}
            if commit_every is not None:
                job_table["commit_every"] = commit_every
            if window_interval is not None:
                job_table["window_interval"] = window_interval
            job = parse_job_config({"job": job_table, "stores": dict(stores or {}),
                                    "changelogs": {changelog: dict(changelog_options or {})}},
                                   base_dir=Path(state_dir))
        self.job = job
        self._task = task
        self.now = 0.0
        self.sink = MemorySink()
        self.inputs: dict[tuple[str, int], list[Envelope]] = {}
        self.changelogs = open_changelog_system(job)
        self.instances: dict[int, TaskInstance] = {}
        self.recoveries: list[StoreRecovery] = []
        self._start()

    # -- lifecycle -----------------------------------------------------------------------------
    def _start(self) -> None:
        for partition in range(self.job.partitions):
            instance = TaskInstance(self.job, partition, self.changelogs, self.sink, self._task, clock=lambda: self.now)
            self.recoveries += instance.open()
            self.instances[partition] = instance

    def crash(self) -> None:
        """Lose everything not committed: stores close without flushing, buffered changelog records
        are dropped, the task object is discarded."""
        for instance in self.instances.values():
            instance.abandon()
        self.instances.clear()
        self.changelogs.close()

    def restart(self) -> list[StoreRecovery]:
        """Start again from the last checkpoint and re-deliver every uncommitted input record."""
        if self.instances:
            self.crash()
        self.changelogs = open_changelog_system(self.job)
        self.recoveries = []
        self._start()
        for (stream, partition), log in sorted(self.inputs.items()):
            instance = self.instances[partition]
            instance.process_all(log[instance.position(stream):])
        return self.recoveries

    def close(self) -> None:
        """Commit and stop cleanly."""
        for instance in self.instances.values():
            instance.close(commit=True)
        self.instances.clear()
        self.changelogs.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "TaskTestDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.instances:
            self.close()
        elif self._tmp is not None:
            self._tmp.cleanup()

    # -- driving -------------------------------------------------------------------------------
    def send(self, stream: str, key: Any, value: Any, *, partition: int | None = None,
             timestamp: float | None = None) -> Envelope:
        """Append a record to input ``stream`` (partitioned by key, like Kafka) and process it."""
        if partition is None:
            partition = partition_for(key, self.job.partitions)
        log = self.inputs.setdefault((stream, partition), [])
        envelope = Envelope(stream, partition, len(log), key, value, time.time() if timestamp is None else timestamp)
        log.append(envelope)
        self.instances[partition].process(envelope)
        return envelope

    def commit(self, partition: int | None = None) -> None:
        for p, instance in self.instances.items():
            if partition is None or p == partition:
                instance.commit()

    def advance(self, seconds: float) -> None:
        """Move the driver's clock forward and run windows that became due."""
        self.now += seconds
        for instance in self.instances.values():
            instance.maybe_window()

    def window(self, partition: int | None = None) -> None:
        for p, instance in self.instances.items():
            if partition is None or p == partition:
                instance.window()

    # -- inspecting ----------------------------------------------------------------------------
    def store(self, name: str, partition: int = 0) -> Any:
        return self.instances[partition].stores[name].engine

    def outputs(self, stream: str, *, pending: bool = False) -> list[tuple[Any, Any]]:
        """Committed outputs of ``stream`` (plus not yet committed ones with ``pending=True``)."""
        messages = self.sink.messages(stream)
        if pending:
            for instance in self.instances.values():
                messages += [m for m in instance.collector.pending if m.stream == stream]
        return [(m.key, m.value) for m in messages]
