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

The figures come from the driver's :class:`~localstate.runtime.driver.plan.BatchResult` and the batch's
plans; the per-store ones are estimates read on the driver host (see :class:`StoreStats`).

These files are the operator's, not the job's: writing them never stops a run (a failure is one
WARNING, repeated only once it was fixed and happens again), and they obey the state directory's
containment rule: nothing is written through a symlink, nothing is created outside the state
directory, nothing localstate did not write is replaced or deleted. They are read back only
through :mod:`localstate.runtime.driver.operating`, as hostile input.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig
from localstate.core.fsutil import ensure_dir, open_nofollow, os_error, write_atomic
from localstate.runtime.layout import job_directory, open_changelog_system, store_directory
from localstate.core.stream import PendingTail
from localstate.errors import ConfigError, LocalStateError, UnsafePathError
from localstate.runtime.driver import operating, views
from localstate.runtime.driver.views import dir_size
from localstate.runtime.driver.plan import DRIVER_PHASES, TASK_PHASES, BatchResult, PartitionPlan
from localstate.core.changelog import LocalStreams
from localstate.runtime.driver.metrics import JobMetrics

__all__ = ["ProgressReport", "ProgressLog", "Heartbeat", "ProgressObserver", "StoreStats", "BatchObserver",
           "progress_directory", "attempt_reason", "describe_reason", "REASON_FIELDS", "read_live",
           "read_last_progress", "PROGRESS_FILE", "LIVE_FILE", "HEARTBEAT_INTERVAL", "HEARTBEAT_STALE",
           "COMMIT_PHASES", "OperatorWarnings"]

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
    """``<state_dir>/<job>/progress`` (neither created nor checked here: its writers and readers refuse
    a symlink on the way when they use it; the job's name is validated with its config)."""
    return Path(os.path.abspath(job.state_dir)) / job.name / "progress"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# -- per-store estimates ----------------------------------------------------------------------------------

def _estimate_keys(directory: Path, backend: str | None) -> int | None:
    """The kv backend's own key estimate of a local store partition, read-only: LMDB's entry count,
    RocksDB's ``rocksdb.estimate-num-keys`` (on a private hard-linked snapshot, as ``inspect`` opens
    it); None for anything else."""
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
        commits = getattr(result, "commit_stats", None)
        if commits is not None:  # continuous: the period's commits, each measured by its task
            commit_ms = round(commits.commit.mean() or 0.0, 3)
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
            **({"commits": commits.to_progress()} if commits is not None else {}),
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

class OperatorWarnings:
    """Failures to write the operating files, logged once each: a WARNING the first time a message is
    seen, DEBUG while it repeats (a heartbeat every 5 s must not fill the log), again a WARNING if it
    comes back after a write succeeded."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def failed(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, LocalStateError):
            text = f"{what}: {exc}"
        else:  # a bug of localstate's: say what, without a traceback in the job's log
            text = f"{what}: {type(exc).__name__}: {exc}"
        with self._lock:
            first = text not in self._seen
            self._seen.add(text)
        log.log(logging.WARNING if first else logging.DEBUG, "%s (the job runs on; this is not repeated)", text)
        log.debug("%s", what, exc_info=exc)

    def succeeded(self) -> None:
        with self._lock:
            self._seen.clear()


def _regular(path: Path, fd: int) -> int:
    """``fd`` (open on ``path``) if it is a regular file, else close it and refuse (UnsafePathError)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"refusing to use {path}: it is not a regular file", path=str(path),
                              hint="remove or rename it: localstate writes its progress there")
    return fd


