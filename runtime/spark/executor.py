"""Executor side of a batch: one Spark task runs one partition's plan (:func:`run_partition`), or,
with instances kept open, claims a partition first (:func:`run_slot`).

A batch is a :class:`~localstate.runtime.partition.lifecycle.PartitionTask` (:class:`PlannedPartition`):
its records are the plan's input ranges merged in event-time order (:func:`plan_records`), on the
partition's instance checked out of this worker (:mod:`.instances`); the prepared checkpoint, counts
and timings go back to the driver, which saves the checkpoint."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.runtime.partition.faults import CrashAt
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.lifecycle import PartitionTask, fault_for
from localstate.runtime.spark.failures import executor_failure, record_failed_attempt
from localstate.runtime.spark.cluster import is_warm, local_home
from localstate.runtime.spark.affinity.kept import (Lease, checkin, checkout, claim, kept_partition,
                                               open_planned, task_context)
from localstate.runtime.driver.plan import PartitionPlan
from localstate.core.stream import open_input
from localstate.core.stream import InputRecord, InputStream, seek_hint
from localstate.core.task import add_task_paths
from localstate.runtime.partition.reading import read_inputs
from localstate.errors import InputPositionError

__all__ = ["run_partition", "run_slot", "plan_records", "plan_fault", "task_attempt", "PlannedPartition"]


def plan_records(instance: TaskInstance, plan: PartitionPlan,
                 inputs: Mapping[str, InputStream]) -> Iterator[tuple[str, InputRecord]]:
    """The plan's input records from the instance's positions, as ``(input, record)`` in processing
    order (:func:`~localstate.runtime.partition.reading.read_inputs`), at most ``plan.limit`` records.
    An instance past a planned end is refused first (:func:`_check_position`)."""
    for name in sorted(plan.ranges):
        _check_position(instance, plan, name, inputs[name])
    planned = sum(max(0, end - instance.position(name)) for name, (_, end) in plan.ranges.items())
    limit = plan.limit if plan.limit is not None and planned > plan.limit else None
    ends = {name: end for name, (_, end) in plan.ranges.items()}
    return read_inputs(instance, plan.partition, ends, inputs, limit)


def _check_position(instance: TaskInstance, plan: PartitionPlan, name: str, source: InputStream) -> None:
    """The instance must start input ``name`` inside the planned range: an instance ahead of the
    planned end (its checkpoint moved under the driver, or the input shrank) would read nothing and
    report the batch done. InputPositionError instead, as the planner raises."""
    position, end = instance.position(name), plan.ranges[name][1]
    if position > end:
        raise InputPositionError(
            f"input {name!r} partition {plan.partition}: the task instance is at position {position}, past the "
            f"planned end {end}: its checkpoint and the driver's plan disagree (the input shrank, or the "
            f"checkpoint was moved while the job ran)", input=name, partition=plan.partition, position=position,
            end=end, hint=seek_hint(getattr(source.job, "source", None) or "", name, plan.partition))


def plan_fault(plan: PartitionPlan) -> CrashAt | None:
    """The crash point the plan's test/demo ``fault`` arms for this task, if it targets this
    partition and batch."""
    return fault_for(plan.fault, plan.partition, plan.batch)


class PlannedPartition(PartitionTask):
    """A native-path batch: the plan's input ranges, read from the job's inputs, on the instance this
    worker keeps (or, on a cluster, one opened against the checkpoint the plan carries)."""

    def __init__(self, job: JobConfig, plan: PartitionPlan) -> None:
        super().__init__(job, plan.partition, fault=plan_fault(plan), keep_open=plan.keep_open)
        self.plan = plan
        self.inputs: dict[str, InputStream] = {}

    def open(self) -> Lease:
        plan = self.plan
        if plan.cluster:
            return open_planned(self.job, plan)
        return checkout(self.job, plan.partition, plan.run_id, tune=plan.tune_worker)

    def begin(self, lease: Lease) -> None:
        if self.plan.roll_changelogs:
            _roll_changelogs(lease.instance)
        self.inputs = {name: open_input(self.job, name) for name in sorted(self.plan.ranges)}

    def records(self, lease: Lease) -> Iterator[tuple[str, InputRecord]]:
        return plan_records(lease.instance, self.plan, self.inputs)

    def policies(self) -> Mapping[str, InputStream]:
        return self.inputs

    def check_in(self, lease: Lease, prepared: Checkpoint | None) -> None:
        checkin(lease, prepared, keep=self.keep_open)


def run_partition(job: JobConfig, plan: PartitionPlan) -> dict[str, Any]:
    """Executor side of one batch for one partition. Returns the checkpoint (as a dict), counts and
    :data:`TASK_PHASES` timings, or ``{"error": pickled LocalStateError}`` for deterministic failures
    that a retry cannot fix (see :func:`~localstate.runtime.spark.failures.executor_failure`): the
    driver raises that error, with its Python traceback, instead of Py4J's Java one. Failures a
    retry may fix are raised, for Spark to retry the task."""
    try:
        return _run_partition(job, plan)
    except (Exception, SystemExit) as exc:
        try:
            error = executor_failure(exc, plan.batch, plan.partition)
        except BaseException:  # re-raised for Spark to retry: say why first (local masters)
            record_failed_attempt(plan.attempts, plan.batch, plan.partition, task_attempt(), exc)
            raise
        return {"partition": plan.partition, "error": error}


def task_attempt() -> int:
    """The attempt number of the Spark task running this code (0 for the first attempt, and outside
    Spark). Spark numbers a task's attempts 0, 1, ...: the one that succeeds says how many failed
    before it, so the driver counts retried attempts from the results, without asking Spark."""
    context = task_context()
    return context.attemptNumber() if context is not None else 0


def _run_partition(job: JobConfig, plan: PartitionPlan) -> dict[str, Any]:
    add_task_paths(job)  # the task's module may live next to the job file
    done = PlannedPartition(job, plan).run()
    assert done is not None  # a planned batch is never applied before: the plan starts at the checkpoint
    return {
        "partition": done.partition, "checkpoint": asdict(done.checkpoint), "in": done.records,
        "out": done.outputs, "skipped": done.skipped, "dead": done.dead_lettered,
        "restore_seconds": sum(r.seconds for r in done.recoveries),
        "replayed": sum(r.replayed for r in done.recoveries), "trimmed": sum(r.trimmed for r in done.recoveries),
        "reused": done.reused, "pid": done.pid, "timings": done.timings,
        "warm": done.reused or is_warm(done.recoveries), "attempt": task_attempt(), "counts": done.counts,
        "home": local_home(job) if plan.cluster else None,  # where its local state now is (cluster)
        # When it ended (a host-wide clock): of two partitions one worker ran in a batch, it keeps
        # the later one open.
        "finished": time.monotonic(),
    }


def _roll_changelogs(instance: TaskInstance) -> None:
    """Seal each store's active changelog segment (changelog systems with a ``roll()`` capability).
    The instance is at its committed checkpoint here, so everything sealed is at most that."""
    for store in instance.stores.values():
        roll = getattr(store.changelog, "roll", None) if store.changelog is not None else None
        if callable(roll):
            roll()


def run_slot(job: JobConfig, plans: Mapping[int, PartitionPlan], claims: Path, slot: int,
             keepers: Mapping[int, int] | None = None) -> dict[str, Any]:
    """Executor side of Spark task ``slot`` of a batch whose instances are kept open: claim one of
    the batch's partitions, preferring the one this worker keeps open and leaving those another live
    worker keeps (``keepers``: partition -> worker pid) to it, and run it. A spare slot that finds
    every partition claimed returns ``{"partition": None, ...}`` at once."""
    any_plan = next(iter(plans.values()))
    try:
        partition = claim(claims, sorted(plans), slot, kept_partition(job, any_plan.run_id), keepers)
    except BaseException as exc:  # a claims directory that cannot be written: Spark retries the slot
        record_failed_attempt(any_plan.attempts, any_plan.batch, None, task_attempt(), exc)
        raise
    if partition is None:
        return {"partition": None, "pid": os.getpid(), "attempt": task_attempt()}
    return run_partition(job, plans[partition])
