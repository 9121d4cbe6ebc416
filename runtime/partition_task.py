"""One batch of one job partition, from open to check-in: the lifecycle every batch runtime runs.

:meth:`PartitionTask.run` is the template: open (or reuse) the partition's instance, skip if the
batch was applied before, feed the batch's records through the one feed loop
(:meth:`~localstate.runtime.instance.TaskInstance.feed`), fire the timers due at the batch's end, run
``window()`` when due, prepare the
commit, check the instance back in, and report what happened with phase timings
(:class:`PartitionBatch`). A runtime says only where records come from (:meth:`PartitionTask.records`)
and how the instance is opened and given back (:meth:`PartitionTask.open`,
:meth:`PartitionTask.check_in`); the prepared checkpoint goes back to its caller, which saves it.

Guarantee: nothing is committed here. The prepared checkpoint is returned, and the instance is
checked in with it only if preparing succeeded; on any failure it is checked in with ``None``
(closed without committing), so a retry recovers it to the last saved checkpoint.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.recovery import StoreRecovery
from localstate.core.task import add_task_paths
from localstate.runtime.faults import CrashAt, armed
from localstate.runtime.records import InputPolicy

if TYPE_CHECKING:
    from localstate.core.streams.base import InputRecord
    from localstate.runtime.instance import TaskInstance

__all__ = ["PartitionTask", "PartitionBatch", "OpenPartition", "TASK_PHASES", "fault_for"]

#: Phases of one partition's batch, in seconds: waiting for the partition's lock, opening (and
#: recovering) it, reading and decoding input, the task's ``process()`` and ``window()``, appending and
#: flushing changelogs, flushing stores, writing outputs, and checking the instance in.
TASK_PHASES = ("wait", "open", "read", "process", "changelog", "store_flush", "outputs", "close")


class _CountingSink(Protocol):
    written: int
    """messages written so far"""


class OpenPartition(Protocol):
    """An open task partition as a runtime hands it to :class:`PartitionTask` (the Spark runtime's
    :class:`~localstate.runtime.spark.instances.Lease`)."""

    instance: "TaskInstance"
    sink: _CountingSink
    clock: dict[str, float]
    """seconds spent so far: ``changelog`` (append + flush) and ``outputs``"""
    recoveries: list[StoreRecovery]
    reused: bool
    waited: float
    """seconds spent waiting for the partition's lock"""


@dataclass
class PartitionBatch:
    """What one :meth:`PartitionTask.run` did."""

    partition: int
    checkpoint: Checkpoint
    """the prepared checkpoint: the caller saves it (or has the driver save it)"""
    records: int = 0
    outputs: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    reused: bool = False
    """the instance was kept open since the partition's last batch (not reopened)"""
    recoveries: list[StoreRecovery] = field(default_factory=list)
    """what opening did (empty when reused)"""
    timings: dict[str, float] = field(default_factory=dict)
    """:data:`TASK_PHASES` in seconds"""
    pid: int = field(default_factory=os.getpid)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """what the batch dropped or redirected (:class:`~localstate.core.task.TaskCounters`)"""


class PartitionTask(ABC):
    """One batch of job partition ``partition``: subclasses give the records and the instance's
    open/check-in; :meth:`run` is the lifecycle."""

    def __init__(self, job: JobConfig, partition: int, *, fault: CrashAt | None = None,
                 keep_open: bool = False) -> None:
        self.job = job
        self.partition = partition
        self.fault = fault
        """the crash point a test or the demo arms for this batch (None in production)"""
        self.keep_open = keep_open
        """keep the instance open for the partition's next batch"""

    # -- what a runtime provides -----------------------------------------------------------------
    @abstractmethod
    def open(self) -> OpenPartition:
        """The partition's instance for this batch, opened and recovered, or reused."""

    @abstractmethod
    def records(self, lease: OpenPartition) -> Iterable[tuple[str, "InputRecord"]]:
        """The batch's ``(input, record)`` pairs in processing order, from the instance's positions (or
        :class:`~localstate.runtime.records.ArrowRows`, rows held as Arrow already, which a BatchTask
        gets as they are). A BatchTask gets the pairs built into Arrow batches by the feed loop: a
        commit never splits one, and a retry of the batch re-delivers all of them."""

    def policies(self) -> Mapping[str, InputPolicy] | None:
        """Each input's bad-record policy (None: every input fails on a bad record)."""
        return None

    def applied(self, lease: OpenPartition) -> bool:
        """True if the instance already holds this batch (a replayed batch): nothing is fed."""
        return False

    def begin(self, lease: OpenPartition) -> None:
        """Before the first record: a runtime's own preparation (sealing changelog segments, opening
        the batch's output file)."""

    def end(self, lease: OpenPartition) -> None:
        """After the last record and ``window()``, before the commit is prepared."""

    @abstractmethod
    def check_in(self, lease: OpenPartition, prepared: Checkpoint | None) -> None:
        """Done with the instance: keep it (``prepared`` set and :attr:`keep_open`) or close it
        without committing."""

    # -- the lifecycle ---------------------------------------------------------------------------
    def run(self) -> PartitionBatch | None:
        """Run the batch; None if the instance had applied it before. Raises what the task or the
        stores raised, after closing the instance without committing."""
        add_task_paths(self.job)
        clock = time.perf_counter
        started = clock()
        lease = self.open()
        instance, spent = lease.instance, lease.clock
        changelog_start, outputs_start = spent["changelog"], spent["outputs"]
        prepared = None
        try:
            if self.applied(lease):
                return None
            self.begin(lease)
            opened = clock()
            records = self.records(lease)
            converted = clock() - opened  # eager decoding; lazy reads are counted by the feed loop
            instance.refresh_store_time()  # the time since the last commit (an idle wait) counts
            with armed(self.fault):
                fed = instance.feed(records, self.policies())
                # The batch boundary: timers the batch made due (or the clock did) fire before window().
                instance.fire_timers()
            if self.job.window_interval is not None:
                instance.maybe_window()
            processed = clock()
            changelog_in_process = spent["changelog"] - changelog_start  # spills of large batches
            self.end(lease)
            written = lease.sink.written
            prepared = instance.prepare_commit()
            outputs = lease.sink.written - written
            committed = clock()
        finally:
            self.check_in(lease, prepared)
        changelog = spent["changelog"] - changelog_start
        written_seconds = spent["outputs"] - outputs_start
        reading = converted + fed.read_seconds
        timings = {
            "wait": lease.waited, "open": opened - started - lease.waited, "read": reading,
            "process": processed - opened - reading - changelog_in_process, "changelog": changelog,
            "store_flush": committed - processed - (changelog - changelog_in_process) - written_seconds,
            "outputs": written_seconds, "close": clock() - committed,
        }
        return PartitionBatch(self.partition, prepared, records=fed.records, outputs=outputs, skipped=fed.skipped,
                              dead_lettered=fed.dead_lettered, reused=lease.reused,
                              recoveries=list(lease.recoveries), timings=timings, counts=instance.prepared_counts)


def fault_for(fault: Mapping[str, Any] | None, partition: int, batch: int) -> CrashAt | None:
    """The crash point a plan's test/demo ``fault`` arms, if it targets this partition and batch."""
    if fault and fault.get("partition") == partition and fault.get("batch") == batch:
        return CrashAt.from_plan_fault(fault)
    return None
