"""Cluster mode: running a job on a Spark cluster (``spark://``, ``yarn``, ``k8s://``) where the
executors share no file system with each other or with the driver.

Two places, not one:

* **local** (each executor host): the stores, under ``[job] local_dir`` if set (``$VARS`` expanded
  on the host), else under the executor's Spark local directory (``SPARK_LOCAL_DIRS`` in the Python
  worker's environment, else the temp dir): ``<local>/localstate/<job>/stores/<store>/<partition>``
  (:func:`executor_local_root`). Only a cache of the changelog: never required to be shared.
* **durable**: the changelogs (a shared directory for the file changelog, Kafka, an object store)
  and the checkpoints, which only the driver reads and writes.

The driver coordinates, executors never do it through files:

* each task's plan carries its partition's committed checkpoint; the executor opens the task
  partition against it (:class:`PlannedCheckpoints`) and never reads or writes a checkpoint file, nor
  takes a file lock across hosts;
* fencing is the driver's acceptance: Spark reports exactly one successful attempt per task, and the
  driver commits that attempt's prepared checkpoint only. A zombie attempt (on a lost or paused host)
  is never accepted; whatever it wrote is after the committed offsets and is trimmed by the next open
  (the file and Kafka changelogs), or never named by a committed checkpoint (object stores);
* host affinity (:class:`Placement`): the driver remembers which executor ran each partition's last
  accepted attempt and builds the batch's RDD with that executor as the task's preferred location
  (``SparkContext.makeRDD`` with ``executor_<host>_<id>`` locations: Spark's process-local level),
  so the task runs where its warm local state is while that executor lives; a task on a host
  without it restores from the changelog. Each task reports whether its local state was warm.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.layout import store_root

__all__ = ["is_cluster_master", "executor_local_root", "PlannedCheckpoints", "Placement", "is_warm",
           "has_state", "LOCAL_SUBDIR"]

log = logging.getLogger(__name__)

LOCAL_SUBDIR = "localstate"
"""The directory localstate creates under an executor's Spark local directory."""


def is_cluster_master(master: str) -> bool:
    """True for a master whose executors may run on other hosts (anything but ``local[...]``)."""
    return not (master == "local" or master.startswith("local["))


def executor_local_root(job: JobConfig) -> Path:
    """The directory this executor host keeps the job's local stores under: ``[job] local_dir``
    (expanded here), else ``<first SPARK_LOCAL_DIRS entry>/localstate``, else the temp dir's."""
    if job.local_dir is not None:
        return store_root(job)
    spark_dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    base = Path(spark_dirs[0]) if spark_dirs else Path(tempfile.gettempdir())
    return base / LOCAL_SUBDIR


class PlannedCheckpoints:
    """An executor's view of its partition's checkpoints on a cluster, where the driver owns them.

    ``load`` returns the committed checkpoint the driver put in the plan; ``save`` keeps what the
    task instance would write (its new generation at open, its prepared checkpoint) in memory only:
    the driver commits the prepared checkpoint of the one attempt Spark reports as successful. There
    is nothing to lock: two attempts of one partition may both run (a zombie and its retry); they
    are told apart by the driver accepting one result, not by a lock on a shared file system."""

    def __init__(self, partition: int, committed: Checkpoint | None, where: str) -> None:
        self.partition = partition
        self.committed = committed
        self.where = where
        self.saved: Checkpoint | None = None

    def path(self, partition: int) -> Path:
        """Where the driver keeps the checkpoint (for error messages)."""
        return Path(self.where)

    def load(self, partition: int) -> Checkpoint | None:
        return self.committed

    def save(self, checkpoint: Checkpoint, *, expect_generation: int | None = None) -> None:
        self.saved = checkpoint

    def lock(self, partition: int) -> None:
        """Fencing across hosts is the driver's acceptance of one attempt (see the class doc)."""

    def unlock(self, partition: int) -> None:
        """Nothing was locked (see :meth:`lock`)."""


def is_warm(recoveries: Sequence[StoreRecovery]) -> bool:
    """True if every logged store's local state was exactly at the committed changelog offset when
    the task opened it (nothing replayed, trimmed or rebuilt)."""
    return all(r.local_offset == r.checkpoint_offset and not r.replayed and not r.trimmed for r in recoveries)


def has_state(checkpoint: Checkpoint | None) -> bool:
    """True if the partition has committed state a task could find warm (a changelog offset > 0)."""
    return checkpoint is not None and any(offset > 0 for offset in checkpoint.changelogs.values())


