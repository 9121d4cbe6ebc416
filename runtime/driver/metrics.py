"""A Prometheus endpoint on the driver (``[job] metrics_port``): the figures of each batch's progress
object (:mod:`localstate.runtime.driver.progress`) as counters, gauges and histograms, in a registry of
their own (never ``prometheus_client``'s global one, so that several jobs or tests can run in one
process), served over HTTP on ``metrics_host`` (default ``127.0.0.1``).

Every metric carries the label ``job``; :data:`METRICS` lists them (docs/operations.md too)."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from localstate.core.commit_stats import BOUNDS_MS, CommitStats
from localstate.core.commit_stats import Histogram as Buckets
from localstate.runtime.driver.operating import progress_time

__all__ = ["JobMetrics", "METRICS", "DEFAULT_HOST"]

log = logging.getLogger("localstate.metrics")

DEFAULT_HOST = "127.0.0.1"

#: name -> (type, extra labels, help)
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "localstate_batches_total": ("counter", (), "micro-batches committed"),
    "localstate_rows_in_total": ("counter", ("input",), "input records processed, per input"),
    "localstate_rows_out_total": ("counter", (), "records sent to outputs"),
    "localstate_rows_skipped_total": ("counter", (), "bad input records skipped (on_error = skip)"),
    "localstate_rows_dead_lettered_total": ("counter", (), "bad input records sent to a dead-letter output"),
    "localstate_late_records_total": ("counter", ("store",), "records a window store dropped as late (its windows "
                                      "were closed), per window store"),
    "localstate_misrouted_records_total": ("counter", ("input",), "keyed records found in another partition than "
                                           "their key's, per input (on_misrouted)"),
    "localstate_failed_attempts_total": ("counter", (), "task attempts that failed and were retried by Spark"),
    "localstate_restored_records_total": ("counter", (), "changelog records replayed to restore stores"),
    "localstate_input_lag_records": ("gauge", ("input", "partition"),
                                     "records of the input partition not processed yet (after the last batch)"),
    "localstate_input_unterminated_bytes": ("gauge", ("input", "partition"),
                                            "bytes of an unterminated last record (an append in progress)"),
    "localstate_lag_records": ("gauge", (), "records not processed yet, all inputs (after the last batch)"),
    "localstate_last_batch_duration_seconds": ("gauge", (), "wall time of the last batch"),
    "localstate_last_batch_timestamp_seconds": ("gauge", (), "when the last batch was committed (epoch seconds)"),
    "localstate_last_batch_id": ("gauge", (), "id of the last committed batch"),
    "localstate_store_bytes": ("gauge", ("store",), "bytes of the store's local directories on the driver host"),
    "localstate_store_keys": ("gauge", ("store",), "the kv backend's key estimate (RocksDB, LMDB)"),
    "localstate_changelog_bytes": ("gauge", ("store",), "bytes of the store's changelog segments (local systems)"),
    "localstate_warm_tasks": ("gauge", (), "tasks of the last batch that found their state warm"),
    "localstate_cold_tasks": ("gauge", (), "tasks of the last batch that restored state (cold)"),
    "localstate_batch_duration_seconds": ("histogram", (), "wall time of a batch"),
    "localstate_commits_total": ("counter", (), "commits: one per micro-batch; in continuous mode, one per "
                                 "partition commit (each reported at the partition's next commit)"),
    "localstate_commit_duration_seconds": ("histogram", (), "a commit's duration. Micro-batch: the batch's "
                                           "checkpoint save plus the mean task's changelog, store flush and outputs; "
                                           "continuous: each partition commit, from its start to its output "
                                           "transactions committed"),
    "localstate_record_latency_seconds": ("histogram", (), "continuous mode, per commit carrying input records: "
                                          "how long its oldest record waited inside localstate, from the start of "
                                          "the read that returned it to the end of the commit that made its "
                                          "outputs visible"),
    "localstate_restore_duration_seconds": ("histogram", (), "time tasks spent restoring stores in a batch"),
}

_MS_HISTOGRAMS = ("localstate_commit_duration_seconds", "localstate_record_latency_seconds")
"""histograms on the buckets of :data:`~localstate.core.commit_stats.BOUNDS_MS`, fed whole periods
at a time by continuous runs (:class:`_MsHistogram`)"""

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def _mapping(data: Any, name: str) -> Mapping[str, Any]:
    value = data.get(name) if isinstance(data, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 63


def _count(data: Any, name: str) -> int | None:
    value = data.get(name) if isinstance(data, Mapping) else None
    return value if _is_count(value) else None


def _seconds(data: Any, name: str) -> float | None:
    """A finite, non-negative number (milliseconds in a progress object), else None."""
    value = data.get(name) if isinstance(data, Mapping) else None
    return float(value) if type(value) in (int, float) and math.isfinite(value) and value >= 0 else None
class _WithoutCreated:
    """A registry's samples less the ``*_created`` series (each counter's and histogram's creation
    time, which dashboards do not expect), for this registry alone: prometheus_client's
    ``disable_created_metrics()`` would change every registry of the process, a user's own too."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Any:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _MsHistogram:
    """A Prometheus histogram on :data:`BOUNDS_MS` (in seconds) that takes a whole
    :class:`~localstate.core.commit_stats.Histogram` of counts at once (prometheus_client's
    Histogram observes one value at a time); one job, cumulative since it was made."""

    def __init__(self, name: str, help_text: str, job: str) -> None:
        self.name, self.help, self.job = name, help_text, job
        self.buckets = Buckets()
        self._lock = threading.Lock()  # a scrape reads while a progress report adds

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.buckets = self.buckets.observe(seconds * 1000.0)

    def add(self, counted: Buckets) -> None:
        with self._lock:
            self.buckets = self.buckets.plus(counted)

    def collect(self) -> Any:
        with self._lock:
            buckets = self.buckets
        family = HistogramMetricFamily(self.name, self.help, labels=["job"])
        cumulative, total = [], 0
        for bound, n in zip((*BOUNDS_MS, math.inf), buckets.counts):
            total += n
            cumulative.append((floatToGoString(bound / 1000.0), total))
        family.add_metric([self.job], cumulative, sum_value=buckets.sum_ms / 1000.0)
        yield family

    def describe(self) -> Any:
        yield HistogramMetricFamily(self.name, self.help, labels=["job"])


