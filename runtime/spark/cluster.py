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
* host affinity (:class:`Placement`): each task reports its *home* (:func:`local_home`, an id of
  the host's local store directory), and the driver records it in the partition's checkpoint
  (:attr:`Checkpoint.home`), so it survives the driver. The batch's RDD prefers an executor with
  that home for the task (``SparkContext.makeRDD`` with ``executor_<host>_<id>`` locations: Spark's
  process-local level), so the task runs where its warm local state is, in this run and after a
  restart (a new driver asks its new executors their homes first); a task on a host without it
  restores from the changelog. Each task reports whether its local state was warm.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from pyspark import RDD
from pyspark.serializers import CPickleSerializer

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.layout import store_root
from localstate.runtime.spark.config import is_local_master
from localstate.runtime.spark.failures import attempt_error

__all__ = ["is_cluster_master", "executor_local_root", "PlannedCheckpoints", "Placement", "is_warm",
           "local_home", "assign_executors", "LOCAL_SUBDIR", "PROBE_TIMEOUT", "REGISTER_POLL",
           "REGISTER_WAIT_SETTING"]

log = logging.getLogger(__name__)

LOCAL_SUBDIR = "localstate"
"""The directory localstate creates under an executor's Spark local directory."""

REGISTER_WAIT_SETTING = "spark.scheduler.maxRegisteredResourcesWaitingTime"
"""The Spark setting that bounds how long a restarted driver waits for the executors holding its
partitions' local state to register (:meth:`Placement.locate`)."""

REGISTER_POLL = 0.5
"""Seconds between two looks at the registered executors while waiting for them."""

PROBE_TIMEOUT = 30.0
"""Seconds after which a probe of the executors' homes is cancelled (a frozen executor)."""


def is_cluster_master(master: str) -> bool:
    """True for a master whose executors may run on other hosts (anything but ``local[...]``)."""
    return not is_local_master(master)


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


def local_home(job: JobConfig) -> str:
    """This executor host's *home* for ``job``: an id (32 hex digits) of the directory it keeps the
    job's local stores in (:func:`executor_local_root`, on this host by name). Executors that share
    that directory share the home; with a stable ``[job] local_dir`` a host keeps its home across
    executors and runs, with Spark's per-application local directories (the default) it does not."""
    where = socket.gethostname().encode("utf-8", "surrogateescape") + b"\0" + os.fsencode(executor_local_root(job))
    return hashlib.sha256(where).hexdigest()[:32]


def assign_executors(partitions: Sequence[int], alive: Mapping[str, str],
                     holders: Mapping[int, Collection[str]]) -> dict[int, tuple[str, str]]:
    """Where each of a batch's ``partitions`` should run, as ``{partition: (executor id, host)}``.

    Partitions are owned, not only run: every partition of ``holders`` (partition -> the executors
    holding its local state; planned in this batch or not) is owned by the least loaded of its live
    holders while that one owns less than its fair share (``ceil(partitions / live executors)``, the
    partitions counted being those planned or held); a planned partition without an owner (no known
    home, a lost home, the excess of an executor when another joins) goes to the executor owning the
    fewest. So a partition moves only when ownership is unbalanced, never because a sparse batch
    happens to plan two partitions of one executor, and the homes a run leaves are balanced for the
    next one. Empty when no executor is alive (Spark then places the tasks). Pure: no Spark."""
    if not alive:
        return {}
    counted = set(partitions) | {p for p, executors in holders.items() if any(e in alive for e in executors)}
    share = -(-len(counted) // len(alive))
    load = {executor: 0 for executor in sorted(alive)}
    owner: dict[int, str] = {}
    for partition in sorted(holders):
        candidates = [e for e in sorted(holders[partition]) if e in load and load[e] < share]
        if candidates:
            owner[partition] = min(candidates, key=load.__getitem__)
            load[owner[partition]] += 1
    # Every counted partition without an owner gets one, in partition order, whether this batch plans
    # it or not: so a batch's placement is the ownership of the whole, whatever subset it plans.
    for partition in sorted(counted):
        if partition not in owner:
            owner[partition] = min(load, key=load.__getitem__)
            load[owner[partition]] += 1
    return {partition: (owner[partition], alive[owner[partition]]) for partition in partitions}


class Placement:
    """Driver side host affinity: which executor holds each partition's warm local state, and the
    Python RDD of a batch's plans that asks Spark to run each task there.

    A partition's committed checkpoint names the *home* of the attempt that committed it
    (:attr:`Checkpoint.home`, :func:`local_home`); the placement knows the home of each live executor,
    from the results of the tasks it ran and, for an executor that ran nothing yet (a restarted driver's
    new executors), from a probe: one tiny task per such executor, asking its home. So a restarted
    driver places each partition where its local state is, as the previous driver did. Affinity saves
    restores; it is never needed for correctness (the attempt markers decide what local state is used)."""

    def __init__(self, context: Any, *, stable: bool = False) -> None:
        self.context = context
        self.stable = stable
        """``[job] local_dir`` is set: a host's home outlives its executors and the run, so a new
        executor is worth probing, and a restarted driver waits for the executors of its homes"""
        self.homes: dict[int, tuple[str, str]] = {}
        """partition -> (executor id, host) of its last accepted attempt in this driver"""
        self.executor_homes: dict[str, str] = {}
        """executor id -> its home (:func:`local_home`), for live executors"""
        self._probed: set[str] = set()
        """executors already asked their home (each is asked once)"""
        self._waited = False
        """the first :meth:`locate` (which may wait for executors to register) is done"""

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

    def holders(self, wanted: Mapping[int, str], alive: Mapping[str, str]) -> dict[int, list[str]]:
        """partition -> the live executors whose home is ``wanted[partition]``."""
        by_home: dict[str, list[str]] = {}
        for executor, home in self.executor_homes.items():
            if executor in alive:
                by_home.setdefault(home, []).append(executor)
        return {partition: by_home[home] for partition, home in wanted.items() if home in by_home}

    def locate(self, wanted: Mapping[int, str], job: Any, stop: threading.Event) -> None:
        """Before a batch: learn the home of every live executor that might hold a ``wanted`` home
        (partition -> the home its committed checkpoint names) and is not known yet, by probing it.
        The first call (a restarted driver's first batch) also waits for executors to register until
        every wanted home has a live executor, at most ``spark.scheduler.maxRegisteredResourcesWaitingTime``
        (Spark's own bound on waiting for executors before scheduling; 30 s by default), or until
        ``stop`` is set. Only with a stable ``local_dir`` (:attr:`stable`): otherwise no home outlives
        its executor. ``job``: the run's JobConfig broadcast, for the probe's tasks."""
        first, self._waited = not self._waited, True
        if not self.stable or not wanted:
            return
        try:
            deadline = time.monotonic() + (self._register_wait() if first else 0.0)
            while True:
                alive = self.live_executors()
                self._forget_gone(alive)
                missing = set(wanted.values()) - {self.executor_homes[e] for e in alive if e in self.executor_homes}
                unknown = {e: host for e, host in alive.items()
                           if e not in self._probed and e not in self.executor_homes}
                if missing and unknown:
                    self._probe(unknown, job)
                    continue
                if not missing or time.monotonic() >= deadline or stop.wait(REGISTER_POLL):
                    return
        except Exception:  # noqa: BLE001 - Py4J errors of a Spark version without these internals
            log.warning("cannot learn where the executors keep their local stores; the batch's tasks are placed "
                        "without it", exc_info=True)

    def _register_wait(self) -> float:
        """``spark.scheduler.maxRegisteredResourcesWaitingTime`` in seconds (30 if unreadable)."""
        try:
            return float(self.context._jsc.sc().conf().getTimeAsMs(REGISTER_WAIT_SETTING, "30s")) / 1000.0
        except Exception:  # noqa: BLE001 - a context without a JVM conf (tests), changed internals
            return 30.0

    def _forget_gone(self, alive: Mapping[str, str]) -> None:
        """Keep what is known of live executors only (executors come and go over a long run)."""
        self.executor_homes = {e: home for e, home in self.executor_homes.items() if e in alive}
        self._probed &= set(alive)

    def _probe(self, executors: Mapping[str, str], job: Any) -> None:
        """Ask each of ``executors`` (id -> host) its home: a Spark job of one tiny task per executor,
        each preferring its executor; where each task ran is read from Spark's status store, so a task
        Spark ran elsewhere still tells the truth about where it ran. Cancelled after
        :data:`PROBE_TIMEOUT` seconds (a frozen executor); each executor is probed once."""
        ids = sorted(executors)
        self._probed.update(ids)
        group = f"localstate-probe-{uuid.uuid4().hex}"
        self.context.setJobGroup(group, "localstate: where each executor keeps the job's local stores")
        timer = threading.Timer(PROBE_TIMEOUT, self.context.cancelJobGroup, [group])
        timer.daemon = True
        timer.start()
        try:
            found = self._rdd(ids, [[f"executor_{executors[e]}_{e}"] for e in ids]).map(
                lambda _: local_home(job.value)).collect()
        except Exception:  # noqa: BLE001 - cancelled, or an executor lost meanwhile: they stay unknown
            log.warning("could not ask executors %s where they keep their local stores", ", ".join(ids),
                        exc_info=True)
            return
        finally:
            timer.cancel()
        for task in self._tasks(group):
            if task.status() == "SUCCESS" and 0 <= task.index() < len(found):
                self.executor_homes[str(task.executorId())] = found[task.index()]

    def assign(self, partitions: Sequence[int], wanted: Mapping[int, str] | None = None) -> dict[int, tuple[str, str]]:
        """Where each partition's task should run (:func:`assign_executors`): an executor whose home
        is the one ``wanted`` names for the partition (``wanted``: the homes of every partition with
        state, planned or not), while it is alive and owns no more than its fair share."""
        alive = self.live_executors()
        self._forget_gone(alive)
        return assign_executors(partitions, alive, self.holders(wanted or {}, alive))

    def locations(self, plans: Sequence[Any], wanted: Mapping[int, str] | None = None) -> list[list[str]]:
        """Per plan: the preferred location ``executor_<host>_<id>`` of :meth:`assign`, if any
        (none if Spark's status store cannot be read: affinity saves restores, it is not needed
        for correctness)."""
        try:
            chosen = self.assign([plan.partition for plan in plans], wanted)
        except Exception:  # noqa: BLE001 - Py4J errors of a Spark version without these internals
            log.warning("cannot read Spark's executors; the batch's tasks run without preferred locations",
                        exc_info=True)
            chosen = {}
        return [[f"executor_{chosen[plan.partition][1]}_{chosen[plan.partition][0]}"]
                if plan.partition in chosen else [] for plan in plans]

    def rdd(self, plans: Sequence[Any], wanted: Mapping[int, str] | None = None) -> Any:
        """A Python RDD with one partition per plan, each preferring an executor with the partition's
        home (``wanted``: partition -> home)."""
        return self._rdd(plans, self.locations(plans, wanted))

    def _rdd(self, items: Sequence[Any], where: Sequence[Sequence[str]]) -> Any:
        """A Python RDD with one partition per item, preferring the locations ``where`` names for it."""
        serializer = CPickleSerializer()
        jvm = self._jvm
        pairs = [jvm.scala.Tuple2(bytearray(serializer.dumps(item)), self._scala_seq(locations))
                 for item, locations in zip(items, where)]
        byte_array = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
        java_rdd = self.context._jsc.sc().makeRDD(self._scala_seq(pairs), byte_array).toJavaRDD()
        return RDD(java_rdd, self.context, serializer)

    def record(self, group: str, plans: Sequence[Any],
               results: Sequence[Mapping[str, Any]] = ()) -> dict[int, tuple[str, str]]:
        """After a batch's Spark job (group ``group``) succeeded: where each plan's successful attempt
        ran, from Spark's status store; these executors become the partitions' homes, and the homes
        the ``results`` report (``home``) become their executors'. Affinity is an optimization: if the
        status store cannot be read, what is known stays as it was."""
        try:
            return self._record(group, plans, results)
        except Exception:  # noqa: BLE001 - Py4J errors (a timeout of the listener bus, changed internals)
            log.warning("cannot read where the batch's tasks ran; partition homes unchanged", exc_info=True)
            return {}

    def _record(self, group: str, plans: Sequence[Any],
                results: Sequence[Mapping[str, Any]]) -> dict[int, tuple[str, str]]:
        ran: dict[int, tuple[str, str]] = {}
        for task in self._tasks(group):
            if task.status() == "SUCCESS" and 0 <= task.index() < len(plans):
                ran[plans[task.index()].partition] = (str(task.executorId()), str(task.host()))
        self.homes.update(ran)
        for result in results:
            where = ran.get(result.get("partition"))  # type: ignore[arg-type]
            if where is not None and result.get("home"):
                self.executor_homes[where[0]] = result["home"]
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
