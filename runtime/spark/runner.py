"""Run a job on Spark in micro-batches, one Spark task per job partition.

Per batch the driver reads every partition's checkpoint (the committed input positions), plans the
input offset ranges ``[position, end)`` (``end`` = the input's end when planned, at most
``position + batch_size``) and a record limit (``batch_size``, all inputs together), and runs one
Spark task per partition with work. With instances kept open, the tasks are slots: each claims
one of the batch's partitions, preferring the one its Python worker keeps open (:func:`run_slot`).
Each Spark task (:func:`run_partition`):

1. checks out its partition's :class:`~localstate.runtime.partition.instance.TaskInstance`: the one its Python
   worker kept open after the partition's previous batch if the driver committed exactly that batch,
   else a freshly opened one, recovered to the last *committed* checkpoint (outputs written after it
   are truncated). Either way a retried attempt starts from committed state (:mod:`.instances`);
2. reads its own input range (no per-record traffic through the JVM), merges the inputs in event
   time order (``(ts, input, offset)``: a merge that is resumable at any cut, so the processing order
   does not depend on batch boundaries), applies each input's ``on_error`` policy and feeds the task;
3. calls ``prepare_commit()`` (stores and changelogs flushed, outputs written durably) and returns
   the checkpoint to the driver, without saving it; the instance stays open in the worker.

The driver saves the returned checkpoints only when every partition of the batch succeeded. If it
dies before, the next open trims the changelog records and truncates the outputs written after the
last saved checkpoint (:mod:`localstate.runtime.partition.recovery`), so nothing is lost or counted twice. At the
end of a run the driver has the workers close the instances they kept.

Each task reports where its time went (:data:`TASK_PHASES`), the driver its own (:data:`DRIVER_PHASES`).

This module is the runner's public face; the parts live by responsibility:

* :mod:`.context`: the Spark context (log4j settings, retries, worker interpreter);
* :mod:`.plan`: plan and result types, the measured phases;
* :mod:`.executor`: the executor entry points (:func:`run_partition`, :func:`run_slot`), which feed
  the task through the runtime's one feed loop (:meth:`localstate.runtime.partition.instance.TaskInstance.feed`);
* :mod:`.instances`: task instances kept open in the Python workers between batches;
* :mod:`.cluster`: cluster mode (non-local masters): per-host local stores, checkpoints carried by the
  plans and committed by the driver only, tasks placed on the executor holding their warm state;
* :mod:`.devcluster`: a standalone cluster on loopback for tests and benchmarks;
* :mod:`.driver`: :class:`SparkJobRunner` and :class:`BatchCompaction`; the runner plans and commits
  through a :class:`~localstate.runtime.driver.planner.BatchPlanner` and stops through a
  :class:`~localstate.runtime.driver.stopping.StopControl` (neither imports Spark).
"""

from __future__ import annotations

from localstate.runtime.spark.context import normalize_master, spark_context
from localstate.runtime.spark.driver import BatchCompaction, SparkJobRunner
from localstate.runtime.spark.executor import run_partition, run_slot
from localstate.runtime.driver.plan import DRIVER_PHASES, TASK_PHASES, BatchResult, PartitionPlan, RunSummary

__all__ = ["PartitionPlan", "BatchResult", "RunSummary", "SparkJobRunner", "BatchCompaction", "run_partition",
           "run_slot", "spark_context", "normalize_master", "TASK_PHASES", "DRIVER_PHASES"]
