"""What an operator sees of a running job: one progress object per committed batch (modelled on Spark's
``StreamingQueryProgress``), appended as a JSON line to a size-rotated ``progress.jsonl`` under the job's
state directory and logged at INFO (logger ``localstate.progress``), and a heartbeat file that says
whether a run is live (``localstate status`` reads both, read-only).

Layout, under ``<state_dir>/<job>/progress/``:

- ``progress.jsonl``, ``progress.jsonl.1`` ... ``.<keep>``: one object per batch, newest last; rotated
  when the current file would pass ``max_bytes`` (the oldest file is dropped: at most ``keep + 1``
  files of about ``max_bytes`` each);
- ``live.json``: ``{"pid", "host", "run_id", "started", "heartbeat", "state", "batch"}``, rewritten
  atomically after every batch and every :data:`HEARTBEAT_INTERVAL` seconds by a daemon thread while
  the run lives; ``state`` is ``"stopped"`` once the run ended (cleanly or by an error).

The figures come from the driver's :class:`~localstate.runtime.spark.plan.BatchResult` and the batch's
plans; the per-store ones are estimates read on the driver host (see :class:`StoreStats`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.fsutil import write_atomic
from localstate.core.layout import job_directory, store_directory
from localstate.core.names import safe_join
from localstate.core.streams.base import PendingTail
from localstate.runtime.views import dir_size
from localstate.runtime.spark.plan import DRIVER_PHASES, TASK_PHASES, BatchResult, PartitionPlan

__all__ = ["ProgressReport", "ProgressLog", "Heartbeat", "ProgressObserver", "StoreStats", "BatchObserver",
           "progress_directory", "attempt_reason", "describe_reason", "REASON_FIELDS", "read_live",
           "read_last_progress", "is_live", "PROGRESS_FILE", "LIVE_FILE", "HEARTBEAT_INTERVAL", "HEARTBEAT_STALE",
           "COMMIT_PHASES"]

log = logging.getLogger("localstate.progress")

PROGRESS_FILE = "progress.jsonl"
LIVE_FILE = "live.json"
HEARTBEAT_INTERVAL = 5.0
"""seconds between heartbeats of a live run (also written after every batch)"""
HEARTBEAT_STALE = 30.0
"""a heartbeat older than this means the run is not live (a hung or frozen driver, another host's pid)"""
COMMIT_PHASES = ("changelog", "store_flush", "outputs")
"""the task phases that make a batch's commit, with the driver's ``checkpoint`` save"""


class BatchObserver(Protocol):
    """What :class:`~localstate.runtime.spark.driver.SparkJobRunner` calls after each committed batch."""

    def __call__(self, result: BatchResult, plans: list[PartitionPlan]) -> None: ...


def progress_directory(job: JobConfig) -> Path:
    """``<state_dir>/<job>/progress`` (not created)."""
    return safe_join(job.state_dir, job.name, "progress")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# -- per-store estimates ----------------------------------------------------------------------------------

def _estimate_keys(directory: Path, backend: str | None) -> int | None:
    """The kv backend's own key estimate of a local store partition, read-only: LMDB's entry count,
    RocksDB's ``rocksdb.estimate-num-keys`` (on a private hard-linked snapshot, as ``inspect`` opens
    it); None for anything else."""
    from localstate.runtime import views

    reader = views._reader(directory, backend)  # noqa: SLF001 - the one read-only opener of local stores
    if reader is None:
        return None
    try:
        if backend == "lmdb":
            with reader.env.begin(db=reader.data) as txn:  # type: ignore[attr-defined]
                return int(txn.stat(reader.data)["entries"])  # type: ignore[attr-defined]
        return int(reader.db.property_int_value("rocksdb.estimate-num-keys") or 0)  # type: ignore[attr-defined]
    finally:
        reader.close()


@dataclass
class StoreStats:
    """Per-store figures read on the driver host: bytes of the local store directories
    (``<state_dir>/<job>/stores/<store>/<p>``; 0 where a partition has none here, as on a cluster
    where they live on the executors), bytes of the changelog segments (changelog systems that keep
    their streams locally, else None) and the kv backend's key estimate (RocksDB
    ``estimate-num-keys``, LMDB's entry count; None for other engines and the memory backend). Keys
    are re-estimated at most every ``keys_interval`` seconds (opening a store read-only costs a few
    milliseconds); bytes every batch."""

    job: JobConfig
    keys_interval: float = 60.0
    _keys: dict[str, int | None] = field(default_factory=dict)
    _keys_at: float = float("-inf")
    _system: Any = False
    """the job's changelog system once opened (None: not a local one), False: not opened yet"""

    def collect(self) -> dict[str, dict[str, Any]]:
        from localstate.core.changelog import LocalStreams
        from localstate.core.layout import open_changelog_system

        now = time.monotonic()
        refresh = now - self._keys_at >= self.keys_interval
        if refresh:
            self._keys_at = now
        if self._system is False and any(store.changelog for store in self.job.stores.values()):
            # Opened once: only a system keeping its streams in local files has segment sizes to read.
            self._system = None
            try:
                system = open_changelog_system(self.job)
                if isinstance(system, LocalStreams):
                    self._system = system
                else:
                    system.close()
            except Exception:  # noqa: BLE001 - figures are best effort, never a failed run
                log.debug("cannot open the changelog system for progress figures", exc_info=True)
        system = self._system or None
        out: dict[str, dict[str, Any]] = {}
        for name, store in sorted(self.job.stores.items()):
            backend = store.options.get("backend")
            local = changelog = 0
            keys: int | None = None
            for partition in range(self.job.partitions):
                directory = store_directory(self.job, name, partition)
                if directory.is_dir():
                    local += dir_size(directory)
                    if refresh and store.engine == "kv":
                        try:
                            found = _estimate_keys(directory, backend if isinstance(backend, str) else None)
                        except Exception:  # noqa: BLE001
                            log.debug("key estimate of %s failed", directory, exc_info=True)
                            found = None
                        if found is not None:
                            keys = (keys or 0) + found
                if store.changelog and isinstance(system, LocalStreams):
                    try:
                        changelog += sum(size for _, size in system.segments(store.changelog, partition))
                    except Exception:  # noqa: BLE001
                        pass
            if refresh:
                self._keys[name] = keys
            out[name] = {"engine": store.engine, "backend": backend, "bytes": local,
                         "changelog_bytes": changelog if isinstance(system, LocalStreams) and store.changelog
                         else None,
                         "keys_estimate": self._keys.get(name)}
        return out

    def close(self) -> None:
        system, self._system = self._system, False
        if system:
            system.close()


# -- the progress object --------------------------------------------------------------------------------

class ProgressReport:
    """Builds one batch's progress object (a JSON-able dict) from what the driver knows after it."""

    @staticmethod
    def from_batch(job: JobConfig, result: BatchResult, plans: Iterable[PartitionPlan], *, run_id: str = "",
                   ended: float | None = None, previous_end: float | None = None,
                   positions: Mapping[int, Mapping[str, int]] | None = None,
                   inputs: Mapping[str, Any] | None = None,
                   stores: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """``ended``: epoch seconds when the batch was committed (default now); ``previous_end``: when
        the previous batch of the run was, for the arrival rate; ``positions``: each planned
        partition's committed input positions after the batch (``{partition: {input: offset}}``), for
        rows per input; ``inputs``: the job's open input streams, for the lag per input partition
        (their current end: Spark's ``latestOffset``); ``stores``: :meth:`StoreStats.collect`."""
        plans = list(plans)
        ended = time.time() if ended is None else ended
        started = ended - result.seconds
        seconds = result.seconds
        driver = result.driver_seconds
        plan_s, spark_s, checkpoint_s = (driver.get(name, 0.0) for name in DRIVER_PHASES)
        spark_wall = spark_s + result.busiest_task
        phases = {
            "plan": {"start_ms": 0.0, "duration_ms": _ms(plan_s)},
            "spark": {"start_ms": _ms(plan_s), "duration_ms": _ms(spark_wall), "overhead_ms": _ms(spark_s),
                      "busiest_task_ms": _ms(result.busiest_task)},
            "checkpoint": {"start_ms": _ms(plan_s + spark_wall), "duration_ms": _ms(checkpoint_s)},
        }
        tasks_ms = {name: _ms(result.task_seconds.get(name, 0.0)) for name in TASK_PHASES}
        arrival = ended - previous_end if previous_end is not None else None

        per_input: dict[str, dict[str, Any]] = {}
        for name in sorted(job.inputs):
            rows = None
            if positions is not None:
                rows = 0
                for plan in plans:
                    start = plan.ranges.get(name, (0, 0))[0]
                    rows += max(0, int(positions.get(plan.partition, {}).get(name, start)) - start)
            entry: dict[str, Any] = {
                "rows": rows,
                "processed_rows_per_second": round(rows / seconds, 3) if rows is not None and seconds else None,
                "input_rows_per_second": round(rows / arrival, 3) if rows is not None and arrival else None,
                "start_offsets": {str(p.partition): p.ranges[name][0] for p in plans if name in p.ranges},
                "end_offsets": ({str(p.partition): int(positions.get(p.partition, {}).get(name, p.ranges[name][0]))
                                 for p in plans if name in p.ranges} if positions is not None else None),
            }
            source = (inputs or {}).get(name)
            if source is not None and positions is not None:
                entry.update(_input_lag(job, name, source, positions))
            per_input[name] = entry

        commit_tasks = sum(result.task_seconds.get(name, 0.0) for name in COMMIT_PHASES)
        commit_ms = _ms(checkpoint_s + (commit_tasks / result.tasks if result.tasks else 0.0))
        reasons = [attempt_reason(reason) for reason in getattr(result, "failed_attempt_reasons", None) or []]
        return {
            "job": job.name,
            "run_id": run_id,
            "batch": result.batch,
            "timestamp": _iso(ended),
            "started": _iso(started),
            "duration_ms": _ms(seconds),
            "phases": {"driver": phases, "tasks_ms": tasks_ms},
            "tasks": result.tasks,
            "rows_in": result.records_in,
            "rows_out": result.records_out,
            "processed_rows_per_second": round(result.records_in / seconds, 3) if seconds else 0.0,
            "input_rows_per_second": round(result.records_in / arrival, 3) if arrival else None,
            "skipped": result.skipped,
            "dead_lettered": result.dead_lettered,
            # what the batch dropped or redirected, by window store and by input (TaskCounters)
            "late_records": dict(result.counts.get("late_records", {})),
            "misrouted": dict(result.counts.get("misrouted", {})),
            "lag": result.lag,
            "pending_bytes": result.pending_bytes,
            "inputs": per_input,
            "state": {
                "stores": dict(stores or {}),
                "commit_ms": commit_ms,
                "restore": {"records": result.replayed, "trimmed": result.trimmed,
                            "ms": _ms(result.restore_seconds)},
                "stateful_tasks": result.stateful,
                "warm_tasks": result.warm,
                "cold_tasks": result.stateful - result.warm,
                "warm": result.stateful == result.warm if result.stateful else None,
                "reused_instances": result.reused,
            },
            "failed_attempts": result.failed_attempts,
            "failed_attempt_reasons": reasons,
        }


REASON_FIELDS = ("batch", "partition", "attempt", "type", "message", "host")
"""the fields of a failed attempt's reason in a progress object (and their order)"""


def attempt_reason(reason: Mapping[str, Any]) -> dict[str, Any]:
    """A failed attempt's reason as a JSON object of :data:`REASON_FIELDS` (a missing one is None; a
    value that is no JSON scalar becomes its text), so that an operator's tools read it as JSON."""
    out: dict[str, Any] = {}
    for name in REASON_FIELDS:
        value = reason.get(name)
        out[name] = value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
    return out


def describe_reason(reason: Any) -> str:
    """One line for a failed attempt's reason: ``partition P attempt A on HOST: Type: message``
    (a reason that is not an object, as older progress files hold, is shown as it is)."""
    if not isinstance(reason, Mapping):
        return str(reason)
    partition = reason.get("partition")
    where = f"partition {partition}" if partition is not None else "a slot"
    host = f" on {reason['host']}" if reason.get("host") else ""
    return (f"batch {reason.get('batch')} {where} attempt {reason.get('attempt')}{host}: "
            f"{reason.get('type')}: {reason.get('message') or ''}").rstrip(": ")


def _input_lag(job: JobConfig, name: str, source: Any, positions: Mapping[int, Mapping[str, int]]) -> dict[str, Any]:
    """Lag (records) and unterminated bytes per partition of one input, against its current end."""
    lag: dict[str, int] = {}
    pending: dict[str, int] = {}
    for partition in range(job.partitions):
        position = positions.get(partition, {}).get(name)
        if position is None:
            continue
        try:
            lag[str(partition)] = max(0, int(source.end_offset(partition)) - int(position))
            if isinstance(source, PendingTail):
                pending[str(partition)] = int(source.pending_bytes(partition))
        except Exception:  # noqa: BLE001 - an input that cannot answer now is left out, not fatal
            log.debug("lag of input %r partition %d unavailable", name, partition, exc_info=True)
    return {"lag": sum(lag.values()), "lag_by_partition": lag,
            "pending_bytes_by_partition": pending if isinstance(source, PendingTail) else None}


# -- files ------------------------------------------------------------------------------------------------

class ProgressLog:
    """Appends one JSON object per line to ``<directory>/progress.jsonl``, rotating by size: when the
    next line would make the file larger than ``max_bytes``, ``.N`` becomes ``.N+1`` (``.keep`` is
    dropped) and the file becomes ``.1``. Nothing grows forever: at most ``keep + 1`` files."""

    def __init__(self, directory: Path, *, max_bytes: int = 10 * 1024 * 1024, keep: int = 5) -> None:
        self.directory = directory
        self.path = directory / PROGRESS_FILE
        self.max_bytes = max(1, int(max_bytes))
        self.keep = max(0, int(keep))
        self._lock = threading.Lock()

    def append(self, progress: Mapping[str, Any]) -> None:
        line = (json.dumps(progress, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(line) > self.max_bytes:
                self._rotate()
            with open(self.path, "ab") as handle:
                handle.write(line)

    def _rotate(self) -> None:
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        oldest = self.directory / f"{PROGRESS_FILE}.{self.keep}"
        oldest.unlink(missing_ok=True)
        for index in range(self.keep - 1, 0, -1):
            older = self.directory / f"{PROGRESS_FILE}.{index}"
            if older.exists():
                os.replace(older, self.directory / f"{PROGRESS_FILE}.{index + 1}")
        os.replace(self.path, self.directory / f"{PROGRESS_FILE}.1")

    def files(self) -> list[Path]:
        """The progress files, oldest first."""
        rotated = sorted((p for p in self.directory.glob(f"{PROGRESS_FILE}.*") if p.suffix[1:].isdigit()),
                         key=lambda p: -int(p.suffix[1:]))
        return rotated + ([self.path] if self.path.exists() else [])


class Heartbeat:
    """``live.json``: who runs the job (pid, host, run) and when it last showed signs of life."""

    def __init__(self, directory: Path, run_id: str, *, interval: float = HEARTBEAT_INTERVAL) -> None:
        self.path = directory / LIVE_FILE
        self.directory = directory
        self.run_id = run_id
        self.interval = interval
        self.started = time.time()
        self.batch: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _write(self, state: str) -> None:
        body = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id, "started": self.started,
                "heartbeat": time.time(), "state": state, "batch": self.batch,
                "heartbeat_interval": self.interval}
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(body, sort_keys=True).encode(), durable=False)

    def beat(self, batch: int | None = None) -> None:
        if batch is not None:
            self.batch = batch
        self._write("running")

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="localstate-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write("running")
            except OSError:
                log.warning("cannot write the heartbeat %s", self.path, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._write("stopped")
        except OSError:
            log.warning("cannot write the heartbeat %s", self.path, exc_info=True)


class ProgressObserver:
    """The ``on_batch`` hook of ``localstate run``: builds each batch's progress object, appends it to
    ``progress.jsonl``, logs it at INFO, beats the heartbeat and hands it to ``sinks`` (the metrics).
    A failure here is logged, never raised: the job's figures must not stop the job."""

    def __init__(self, job: JobConfig, *, run_id: str | Callable[[], str] = "", inputs: Mapping[str, Any] | None = None,
                 positions: Callable[[int], Checkpoint | None] | None = None, max_bytes: int = 10 * 1024 * 1024,
                 keep: int = 5, heartbeat: bool = True, sinks: Iterable[Callable[[dict[str, Any]], None]] = (),
                 keys_interval: float = 60.0) -> None:
        self.job = job
        job_directory(job)  # creates <state_dir>/<job> with its ownership marker if this is the first run
        self.directory = progress_directory(job)
        self.log = ProgressLog(self.directory, max_bytes=max_bytes, keep=keep)
        self.run_id = run_id
        self.inputs = inputs
        self.positions = positions
        self.stores = StoreStats(job, keys_interval=keys_interval)
        self.sinks = list(sinks)
        self.heartbeat = Heartbeat(self.directory, run_id if isinstance(run_id, str) else "") if heartbeat else None
        self.last: dict[str, Any] | None = None
        self._previous_end: float | None = None
        self._positions: dict[int, dict[str, int]] = {}

    @classmethod
    def watch(cls, runner: Any, **options: Any) -> "ProgressObserver":
        """Observe ``runner`` (a ``SparkJobRunner``): become its ``on_batch``, start the heartbeat and,
        when the job sets ``[job] metrics_port``, the metrics endpoint. :meth:`close` undoes it all.
        What ``localstate run`` does."""
        job = runner.job
        metrics = None
        if job.metrics_port is not None:
            from localstate.runtime.metrics import JobMetrics

            from localstate.errors import ConfigError

            metrics = JobMetrics(job.name)
            try:
                metrics.serve(job.metrics_port, job.metrics_host)
            except OSError as exc:
                raise ConfigError.at("job.metrics_port", f"cannot serve metrics on {job.metrics_host}:"
                                     f"{job.metrics_port}: {exc}", source=job.source,
                                     hint="pick a free port, or another metrics_host") from exc
        observer = cls(job, run_id=lambda: runner.run_id, inputs=runner.inputs, positions=runner.committed,
                       sinks=[metrics] if metrics is not None else [], **options)
        observer.metrics = metrics
        runner.on_batch = observer
        return observer.start()

    metrics: Any = None
    """the :class:`~localstate.runtime.metrics.JobMetrics` :meth:`watch` started, if any"""

    def start(self) -> "ProgressObserver":
        if self.heartbeat is not None:
            if callable(self.run_id):
                self.heartbeat.run_id = ""
            self.heartbeat.start()
        return self

    def close(self) -> None:
        self.stores.close()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.metrics is not None:
            self.metrics.close()

    def __enter__(self) -> "ProgressObserver":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, result: BatchResult, plans: list[PartitionPlan]) -> None:
        try:
            self.observe(result, plans)
        except Exception:  # noqa: BLE001
            log.warning("progress of batch %d could not be recorded", result.batch, exc_info=True)

    def observe(self, result: BatchResult, plans: list[PartitionPlan]) -> dict[str, Any]:
        ended = time.time()
        positions = None
        if self.positions is not None:
            # Only planned partitions moved; the others keep the positions seen before (read once):
            # their lag counts too.
            for partition in [plan.partition for plan in plans] + [
                    p for p in range(self.job.partitions) if p not in self._positions]:
                checkpoint = self.positions(partition)
                self._positions[partition] = dict(checkpoint.inputs) if checkpoint is not None else {}
            positions = {p: inputs for p, inputs in self._positions.items() if inputs}
        run_id = self.run_id() if callable(self.run_id) else self.run_id
        progress = ProgressReport.from_batch(self.job, result, plans, run_id=run_id, ended=ended,
                                             previous_end=self._previous_end, positions=positions,
                                             inputs=self.inputs, stores=self.stores.collect())
        self._previous_end = ended
        self.last = progress
        self.log.append(progress)
        if log.isEnabledFor(logging.INFO):
            log.info("%s", json.dumps(progress, sort_keys=True, separators=(",", ":")))
        if self.heartbeat is not None:
            self.heartbeat.run_id = run_id
            self.heartbeat.beat(result.batch)
        for sink in self.sinks:
            sink(progress)
        return progress


# -- reading, for `localstate status` (read-only: opens files for reading only) --------------------------

def read_live(job: JobConfig) -> dict[str, Any] | None:
    """The job's ``live.json``, or None if there is none (or it is unreadable)."""
    try:
        return json.loads((progress_directory(job) / LIVE_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def read_last_progress(job: JobConfig) -> dict[str, Any] | None:
    """The newest complete progress object, or None."""
    directory = progress_directory(job)
    for path in (directory / PROGRESS_FILE, directory / f"{PROGRESS_FILE}.1"):
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                chunk = 1 << 16
                while True:
                    start = max(0, size - chunk)
                    handle.seek(start)
                    data = handle.read(size - start)
                    lines = [line for line in data.split(b"\n")[(1 if start else 0):] if line.strip()]
                    if lines or start == 0:
                        break
                    chunk *= 4
        except OSError:
            continue
        for line in reversed(lines):
            try:
                return json.loads(line)
            except ValueError:
                continue  # a torn last line (a crash mid-append): the one before it
    return None


def is_live(live: Mapping[str, Any] | None, *, now: float | None = None,
            stale: float = HEARTBEAT_STALE) -> tuple[bool, str]:
    """Whether the run ``live`` describes is alive, and why (or why not)."""
    if not live:
        return False, "no run has recorded a heartbeat"
    now = time.time() if now is None else now
    if live.get("state") != "running":
        return False, f"the last run stopped at {_iso(float(live.get('heartbeat', 0)))}"
    age = now - float(live.get("heartbeat", 0))
    if live.get("host") != socket.gethostname():
        alive = age <= stale
        return alive, (f"heartbeat {age:.0f}s ago from host {live.get('host')} (pid not checkable here)" if alive
                       else f"heartbeat {age:.0f}s ago from host {live.get('host')}: stale")
    pid = int(live.get("pid", 0))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, f"pid {pid} is gone (the run died without stopping: a crash or SIGKILL)"
    except PermissionError:
        pass  # alive, another user's
    if age > stale:
        return False, f"pid {pid} exists but its heartbeat is {age:.0f}s old (hung, or the pid was reused)"
    return True, f"pid {pid}, heartbeat {age:.1f}s ago"
