"""``localstate rescale JOB --partitions N``: a savepoint, every key re-partitioned by the job's
partitioner, a start from it, in one command.

The checks come first, each a typed error that changes nothing: the job must not be running (its
``live.json`` heartbeat, and every partition's instance lock, held for the whole rescale, so no run
can start meanwhile); every input must be drained (no record after the checkpointed positions:
:class:`InputLagError` naming the input, partition and lag), because the new partitions hold their
keys' state and would never see records left in the old ones. Then a savepoint of the current epoch
is taken to a scratch folder in the job's directory (its raw columns only, uncompressed: nothing else
reads it; each file checked against its size and sha256 as it is read back) or to ``savepoint_to`` (a
whole one, every column, checked whole before it is read), and the job is started
from it with ``partitions`` partitions (:func:`~.loader.load_savepoint`: a new epoch, switched to
atomically; every store checked on the data to be keyed by the routing key). The old epoch stays,
retired, until ``localstate reset --old-epochs``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from typing import Callable

from localstate.core.config import JobConfig
from localstate.errors import FencedError, InputLagError, RescaleError
from localstate.runtime.driver.operating import LIVE, UNKNOWN, judge_live
from localstate.runtime.driver.progress import read_live
from localstate.runtime.driver.views import input_partitions, load_checkpoints
from localstate.runtime.layout import EpochPointer, checkpoint_store, job_directory
from localstate.core.names import safe_join
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
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
    returns the new epoch pointer. The scratch savepoint is deleted once the new epoch is current; one
    written to ``savepoint_to`` is kept."""
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
        scratch = None
        location = savepoint_to
        if location is None:
            job_directory(job)
            # unique per attempt: a refused rescale retried within the same second needs a new one
            name = f"rescale-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 1_000_000_000:09d}"
            scratch = safe_join(job.state_dir, job.name, "savepoints", name)
            location = SavepointLocation({"url": str(scratch)})
        try:
            take_savepoint(job, location, progress=progress, scratch=scratch is not None)
            # a scratch savepoint is checked file by file as the start reads it (before the switch),
            # not read once more beforehand; one kept elsewhere is checked whole first
            savepoint = Savepoint.open(location, verify=scratch is None, verify_reads=scratch is not None)
            return load_savepoint(savepoint, replace(job, partitions=partitions), LoadOptions(
                yes=True, source=f"rescale from {job.partitions} to {partitions} partitions", progress=progress))
        finally:
            if scratch is not None:  # the scratch savepoint is the rescale's own: kept neither way
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        for partition in locked:
            store.unlock(partition)
