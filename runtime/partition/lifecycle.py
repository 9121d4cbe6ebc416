"""The steps of one task partition's unit of work, from open to check-in: the lifecycle every
runtime runs, and the TaskTestDriver too.

:meth:`PartitionTask.run` is the template: open (or reuse) the partition's instance, skip if the
work was applied before, feed its records through the one feed loop (:mod:`.feeder`), fire the
timers due at its end, run ``window()`` when due, take the commit step, check the instance back in,
and report what happened with phase timings (:class:`PartitionBatch`). A runtime says only where
records come from (:meth:`PartitionTask.records`), how the instance is opened and given back
(:meth:`PartitionTask.open`, :meth:`PartitionTask.check_in`) and how it commits:

* a micro-batch (the native Spark path's :class:`~localstate.runtime.spark.executor.PlannedPartition`,
  the DataFrame step's :class:`~localstate.runtime.spark.dataframe.DataFramePartition`) commits nothing
  inside the batch and *prepares* one commit at its end; the prepared checkpoint goes back to its
  caller, which saves it. On any failure the instance is checked in with ``None`` (closed without
  committing), so a retry recovers it to the last saved checkpoint;
* :class:`InProcessPartition` (the TaskTestDriver, ``localstate validate --dry-run``) feeds records to
  a partition kept open in this process, committing between them as the instance's commit policy
  says (:mod:`.committer`), and keeps the instance open.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.partition.faults import CrashAt, armed
from localstate.runtime.partition.records import InputPolicy

if TYPE_CHECKING:
    from localstate.core.stream import InputRecord
    from localstate.runtime.partition.instance import TaskInstance

__all__ = ["PartitionTask", "PartitionBatch", "OpenPartition", "InProcessPartition", "TASK_PHASES", "fault_for"]

#: Phases of one partition's batch, in seconds: waiting for the partition's lock, opening (and
#: recovering) it, reading and decoding input, the task's ``process()`` and ``window()``, appending and
#: flushing changelogs, flushing stores, writing outputs, and checking the instance in.
TASK_PHASES = ("wait", "open", "read", "process", "changelog", "store_flush", "outputs", "close")


class _CountingSink(Protocol):
    written: int
    """messages written so far"""


class OpenPartition(Protocol):
    """An open task partition as a runtime hands it to :class:`PartitionTask` (the Spark runtime's
    :class:`~localstate.runtime.spark.affinity.kept.Lease`)."""

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
    checkpoint: Checkpoint | None
    """the prepared checkpoint: the caller saves it (or has the driver save it); None when the
    instance committed as it went (:class:`InProcessPartition`)"""
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
    """One unit of work of job partition ``partition``: subclasses give the records and the
    instance's open/check-in; :meth:`run` is the lifecycle."""

    autocommit = False
    """commit between records as the instance's commit policy says (in-process); False: a
    micro-batch, which commits nothing before :meth:`commit_step`"""

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
        :class:`~localstate.runtime.partition.records.ArrowRows`, rows held as Arrow already, which a BatchTask
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

    def commit_step(self, instance: "TaskInstance") -> Checkpoint | None:
        """The commit at the end of the work: a micro-batch prepares one (stores flushed, outputs
        written) and returns the checkpoint for its caller to save."""
        return instance.prepare_commit()

    @abstractmethod
    def check_in(self, lease: OpenPartition, prepared: Checkpoint | None) -> None:
        """Done with the instance: keep it (``prepared`` set and :attr:`keep_open`) or close it
        without committing."""

    # -- the lifecycle ---------------------------------------------------------------------------
    def run(self) -> PartitionBatch | None:
        """Run the batch; None if the instance had applied it before. Raises what the task or the
        stores raised, after checking the instance in without a prepared commit."""
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
                fed = instance.feed(records, self.policies(), autocommit=self.autocommit)
                # The batch boundary: timers the batch made due (or the clock did) fire before window().
                instance.fire_timers()
            if self.job.window_interval is not None:
                instance.maybe_window()
            processed = clock()
            changelog_in_process = spent["changelog"] - changelog_start  # spills of large batches
            self.end(lease)
            written = lease.sink.written
            prepared = self.commit_step(instance)
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


@dataclass
class _InProcessLease:
    """An instance kept open by this process, as a :class:`PartitionTask` takes it."""

    instance: "TaskInstance"
    sink: Any = field(default_factory=lambda: _Unmeasured())
    clock: dict[str, float] = field(default_factory=lambda: {"changelog": 0.0, "outputs": 0.0})
    recoveries: list[StoreRecovery] = field(default_factory=list)
    reused: bool = True
    waited: float = 0.0


class _Unmeasured:
    """The sink count of an in-process lease: outputs go to the instance's own sink, uncounted."""

    written = 0


class InProcessPartition(PartitionTask):
    """``records`` fed to ``instance``, a partition this process keeps open (the TaskTestDriver,
    ``localstate validate --dry-run``): commits happen between records as the instance's commit
    policy says, none is forced at the end, and the instance stays open. No records: a tick (the
    store time refreshed, due timers fired, ``window()`` if due)."""

    autocommit = True

    def __init__(self, instance: "TaskInstance", records: Iterable[tuple[str, "InputRecord"]] = (),
                 policies: Mapping[str, InputPolicy] | None = None) -> None:
        super().__init__(instance.job, instance.partition)
        self.instance = instance
        self._records = records
        self._policies = policies

    def open(self) -> OpenPartition:
        return _InProcessLease(self.instance)

    def records(self, lease: OpenPartition) -> Iterable[tuple[str, "InputRecord"]]:
        return self._records

    def policies(self) -> Mapping[str, InputPolicy] | None:
        return self._policies

    def commit_step(self, instance: "TaskInstance") -> Checkpoint | None:
        return None

    def check_in(self, lease: OpenPartition, prepared: Checkpoint | None) -> None:
        pass  # kept open by its owner
