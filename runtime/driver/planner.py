"""Planning a run's batches from the committed checkpoints (:class:`BatchPlanner`): which partitions
have input to process (or a processing-time timer due), which offset ranges each reads, whether the
inputs still fit the checkpointed positions; and the driver's side of committing: saving a batch's
checkpoints and planning the next batch from them, cluster mode's first checkpoints and its check of
the accepted attempt.

No Spark here: a runner (:class:`~localstate.runtime.spark.driver.SparkJobRunner`) runs the plans
and hands the returned checkpoints back to :meth:`BatchPlanner.save`."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace
from typing import Any, Mapping

from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.stream import PENDING_TAIL_WARN_AFTER, IdentifiedInput, InputStream, PendingTail, \
    check_input_position
from localstate.errors import FencedError
from localstate.runtime.driver.plan import PartitionPlan
from localstate.runtime.layout import check_moved_inputs, check_no_history, checkpoint_where, open_changelog_system
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.partition.sink import StreamSink, commit_recorded

__all__ = ["BatchPlanner", "has_state"]

log = logging.getLogger(__name__)


def has_state(checkpoint: Checkpoint | None) -> bool:
    """True if the partition has committed state a task could find warm (a changelog offset > 0)."""
    return checkpoint is not None and any(offset > 0 for offset in checkpoint.changelogs.values())


class BatchPlanner:
    """Plans each batch of a job from its committed checkpoints and keeps what the last plan saw.

    It reads a checkpoint from disk only until it saved one itself (:meth:`save`): only the driver
    saves checkpoints between batches, so the one it saved is the one on disk. ``batch_size`` limits
    each plan's records; ``cluster`` (cluster mode) makes the plans carry their committed checkpoint
    and where the driver keeps it."""

    def __init__(self, job: JobConfig, checkpoints: CheckpointStore, inputs: Mapping[str, InputStream], *,
                 batch_size: int | None = None, cluster: bool = False) -> None:
        self.job = job
        self.checkpoints = checkpoints
        self.inputs = inputs
        self.batch_size = batch_size
        self.cluster = cluster
        self.homes: dict[int, str] = {}
        """partition -> the home its committed checkpoint names (:attr:`Checkpoint.home`), for every
        partition with state, as the last :meth:`plan` read them: placement balances what each
        executor owns, not only what one batch runs (:func:`~localstate.runtime.spark.cluster.assign_executors`)"""
        self.input_ids: dict[int, dict[str, str]] = {}
        """partition -> input -> its identity at the last plan (IdentifiedInput), recorded in the batch's
        checkpoints (:meth:`with_input_ids`)"""
        self.next_timer: float | None = None
        """the earliest processing-time timer not yet due, as the last plan with ``timers`` saw it (None: none)"""
        self.pending_bytes = 0
        """bytes of unterminated input tails (:class:`PendingTail`) found by the last :meth:`plan`"""
        self._saved: dict[int, Checkpoint] = {}
        """checkpoints this run saved (what :meth:`plan` uses instead of reading them back)"""
        self._planned: dict[int, Checkpoint | None] = {}
        """partition -> the committed checkpoint its last plan started from"""
        self._tails_warned: dict[tuple[str, int], int] = {}
        """(input, partition) -> the offset of the unterminated tail last warned about"""

    def start_run(self) -> None:
        """Forget what the previous run saved and warned about: a run plans its first batch from disk
        (a restarted driver does too). Commit the output transactions the saved checkpoints name."""
        self._saved.clear()
        self._tails_warned.clear()
        for partition in range(self.job.partitions):
            # A driver (or partition) that died between a checkpoint's save and the commit of the output
            # transactions it names: commit them now, also for partitions that get no batch again.
            checkpoint = self.checkpoints.load(partition)
            if checkpoint is not None and checkpoint.transactions:
                commit_recorded(self.job, partition, checkpoint.transactions)

    def committed(self, partition: int) -> Checkpoint | None:
        """The partition's committed checkpoint: the one this run saved, else the one on disk (a
        run's first batch, a restarted driver). Only the driver saves checkpoints between batches, so
        the one it saved is the one on disk (a task that reopens the partition takes a new generation,
        which its result carries back)."""
        saved = self._saved.get(partition)
        return saved if saved is not None else self.checkpoints.load(partition)

    def planned_from(self, partition: int) -> Checkpoint | None:
        """The committed checkpoint the partition's last plan started from (None: it had none)."""
        return self._planned.get(partition)

    def plan(self, batch: int, timers: bool = False, **common: Any) -> tuple[list[PartitionPlan], int]:
        """Plans for the partitions with input to process, and the total lag before the batch. With
        ``timers`` (a standing run), also for the partitions whose next processing-time timer is due
        (:attr:`Checkpoint.next_timer`), input or not: their batch fires it. ``common``: the
        :class:`PartitionPlan` fields every plan of the batch carries as given (the run's id, its
        fault, ``keep_open``, ...).

        A checkpointed input position that does not fit the input any more (past its end: the input
        was replaced, truncated or re-created; below its first retained record) raises
        InputPositionError before anything runs, never a plan that silently reads nothing. Bytes of
        unterminated input tails are counted into :attr:`pending_bytes` (and logged once they stay
        unchanged for :data:`PENDING_TAIL_WARN_AFTER` seconds)."""
        plans, lag, pending = [], 0, 0
        now = time.time()
        self.next_timer = None
        self.homes = {}
        self.input_ids = {}
        for partition in range(self.job.partitions):
            loaded = self.committed(partition)
            if loaded is not None and loaded.home is not None and has_state(loaded):
                self.homes[partition] = loaded.home
            checkpoint = loaded or Checkpoint(partition)
            ranges = {}
            for name, source in self.inputs.items():
                start, end = checkpoint.inputs.get(name, 0), source.end_offset(partition)
                check_input_position(source, partition, checkpoint.inputs.get(name), end, checkpoint.input_ids.get(name))
                if isinstance(source, IdentifiedInput) and (identity := source.identity(partition)) is not None:
                    # what the input is now, recorded in the batch's checkpoints (with_input_ids)
                    self.input_ids.setdefault(partition, {})[name] = identity
                if isinstance(source, PendingTail):
                    pending += self._pending_tail(name, source, partition, end)
                lag += end - start
                if self.batch_size is not None:
                    # No input can give more than the limit; an exact range also lets a reader run
                    # to its end (the jsonl reader then remembers where the next batch starts).
                    end = min(end, start + int(self.batch_size))
                ranges[name] = (start, end)
            due = False
            if timers and checkpoint.next_timer is not None:
                due = checkpoint.next_timer <= now
                if not due and (self.next_timer is None or checkpoint.next_timer < self.next_timer):
                    self.next_timer = checkpoint.next_timer
            if due or any(end > start for start, end in ranges.values()):
                self._planned[partition] = loaded
                plans.append(PartitionPlan(
                    batch, partition, ranges, self.batch_size, cluster=self.cluster,
                    committed=asdict(loaded) if self.cluster and loaded is not None else None,
                    checkpoint_where=str(self.checkpoints.path(partition)) if self.cluster else "", **common))
        self.pending_bytes = pending
        return plans, lag

    def check_inputs(self) -> None:
        """Check every partition's checkpointed input positions against the inputs as they are now
        (InputPositionError, see :func:`check_input_position`), without planning anything: what a run
        does before it starts Spark. An input still read where it was before a rescale is refused
        (:func:`check_moved_inputs`)."""
        check_moved_inputs(self.job, self.inputs)
        for partition in range(self.job.partitions):
            checkpoint = self.committed(partition)
            if checkpoint is None:
                continue
            for name, source in self.inputs.items():
                if name in checkpoint.inputs:
                    check_input_position(source, partition, checkpoint.inputs[name], source.end_offset(partition),
                                         checkpoint.input_ids.get(name))

    def _pending_tail(self, name: str, source: PendingTail, partition: int, end: int) -> int:
        """Unterminated bytes at the end of ``source``'s ``partition`` (an append in progress: not
        read, never an error). Logs a WARNING once per run and tail when they have not changed for
        :data:`PENDING_TAIL_WARN_AFTER` seconds (a writer that stopped mid-record)."""
        pending = source.pending_bytes(partition)
        if not pending:
            return 0
        since = source.pending_since(partition)
        age = time.time() - since if since is not None else 0.0
        if age > PENDING_TAIL_WARN_AFTER and self._tails_warned.get((name, partition)) != end:
            self._tails_warned[(name, partition)] = end
            log.warning("input %r partition %d: %d byte(s) of an unterminated record at offset %d, unchanged for %.0fs "
                        "(warned after %.0fs): they are not read until their writer completes the record (a jsonl "
                        "line needs its newline); if the writer stopped, complete or remove them",
                        name, partition, pending, end, age, PENDING_TAIL_WARN_AFTER)
        return pending

    def with_input_ids(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        """The batch's returned checkpoints with the input identities its plan saw: the positions
        were planned against the inputs as they are now."""
        if not self.input_ids:
            return checkpoints
        return [replace(c, input_ids={**c.input_ids, **self.input_ids.get(c.partition, {})}) for c in checkpoints]

    def save(self, checkpoint: Checkpoint) -> None:
        """Save a partition's checkpoint, atomically and fenced by the generation its task instance
        took at open (FencedError: a zombie attempt of a later run took a newer one), and plan the
        partition's next batch from it. Then commit the output transactions it names (the
        task left them open for this save): outputs become visible once the checkpoint is durable."""
        self.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
        self._saved[checkpoint.partition] = checkpoint
        if checkpoint.transactions:
            crash_point("driver_saved")  # the checkpoint saved, its output transactions still open
            commit_recorded(self.job, checkpoint.partition, checkpoint.transactions)

    def check_attempt(self, checkpoint: Checkpoint) -> None:
        """Cluster mode: the accepted attempt must have started from the checkpoint the driver planned
        (the generation after it); anything else is not this batch's attempt and is refused."""
        planned = self._planned.get(checkpoint.partition)
        expected = (planned.generation if planned is not None else 0) + 1
        if checkpoint.generation != expected:
            raise FencedError(f"task partition {checkpoint.partition} returned generation {checkpoint.generation}, "
                              f"but the batch was planned from generation {expected - 1}",
                              partition=checkpoint.partition, path=str(self.checkpoints.path(checkpoint.partition)),
                              hint="another driver may be running this job: stop it; the checkpoint is unchanged")

    def initial_checkpoints(self) -> None:
        """Cluster mode: give every partition without a checkpoint its first one, here on the driver
        (locally, the task instance writes it at open). It names every output at its current end
        (refusing outputs that hold data no checkpoint covers), so a first attempt that fails after
        writing outputs is truncated by its retry; and a changelog with records but no checkpoint
        means the checkpoint is missing (CheckpointError), as on open."""
        missing = [p for p in range(self.job.partitions) if self.checkpoints.load(p) is None]
        if not missing:
            return
        sink = StreamSink(self.job)
        changelogs = open_changelog_system(self.job)
        try:
            for partition in missing:
                for name, store in self.job.stores.items():
                    if store.changelog is None:
                        continue
                    held = changelogs.partition(store.changelog, partition)
                    try:
                        check_no_history(held, store=name, partition=partition,
                                         checkpoint_where=checkpoint_where(self.checkpoints, partition))
                    finally:
                        held.close()
                outputs = sink.rollback(partition, {})
                self.checkpoints.save(Checkpoint(partition, outputs=dict(outputs)), expect_generation=0)
        finally:
            changelogs.close()
            sink.close()
