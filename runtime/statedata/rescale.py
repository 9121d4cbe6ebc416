"""``localstate rescale JOB --partitions N``: every key of a stopped job's committed state
re-partitioned by the job's partitioner into a new state epoch, switched to atomically, in one
command.

The checks come first, each a typed error that changes nothing: the job must not be running (its
``live.json`` heartbeat, and every partition's instance lock, held for the whole rescale, so no run
can start meanwhile); every input must be drained (no record after the checkpointed positions:
:class:`InputLagError` naming the input, partition and lag), because the new partitions hold their
keys' state and would never see records left in the old ones. Then the job is started with
``partitions`` partitions (:func:`~.loader.load_savepoint`: a new epoch, switched to atomically;
every store checked on the data to be keyed by the routing key) from its current epoch's committed
state read in place (:class:`~.durable.DurableState`: the changelogs read once, at the checkpoints,
nothing written but the new epoch), or, given ``savepoint_to``, from a savepoint taken there first
and kept (checked whole before it is read). The old epoch stays, retired, until ``localstate reset
--old-epochs``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from localstate.core.config import JobConfig
from localstate.errors import FencedError, InputLagError, RescaleError
from localstate.runtime.driver.operating import LIVE, UNKNOWN, judge_live
from localstate.runtime.driver.progress import read_live
from localstate.runtime.driver.views import input_partitions, load_checkpoints
from localstate.runtime.layout import EpochPointer, checkpoint_store
from localstate.runtime.statedata.durable import DurableState
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.saved import SavedState
from localstate.runtime.statedata.writer import take_savepoint

__all__ = ["rescale", "check_stopped", "check_drained"]


def check_stopped(job: JobConfig) -> None:
    """FencedError if a run of the job is live (its heartbeat is recent and its process alive), or
    ``live.json`` cannot tell (a damaged file is no proof that nothing runs)."""
    liveness, why = judge_live(read_live(job))
    if liveness == UNKNOWN:
        raise FencedError(f"job {job.name!r} may be running: {why}", job=job.name,
                          hint="make sure no run of the job is left, then delete progress/live.json and try again")
    if liveness == LIVE:
        raise FencedError(f"job {job.name!r} is running ({why})", job=job.name,
                          hint="stop it first (SIGTERM, or Ctrl-C), after `localstate run JOB --until-drained` has "
                               "drained its inputs")


def check_drained(job: JobConfig) -> None:
    """InputLagError for the first input partition holding records past its checkpointed position (or
    whose end cannot be read); every one is listed in the message."""
    lagging = [info for info in input_partitions(job, load_checkpoints(job)) if info.lag != 0]
    if not lagging:
        return
    first = lagging[0]
    listed = ", ".join(f"{i.input}[{i.partition}]: " + (f"{i.lag} record(s)" if i.lag is not None else
                                                        f"unknown ({i.problem})") for i in lagging[:10])
    raise InputLagError(f"job {job.name!r} has unprocessed input ({listed}): with another partition count those "
                        "records would reach partitions that do not hold their keys' state", input=first.input,
                        partition=first.partition, lag=first.lag,
                        hint="drain the job first: `localstate run JOB --until-drained`, then rescale (and point the "
                             "inputs at the new layout before the next run: docs/state-as-data.md)")


def rescale(job: JobConfig, partitions: int, *, savepoint_to: SavepointLocation | None = None,
            progress: Callable[[str], None] | None = None) -> EpochPointer:
    """Rescale ``job`` (bound to its current epoch) to ``partitions`` (see the module docstring);
    returns the new epoch pointer. A savepoint written to ``savepoint_to`` is kept."""
    if partitions == job.partitions:
        raise RescaleError(f"job {job.name!r} already has {partitions} partition(s)", partitions=partitions,
                           hint="give another count")
    check_stopped(job)
    store = checkpoint_store(job)
    locked: list[int] = []
    try:
        for partition in range(job.partitions):
            try:
                store.lock(partition)
            except FencedError as exc:
                raise FencedError(f"partition {partition} of job {job.name!r} is held by a running job: nothing was "
                                  "changed", partition=partition, path=str(store.root),
                                  hint="stop the job, then rescale again") from exc
            locked.append(partition)
        check_drained(job)
        return load_savepoint(_saved_state(job, savepoint_to, progress), replace(job, partitions=partitions),
                              LoadOptions(yes=True, source=f"rescale from {job.partitions} to {partitions} partitions",
                                          progress=progress))
    finally:
        for partition in locked:
            store.unlock(partition)


def _saved_state(job: JobConfig, savepoint_to: SavepointLocation | None,
                 progress: Callable[[str], None] | None) -> SavedState:
    """What the rescale starts from: the job's committed state read in place (the partition locks
    held by the caller keep it from changing), or a savepoint taken to ``savepoint_to`` and checked
    whole (the user keeps it)."""
    if savepoint_to is None:
        return DurableState.open(job)
    take_savepoint(job, savepoint_to, progress=progress)
    return Savepoint.open(savepoint_to)
