"""Worker affinity, the driver's side: on a local master, each partition goes back to the Python
worker that keeps it open (``[spark] worker_affinity``, on by default; docs: Spark guide, "Worker
affinity").

Spark hands a task to the Python worker idle the longest and has no notion of which worker holds
which partition's open stores, so a batch's Spark tasks are interchangeable *slots*: each claims one
of the batch's partitions (:func:`~.instances.claim`), preferring the one its worker keeps open. The
driver remembers which worker kept which partition (:meth:`WorkerAffinity.record`) and runs a spare
slot per live worker beyond the planned partitions (:meth:`WorkerAffinity.slot_count`), so the keeper
gets a slot whatever order Spark hands the slots out in. At the end of a run every kept instance is
asked back (:meth:`WorkerAffinity.release`). The executor's side (kept instances, claims, give-back)
is :mod:`.instances`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from localstate.core.checkpoint import CheckpointStore
from localstate.core.config import JobConfig
from localstate.runtime.spark.affinity.kept import is_alive, release_partitions
from localstate.runtime.driver.plan import PartitionPlan

__all__ = ["WorkerAffinity"]


def _consumed(items: Iterator[Any]) -> Iterator[None]:
    """Yield once after exhausting ``items`` (a slot's empty partition): PySpark reuses a Python
    worker only if the task read its input to the end."""
    for _ in items:
        pass
    yield None


class WorkerAffinity:
    """One run's slots, keepers and claims on a local master."""

    def __init__(self, context: Any, claims: Path, run_slot: Callable[..., dict[str, Any]]) -> None:
        self.context = context
        self.run_slot = run_slot
        """the executor's entry point of a slot (``executor.run_slot``): claim a partition, run it"""
        self.claims = claims
        """where this run's slots claim their partitions (``<checkpoints>/claims/<run id>``)"""
        self.cores = max(1, int(context.defaultParallelism))
        """the context's parallelism: at most this many slots run at once"""
        self.workers: set[int] = set()
        """pids of the Python workers that ran this run's slots"""
        self.keepers: dict[int, int] = {}
        """partition -> pid of the worker that ran its last committed batch and keeps it open"""
        self._slot_rdds: dict[int, Any] = {}

    def run(self, batch: int, plans: list[PartitionPlan], shipped: Any) -> list[dict[str, Any]]:
        """The batch's Spark job: slots that claim a partition each; the plans travel once, in the
        closure, and the slots are empty partitions (consumed, or PySpark does not reuse the worker).
        A spare slot that claimed nothing returns ``{"partition": None}``."""
        claims = self.claims / str(batch)
        by_partition = {plan.partition: plan for plan in plans}
        keepers = {p: self.keepers[p] for p in by_partition if p in self.keepers}
        run_slot = self.run_slot
        try:
            results = self._slots(self.slot_count(len(plans))).mapPartitionsWithIndex(
                lambda slot, items: [run_slot(shipped.value, by_partition, claims, slot, keepers)
                                     for _ in _consumed(items)]).collect()
        finally:
            shutil.rmtree(claims, ignore_errors=True)
        self.workers.update(r["pid"] for r in results if "pid" in r)
        return results

    def slot_count(self, planned: int) -> int:
        """Slots for a batch of ``planned`` partitions: one per partition, or, if the run has more
        live Python workers than that (up to the context's parallelism), one per worker, so that the
        workers keeping the partitions open get a slot."""
        self.workers = {pid for pid in self.workers if is_alive(pid)}  # workers die and are replaced
        return max(planned, min(self.cores, len(self.workers)))

    def record(self, results: Iterable[Mapping[str, Any]]) -> None:
        """Which worker keeps which partition open after a committed batch: a worker keeps the last
        partition it ran (at most one instance per worker), so entries of workers that ran something
        in this batch are replaced by their latest partition. A stale entry would only make a slot
        wait :data:`~.instances.KEEPER_GRACE` for a worker that no longer comes."""
        latest: dict[int, tuple[float, int]] = {}
        for r in results:
            if "pid" in r and r["partition"] is not None:
                latest[r["pid"]] = max(latest.get(r["pid"], (float("-inf"), -1)), (r["finished"], r["partition"]))
        self.keepers = {p: pid for p, pid in self.keepers.items() if pid not in latest}
        self.keepers.update((partition, pid) for pid, (_, partition) in latest.items())

    def give_back(self, checkpoints: CheckpointStore, job: JobConfig) -> None:
        """A standing run that has been idle a while: every kept instance is asked back and closed
        cleanly (Spark stops Python workers idle for a minute, which would kill them in their stores);
        the next batch opens its partitions again (local files reused, caches cold)."""
        release_partitions(checkpoints, range(job.partitions))
        self.keepers.clear()

    def release(self, checkpoints: CheckpointStore, job: JobConfig) -> None:
        """End of the run: every kept instance of the job is given back (no instance outlives the run)."""
        self._slot_rdds.clear()
        release_partitions(checkpoints, range(job.partitions))
        shutil.rmtree(self.claims, ignore_errors=True)

    def _slots(self, count: int) -> Any:
        """An RDD of ``count`` empty partitions (made once per count and run: no data to write and
        read back per batch)."""
        slots = self._slot_rdds.get(count)
        if slots is None:
            slots = self._slot_rdds[count] = self.context.parallelize([], count)
        return slots