class Placement:
    """Driver side host affinity: which executor holds each partition's warm local state, and the
    Python RDD of a batch's plans that asks Spark to run each task there."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.homes: dict[int, tuple[str, str]] = {}
        """partition -> (executor id, host) of its last accepted attempt"""

    @property
    def _jvm(self) -> Any:
        return self.context._jvm

    def _java_list(self, items: Iterable[Any]) -> Any:
        out = self._jvm.java.util.ArrayList()
        for item in items:
            out.add(item)
        return out

    def _scala_seq(self, items: Iterable[Any]) -> Any:
        return self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(self._java_list(items)).toSeq()

    def live_executors(self) -> dict[str, str]:
        """``{executor id: host}`` of the executors alive now (the driver excluded), from Spark's
        status store."""
        store = self.context._jsc.sc().statusStore()
        executors = self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(store.executorList(True))
        out = {}
        for executor in executors:
            executor_id = str(executor.id())
            if executor_id != "driver" and executor.isActive():
                out[executor_id] = str(executor.hostPort()).rsplit(":", 1)[0]
        return out

    def assign(self, partitions: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Where each partition's task should run: its home executor while alive and not holding
        more than its fair share (``ceil(tasks / executors)``), else the least-loaded live executor
        (a partition without a home, a lost home, or the excess of an executor when another joins).
        Empty when no executor is known yet (Spark then places the tasks)."""
        alive = self.live_executors()
        if not alive:
            return {}
        share = -(-len(partitions) // len(alive))
        load = {executor: 0 for executor in alive}
        out: dict[int, tuple[str, str]] = {}
        for partition in partitions:
            home = self.homes.get(partition)
            if home is not None and home[0] in alive and load[home[0]] < share:
                out[partition] = (home[0], alive[home[0]])
                load[home[0]] += 1
        for partition in partitions:
            if partition not in out:
                executor = min(sorted(load), key=load.__getitem__)
                out[partition] = (executor, alive[executor])
                load[executor] += 1
        return out

    def locations(self, plans: Sequence[Any]) -> list[list[str]]:
        """Per plan: the preferred location ``executor_<host>_<id>`` of :meth:`assign`, if any
        (none if Spark's status store cannot be read: affinity saves restores, it is not needed
        for correctness)."""
        try:
            chosen = self.assign([plan.partition for plan in plans])
        except Exception:  # noqa: BLE001 - Py4J errors of a Spark version without these internals
            log.warning("cannot read Spark's executors; the batch's tasks run without preferred locations",
                        exc_info=True)
            chosen = {}
        return [[f"executor_{chosen[plan.partition][1]}_{chosen[plan.partition][0]}"]
                if plan.partition in chosen else [] for plan in plans]

    def rdd(self, plans: Sequence[Any]) -> Any:
        """A Python RDD with one partition per plan, each preferring its partition's home executor."""
        from pyspark import RDD
        from pyspark.serializers import CPickleSerializer

        serializer = CPickleSerializer()
        jvm = self._jvm
        pairs = [jvm.scala.Tuple2(bytearray(serializer.dumps(plan)), self._scala_seq(where))
                 for plan, where in zip(plans, self.locations(plans))]
        byte_array = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        java_rdd = self.context._jsc.sc().makeRDD(self._scala_seq(pairs), byte_array).toJavaRDD()
        return RDD(java_rdd, self.context, serializer)

    def record(self, group: str, plans: Sequence[Any]) -> dict[int, tuple[str, str]]:
        """After a batch's Spark job (group ``group``) succeeded: where each plan's successful attempt
        ran, from Spark's status store; these executors become the partitions' homes. Affinity is an
        optimization: if the status store cannot be read, the homes stay as they were."""
        try:
            return self._record(group, plans)
        except Exception:  # noqa: BLE001 - Py4J errors (a timeout of the listener bus, changed internals)
            log.warning("cannot read where the batch's tasks ran; partition homes unchanged", exc_info=True)
            return {}

    def _record(self, group: str, plans: Sequence[Any]) -> dict[int, tuple[str, str]]:
        ran: dict[int, tuple[str, str]] = {}
        for task in self._tasks(group):
            if task.status() == "SUCCESS" and 0 <= task.index() < len(plans):
                ran[plans[task.index()].partition] = (str(task.executorId()), str(task.host()))
        self.homes.update(ran)
        return ran

    def _tasks(self, group: str) -> Iterable[Any]:
        """Every task attempt of job group ``group`` as Spark's status store keeps it (``TaskData``:
        index, attempt, status, executorId, host, errorMessage), once the listener bus fed it."""
        sc = self.context._jsc.sc()
        sc.listenerBus().waitUntilEmpty(10_000)  # the status store is fed by the listener bus
        tracker = self.context.statusTracker()
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                tasks = sc.statusStore().taskList(stage_id, stage.currentAttemptId, 1 << 20)
                yield from self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(tasks)

    def failed_attempts(self, group: str, plans: Sequence[Any], batch: int) -> list[dict[str, Any]]:
        """Why each failed attempt of the batch's Spark job (group ``group``) failed, from Spark's
        status store on the driver: on a cluster the executors leave no reasons the driver can read
        (:func:`~localstate.runtime.spark.failures.record_failed_attempt` writes them for local
        masters only). One reason per failed attempt, as ``failed_attempt_reasons`` makes them; []
        if the status store cannot be read (the reasons are a diagnosis, never needed to commit)."""
        from localstate.runtime.spark.failures import attempt_error

        try:
            out = []
            for task in self._tasks(group):
                if task.status() != "FAILED" or not 0 <= task.index() < len(plans):
                    continue
                text = str(task.errorMessage().get()) if task.errorMessage().isDefined() else ""
                kind, message = attempt_error(text)
                out.append({"batch": batch, "partition": plans[task.index()].partition, "attempt": int(task.attempt()),
                            "type": kind, "message": message, "host": str(task.host()),
                            "executor": str(task.executorId())})
            return out
        except Exception:  # noqa: BLE001 - Py4J errors (a stopped context, changed internals)
            log.debug("cannot read the failed attempts of %s from Spark's status store", group, exc_info=True)
            return []