class JobMetrics:
    """The metrics of one job in a dedicated ``CollectorRegistry``; :meth:`observe` takes a progress
    object; :meth:`serve` starts the HTTP endpoint, :meth:`close` stops it."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, Any] = {}
        for name, (kind, labels, help_text) in METRICS.items():
            names = ("job", *labels)
            if kind == "counter":
                # prometheus_client appends _total itself
                self.metrics[name] = Counter(name[: -len("_total")], help_text, names, registry=self.registry)
            elif kind == "gauge":
                self.metrics[name] = Gauge(name, help_text, names, registry=self.registry)
            elif name in _MS_HISTOGRAMS:
                self.metrics[name] = _MsHistogram(name, help_text, job)
                self.registry.register(self.metrics[name])
            else:
                self.metrics[name] = Histogram(name, help_text, names, buckets=_BUCKETS, registry=self.registry)
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.port: int | None = None

    def _m(self, name: str, **labels: Any) -> Any:
        return self.metrics[name].labels(job=self.job, **{k: str(v) for k, v in labels.items()})

    def observe(self, progress: Mapping[str, Any]) -> None:
        """Add one batch's progress object. Each figure is taken only if it has the type and range it
        should (a count, a finite number): a wrong one counts as absent, never as an error."""
        self._m("localstate_batches_total").inc()
        counted = 0
        for name, entry in _mapping(progress, "inputs").items():
            rows = _count(entry, "rows")
            if rows is not None:
                self._m("localstate_rows_in_total", input=name).inc(rows)
                counted += rows
            for partition, lag in _mapping(entry, "lag_by_partition").items():
                if _is_count(lag):
                    self._m("localstate_input_lag_records", input=name, partition=partition).set(lag)
            for partition, pending in _mapping(entry, "pending_bytes_by_partition").items():
                if _is_count(pending):
                    self._m("localstate_input_unterminated_bytes", input=name, partition=partition).set(pending)
        if not counted and _count(progress, "rows_in"):  # rows per input unknown: all under input=""
            self._m("localstate_rows_in_total", input="").inc(_count(progress, "rows_in"))
        for metric, name in (("localstate_rows_out_total", "rows_out"), ("localstate_rows_skipped_total", "skipped"),
                             ("localstate_rows_dead_lettered_total", "dead_lettered"),
                             ("localstate_failed_attempts_total", "failed_attempts")):
            self._m(metric).inc(_count(progress, name) or 0)
        for store, n in _mapping(progress, "late_records").items():
            if _is_count(n):
                self._m("localstate_late_records_total", store=store).inc(n)
        for name, n in _mapping(progress, "misrouted").items():
            if _is_count(n):
                self._m("localstate_misrouted_records_total", input=name).inc(n)
        state = _mapping(progress, "state")
        restore = _mapping(state, "restore")
        self._m("localstate_restored_records_total").inc(_count(restore, "records") or 0)
        self.seed(progress)
        self._m("localstate_last_batch_id").set(_count(progress, "batch") or 0)
        for store, figures in _mapping(state, "stores").items():
            for metric, name in (("localstate_store_bytes", "bytes"), ("localstate_store_keys", "keys_estimate"),
                                 ("localstate_changelog_bytes", "changelog_bytes")):
                value = _count(figures, name)
                if value is not None:
                    self._m(metric, store=store).set(value)
        self._m("localstate_warm_tasks").set(_count(state, "warm_tasks") or 0)
        self._m("localstate_cold_tasks").set(_count(state, "cold_tasks") or 0)
        self._m("localstate_batch_duration_seconds").observe((_seconds(progress, "duration_ms") or 0.0) / 1000.0)
        commits = CommitStats.from_progress(progress.get("commits") if isinstance(progress, Mapping) else None)
        if commits is not None:  # continuous: every commit of the period, each measured by its task
            self.metrics["localstate_commit_duration_seconds"].add(commits.commit)
            self.metrics["localstate_record_latency_seconds"].add(commits.latency)
            self._m("localstate_commits_total").inc(commits.commits)
        else:  # a micro-batch: one commit
            self.metrics["localstate_commit_duration_seconds"].observe((_seconds(state, "commit_ms") or 0.0) / 1000.0)
            self._m("localstate_commits_total").inc()
        self._m("localstate_restore_duration_seconds").observe((_seconds(restore, "ms") or 0.0) / 1000.0)

    def seed(self, progress: Mapping[str, Any] | None) -> None:
        """Set the last-batch gauges (lag, duration, commit time) from ``progress``: each batch's
        object, and, when a run starts, the last sound one of the run before
        (:func:`~localstate.runtime.driver.progress.read_last_progress`), so that an idle job that was
        restarted still says when it last committed a batch. Counters start from zero in each run
        (Prometheus counts a restart as a counter reset)."""
        if not isinstance(progress, Mapping):
            return
        lag = progress.get("lag")
        if type(lag) is int:
            self._m("localstate_lag_records").set(lag)
        duration = _seconds(progress, "duration_ms")
        if duration is not None:
            self._m("localstate_last_batch_duration_seconds").set(duration / 1000.0)
        stamp = progress_time(progress)
        if stamp is not None:
            self._m("localstate_last_batch_timestamp_seconds").set(stamp)

    __call__ = observe

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Serve ``/metrics`` on ``host:port`` (port 0: a free one) in a daemon thread; returns the port."""
        started = start_http_server(port, addr=host, registry=_WithoutCreated(self.registry))
        if isinstance(started, tuple):  # prometheus_client >= 0.20 returns (server, thread)
            self.server, self.thread = started
            self.port = int(self.server.server_address[1])
        else:
            self.port = port
        log.info("metrics of job %r on http://%s:%d/metrics", self.job, host, self.port)
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None

    def __enter__(self) -> "JobMetrics":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