class ProgressLog:
    """Appends one JSON object per line to ``<directory>/progress.jsonl``, rotating by size: when the
    next line would make the file larger than ``max_bytes``, ``.N`` becomes ``.N+1`` (``.keep`` is
    dropped) and the file becomes ``.1``. Nothing grows forever: at most ``keep + 1`` files.

    ``directory`` is created below ``anchor`` (the state directory) without following a symlink;
    each file is opened with ``O_NOFOLLOW`` and must be a regular file; a rotation only renames and
    deletes regular files (a symlink or directory in the way is refused, UnsafePathError, and nothing
    is appended: no file grows past its bound). A line is always a line of its own: one appended after
    a torn last line (a crash mid-append) starts with a newline. OS errors are ResourceErrors."""

    def __init__(self, directory: Path, *, max_bytes: int = 10 * 1024 * 1024, keep: int = 5,
                 anchor: Path | None = None) -> None:
        self.directory = directory
        self.anchor = directory if anchor is None else anchor
        self.path = directory / PROGRESS_FILE
        self.max_bytes = max(1, int(max_bytes))
        self.keep = max(0, int(keep))
        self._lock = threading.Lock()

    def append(self, progress: Mapping[str, Any]) -> None:
        line = (json.dumps(progress, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                ensure_dir(self.anchor, self.directory)
                fd = self._open()
                try:
                    size = os.fstat(fd).st_size
                    if size and size + len(line) > self.max_bytes:
                        os.close(fd)
                        fd = -1
                        self._rotate()
                        fd = self._open()
                        size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        line = b"\n" + line
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    if fd >= 0:
                        os.close(fd)
            except OSError as exc:
                raise os_error(exc, "append progress to", self.path) from exc

    def _open(self) -> int:
        fd = open_nofollow(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK)
        return _regular(self.path, fd)

    def _rotate(self) -> None:
        names = [self.path] + [self.directory / f"{PROGRESS_FILE}.{index}" for index in range(1, self.keep + 1)]
        for path in names:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                raise UnsafePathError(f"refusing to rotate the progress files: {path} is {kind}",
                                      path=str(path), hint="remove or rename it: localstate rotates its progress "
                                                           "files through that name")
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        names[-1].unlink(missing_ok=True)
        for index in range(self.keep - 1, 0, -1):
            if os.path.lexists(names[index]):
                os.replace(names[index], names[index + 1])
        os.replace(self.path, names[1])

    def files(self) -> list[Path]:
        """The progress files that exist, newest first (``progress.jsonl``, ``.1``, ...)."""
        names = [self.path] + [self.directory / f"{PROGRESS_FILE}.{index}" for index in range(1, self.keep + 1)]
        return [path for path in names if os.path.lexists(path)]


class Heartbeat:
    """``live.json``: who runs the job (pid, host, run) and when it last showed signs of life.

    Written atomically below ``anchor`` (the state directory), never through or over a symlink
    (UnsafePathError) and never raising from :meth:`start`, the background beats or :meth:`stop`:
    a failure is reported once through ``warnings`` and the run goes on."""

    def __init__(self, directory: Path, run_id: str, *, interval: float = HEARTBEAT_INTERVAL,
                 anchor: Path | None = None, warnings: OperatorWarnings | None = None) -> None:
        self.path = directory / LIVE_FILE
        self.directory = directory
        self.anchor = directory if anchor is None else anchor
        self.run_id = run_id
        self.interval = interval
        self.started = time.time()
        self.batch: int | None = None
        self.warnings = warnings or OperatorWarnings()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _write(self, state: str) -> None:
        body = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id, "started": self.started,
                "heartbeat": time.time(), "state": state, "batch": self.batch,
                "heartbeat_interval": self.interval}
        with self._lock:
            try:
                ensure_dir(self.anchor, self.directory)
                if os.path.islink(self.path):
                    raise UnsafePathError(f"refusing to replace {self.path}: it is a symlink", path=str(self.path),
                                          hint="remove it: localstate writes the job's heartbeat there")
                write_atomic(self.path, json.dumps(body, sort_keys=True).encode(), durable=False)
            except OSError as exc:
                raise os_error(exc, "write the heartbeat", self.path) from exc

    def _try(self, state: str) -> None:
        try:
            self._write(state)
        except Exception as exc:  # noqa: BLE001 - the heartbeat is for operators: it never stops the run
            self.warnings.failed("cannot write the heartbeat", exc)
        else:
            self.warnings.succeeded()

    def beat(self, batch: int | None = None) -> None:
        if batch is not None:
            self.batch = batch
        self._try("running")

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="localstate-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._try("running")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._try("stopped")


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
        self.warnings = OperatorWarnings()
        self.log = ProgressLog(self.directory, max_bytes=max_bytes, keep=keep, anchor=job.state_dir)
        self.run_id = run_id
        self.inputs = inputs
        self.positions = positions
        self.stores = StoreStats(job, keys_interval=keys_interval)
        self.sinks = list(sinks)
        self.heartbeat = (Heartbeat(self.directory, run_id if isinstance(run_id, str) else "", anchor=job.state_dir)
                          if heartbeat else None)
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
            metrics = JobMetrics(job.name)
            metrics.seed(read_last_progress(job).value)  # the last batch of the run before, if it was sound
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
    """the :class:`~localstate.runtime.driver.metrics.JobMetrics` :meth:`watch` started, if any"""

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
        except Exception as exc:  # noqa: BLE001 - the job's figures must not stop the job
            self.warnings.failed("progress could not be recorded", exc)

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
        try:
            self.log.append(progress)
        except Exception as exc:  # noqa: BLE001 - the file is the operator's: the heartbeat and metrics go on
            self.warnings.failed("progress could not be recorded", exc)
        else:
            self.warnings.succeeded()
        if log.isEnabledFor(logging.INFO):
            log.info("%s", json.dumps(progress, sort_keys=True, separators=(",", ":")))
        if self.heartbeat is not None:
            self.heartbeat.run_id = run_id
            self.heartbeat.beat(result.batch)
        for sink in self.sinks:
            sink(progress)
        return progress


# -- reading, for `localstate status` and the metrics (read-only, as hostile input: runtime/operating.py) -------

def read_live(job: JobConfig) -> operating.Found:
    """The job's ``live.json`` (:func:`localstate.runtime.driver.operating.read_live`)."""
    return operating.read_live(progress_directory(job) / LIVE_FILE, job.state_dir)


def read_last_progress(job: JobConfig, keep: int = 5) -> operating.Found:
    """The job's newest sound progress object (:func:`localstate.runtime.driver.operating.read_last_progress`)."""
    return operating.read_last_progress(ProgressLog(progress_directory(job), keep=keep).files(), job.state_dir)
