"""Page-view counting on local[2]: localstate against Spark's own stateful streaming aggregation.

    python -m bench spark [--json] [--quick] [--events N] [--users K] [--warmup-events W] [--rounds R]
                          [--sources parquet,kafka] [--no-native] [--no-dataframe] [--no-batch-task]
                          [--no-peer] [--peer PATH]

Workload: N events, user ``user-%08d`` uniform over K users (numpy default_rng(seed), as
../shared/peers/spark_peer.py), ten micro-batches; correctness: every user's count read back from the
state equals numpy.bincount. Warm-up: W events (default a fifth of N) through the same path, untimed,
so that what is timed is the steady state a long-running query reaches (the JVM's JIT and Spark's
generated code warm).

Like with like (:mod:`bench.spark_sources`): Spark's ``groupBy(user_id).count()`` (RocksDB state
store, update mode, availableNow, a checkpointLocation) and the DataFrame step
(``localstate.spark.foreach_batch``, per-record and batch task) on the SAME streaming source, both
shuffling by key, in one SparkContext: Parquet files, and Kafka through localstate's own Python Data
Source (a Tansu broker the bench starts); on Kafka also the DataFrame step told the input is
partitioned by key already (no shuffle). Rows ``dataframe time: <phase>`` say where the DataFrame
step's time goes (Parquet, per-record task), ``dataframe batch task time[, Kafka]: <phase>`` the same
for the batch task. A query whose ``localstate-kafka`` reader process did not connect back within
Spark's 10 s (a loaded machine) is run again in a fresh directory; a note says so.

The native path (``localstate run``'s executors): the same job reading JSON lines already split by
key (input already partitioned by key: no shuffle), per-record and batch task. Timed: the run from the
first batch to the last commit, closing the instances kept open included. Rows ``time: <phase>``
split its wall clock into driver phases (planning, checkpoint saves), Spark's own overhead (job wall
time minus the busiest task) and the phases each task measures, on each batch's critical path.
``kept_open_pct``: tasks that found their partition's instance still open in their Python worker.

transformWithStateInPandas runs in the peer script (its own JVM, 100 smaller micro-batches); it needs
``protobuf`` in this interpreter: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import Report
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.runner import RunSummary, SparkJobRunner, spark_context
from localstate.runtime.spark.dataframe import TASK_PHASES as DATAFRAME_PHASES
from localstate.runtime.spark.dataframe import DataFrameBatch
from localstate.runtime.partition.sink import StreamSink


def _find_peer() -> Path:
    """``shared/peers/spark_peer.py`` in the nearest directory above this file that has it (``../shared``
    beside the repository; a git worktree sits one level deeper)."""
    here = Path(__file__).resolve()
    for directory in here.parents:
        candidate = directory / "shared" / "peers" / "spark_peer.py"
        if candidate.exists():
            return candidate
    return here.parents[2] / "shared" / "peers" / "spark_peer.py"


PEER = _find_peer()


def _write_events(directory: Path, events: int, users: int, seed: int, partitions: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    uid = rng.integers(0, users, events, dtype=np.int64)
    pid = rng.integers(0, 1000, events, dtype=np.int64)
    names = [f"user-{u:08d}" for u in range(users)]
    where = [partition_for(name, partitions) for name in names]
    files = [open(directory / f"{p}.jsonl", "w", encoding="utf-8") for p in range(partitions)]
    ts0 = 1_700_000_000
    for i, (u, page) in enumerate(zip(uid.tolist(), pid.tolist())):
        files[where[u]].write(f'{{"key":"{names[u]}","value":{{"page":"/page/{page:04d}"}},"ts":{ts0 + i}}}\n')
    for handle in files:
        handle.close()
    return np.bincount(uid, minlength=users)


TASKS = {"record": "localstate.demo:PageViewCounter", "batch": "localstate.demo:PageViewCounterBatch"}
"""The job's task: per record, or the batch task (the same counts, a batch of Arrow columns per call)."""


def _job(root: Path, data: Path, partitions: int, backend: str, task: str = "record") -> Path:
    path = root / "job.toml"
    path.write_text(f"""
[job]
name = "bench-page-views"
partitions = {partitions}
task = "{TASKS[task]}"
state_dir = "{root / 'state'}"

[changelogs.file]
segment_bytes = "1MB"    # a writer validates its last segment when it opens: keep that bounded

[inputs.page_views]
system = "jsonl"
path = "{data}"

[stores.counts]
engine = "kv"
backend = "{backend}"
key_serde = "string"
value_serde = "int"
cache_size = 100000
write_batch_size = 100000
""")
    return path


def _read_counts(job, users: int) -> np.ndarray:
    """Every user's count from the stores; a user found in another partition than its key's
    (:func:`partition_for`) counts as -1, so that wrong routing fails the correctness check."""
    counts = np.zeros(users, dtype=np.int64)
    changelogs = open_changelog_system(job)
    for partition in range(job.partitions):
        instance = TaskInstance(job, partition, changelogs, StreamSink(job))
        instance.open()
        with instance.stores["counts"].engine.all() as items:
            for user, count in items:
                counts[int(user[5:])] = count if partition_for(user, job.partitions) == partition else -1
        instance.close(commit=False)
    changelogs.close()
    return counts


_PHASES = {
    "plan": "driver: plan the batch (read checkpoints, input ends)",
    "spark": "Spark: schedule tasks, hand them to Python workers, (de)serialize plans and results",
    "checkpoint": "driver: save the checkpoints (fsync)",
    "wait": "task: wait for the partition lock (another worker kept it)",
    "open": "task: open + recover stores, or check the kept instance",
    "read": "task: read + decode input (JSON lines)",
    "process": "task: process() incl. store get/put (Python)",
    "changelog": "task: changelog append + fsync",
    "store_flush": "task: store flush (RocksDB write batch)",
    "outputs": "task: write outputs",
    "close": "task: close the instance (when not kept)",
    "release": "driver: close the kept instances at the end",
}


def _breakdown(report: Report, summaries: list[RunSummary], prefix: str = "time") -> None:
    """Rows ``<prefix>: <phase>``: where the wall time of the timed runs went, summed over the runs
    (tasks of a batch run in parallel; their phases are counted on each batch's critical path)."""
    seconds = sum(summary.seconds for summary in summaries)
    phases = {key: sum(summary.breakdown()[key] for summary in summaries) for key in _PHASES}
    for key, label in _PHASES.items():
        report.add(f"{prefix}: {label}", phase_s=phases[key], share_pct=100.0 * phases[key] / seconds)
    other = seconds - sum(phases.values())
    report.add(f"{prefix}: other (driver loop, progress)", phase_s=other, share_pct=100.0 * other / seconds)


def _peer(script: Path, events: int, users: int, seed: int, budget: float, total: float, variants: str = "a,b,c",
          files: int = 10, warmup: int | None = None) -> tuple[dict[str, float], str]:
    command = [sys.executable, str(script), "--events", str(events), "--users", str(users), "--seed", str(seed),
               "--variants", variants, "--variant-budget", str(budget), "--total-budget", str(total),
               "--driver-memory", "2g", "--files", str(files)]
    if warmup is not None:  # None: the peer's own default (4,000 events)
        command += ["--warmup-events", str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=total + 240)
    rates = {}
    for line in done.stdout.splitlines():
        match = re.match(r"^([a-z]_[a-z_]+(?:@N=\d+)?) (\d+) ([\d.]+)$", line.strip())
        if match:
            rates[match.group(1).split("@")[0]] = float(match.group(2))
    return rates, done.stdout[-2000:] if not rates else ""


def _has_protobuf() -> bool:
    """Whether ``google.protobuf`` is importable (find_spec of a submodule raises when its parent
    package ``google`` is missing altogether)."""
    try:
        return importlib.util.find_spec("google.protobuf") is not None
    except ModuleNotFoundError:
        return False


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc; NaN where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds so far of every live descendant of process ``pid`` (the JVM's: the
    PySpark daemon and its Python workers), by pid (/proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    cpu = {child: _process_cpu_seconds(child) for child in found}
    return {child: seconds for child, seconds in cpu.items() if seconds == seconds}  # NaN: gone meanwhile


def _localstate(root: Path, data: Path, partitions: int, backend: str, events: int, expected: np.ndarray,
                users: int, *, warmup: int, conf: dict[str, str] | None = None, task: str = "record",
                quick_jit: bool = False, measured: dict[str, float] | None = None) -> tuple[float, RunSummary, bool]:
    """One timed run on a fresh local[2] SparkContext (started and warmed up untimed, like the
    peer's): seconds, summary, and whether every count read back equals ``expected``. ``quick_jit``:
    the JVM options ``localstate run`` starts its own JVM with (see ``spark_context``: they apply
    only if this run starts the bench's JVM). ``measured`` gets ``jvm_cpu_s``: the CPU seconds of
    the (driver and executor) JVM during the timed run, taken from the Python workers' cores; and
    ``workers_cpu_s``: the CPU seconds of the Python workers (the JVM's descendants) during it, i.e.
    what the tasks' work cost on this machine."""
    root.mkdir()
    job = load_job_config(_job(root, data, partitions, backend, task))
    context = spark_context("local[2]", "bench-localstate", conf, quick_jit=quick_jit)
    try:
        # Warm-up (untimed): start the Python workers, import everything, warm the JIT; two batches.
        warm = root / "warm"
        (warm / "data").mkdir(parents=True)
        warm_counts = _write_events(warm / "data", warmup, min(users, warmup), 1, partitions)
        SparkJobRunner(load_job_config(_job(warm, warm / "data", partitions, backend, task)), context=context,
                       batch_size=max(1, -(-int(warm_counts.sum()) // (2 * partitions)) * 11 // 10),
                       progress=None).run()
        # Ten batches: the batch size is a tenth of the largest partition.
        owners = [partition_for(f"user-{u:08d}", partitions) for u in range(users)]
        batch_size = -(-int(np.bincount(owners, weights=expected, minlength=partitions).max()) // 10)
        jvm = int(context._jvm.java.lang.ProcessHandle.current().pid())
        jvm_cpu, workers_cpu = _process_cpu_seconds(jvm), _descendants_cpu_seconds(jvm)
        started = time.perf_counter()
        summary = SparkJobRunner(job, context=context, batch_size=batch_size, progress=None).run()
        seconds = time.perf_counter() - started
        if measured is not None:
            measured["jvm_cpu_s"] = _process_cpu_seconds(jvm) - jvm_cpu
            measured["workers_cpu_s"] = sum(seconds_ - workers_cpu.get(child, 0.0)
                                            for child, seconds_ in _descendants_cpu_seconds(jvm).items())
    finally:
        context.stop()
    correct = bool(np.array_equal(_read_counts(job, users), expected)) and summary.records_in == events
    return seconds, summary, correct


def _write_parquet_batches(directory: Path, events: int, users: int, seed: int, files: int) -> None:
    """The same events as :func:`_write_events` (same generator, same order), as ``files`` Parquet
    files of rows ``(user_id, page, ts)`` for a file streaming source, one micro-batch per file (as the
    peer reads them)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    uid = rng.integers(0, users, events, dtype=np.int64)
    pid = rng.integers(0, 1000, events, dtype=np.int64)
    directory.mkdir()
    bounds = np.linspace(0, events, files + 1).astype(int)
    for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        table = pa.table({"user_id": [f"user-{u:08d}" for u in uid[start:end].tolist()],
                          "page": [f"/page/{p:04d}" for p in pid[start:end].tolist()],
                          "ts": np.arange(start, end, dtype=np.int64) + 1_700_000_000})
        path = directory / f"part-{index:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source takes them by age


_DATAFRAME_PHASES = {
    "input": "task: receive the partition's rows (shuffle read, Arrow to Python) and sort them",
    "open": "task: open + recover the partition",
    "convert": "task: Arrow rows -> records (to_pylist)",
    "process": "task: process() incl. store get/put (the one feed loop)",
    "commit": "task: store flush, changelog fsync, outputs file, close",
}


def _dataframe_breakdown(report: Report, seconds: float, reports: list[DataFrameBatch],
                         prefix: str = "dataframe time") -> None:
    """Rows ``<prefix>: <phase>``: the timed DataFrame runs' wall clock split into the task
    phases (on each batch's critical path), the rest of each batch's Spark job (reading Parquet,
    routing rows to their partition, the shuffle, Arrow transfer to Python, checkpoint saves) and
    the streaming query around it (planning micro-batches, the query's own checkpoint, the sink)."""
    busy = sum(r.busiest_task for r in reports)
    summed = {phase: sum(r.task_seconds.get(phase, 0.0) for r in reports) for phase in DATAFRAME_PHASES}
    total = sum(summed.values())
    for phase, label in _DATAFRAME_PHASES.items():
        value = summed[phase] / total * busy if total else 0.0
        report.add(f"{prefix}: {label}", phase_s=value, share_pct=100.0 * value / seconds)
    plan = sum(r.plan_seconds for r in reports)
    report.add(f"{prefix}: Spark plans the batch's job (analysis, optimizer, physical plan)",
               phase_s=plan, share_pct=100.0 * plan / seconds)
    first = sum(r.first_task_seconds for r in reports)
    report.add(f"{prefix}: Spark job until the apply tasks start (read, route, shuffle write, scheduling)",
               phase_s=first, share_pct=100.0 * first / seconds)
    spark_job = sum(r.seconds for r in reports) - busy - first - plan
    report.add(f"{prefix}: rest of the Spark job (task hand-off, results, checkpoint saves)",
               phase_s=spark_job, share_pct=100.0 * spark_job / seconds)
    query = seconds - sum(r.seconds for r in reports)
    report.add(f"{prefix}: streaming query (micro-batch planning, query checkpoint, sink)", phase_s=query,
               share_pct=100.0 * query / seconds)


def _same_source(report: Report, root: Path, args: argparse.Namespace, events: int, expected: np.ndarray,
                 warmup: int, partitions: int) -> tuple[bool, dict[str, float]]:
    """The like-with-like rows (:mod:`bench.spark_sources`): Spark's own aggregation and the DataFrame
    step on the same streaming source, for each of ``args.sources``. Returns (all exact, events/s by
    row label, all rounds)."""
    from pyspark.sql import SparkSession

    from bench.spark_sources import (RETRIED, SPARK_STATE_CONF, KafkaSource, ParquetSource, compare_on_source,
                                     produce_events)

    tasks = ("record",) if args.no_batch_task else ("record", "batch")
    conf = {**SPARK_STATE_CONF, "spark.sql.shuffle.partitions": str(partitions)}
    context = spark_context("local[2]", "bench-same-source", conf)
    spark = SparkSession(context)
    for key, value in conf.items():  # SQL settings of a context that existed already
        spark.conf.set(key, value)
    warm_users = min(args.users, warmup)
    runs = []

    def make_job(directory: Path, task: str) -> Any:
        directory.mkdir(parents=True, exist_ok=True)
        return load_job_config(_job(directory, directory, partitions, args.backend, task))

    try:
        if "parquet" in args.sources:
            _write_parquet_batches(root / "parquet", events, args.users, args.seed, 10)
            _write_parquet_batches(root / "parquet-warm", warmup, warm_users, 1, 2)
            warm_expected = np.bincount(np.random.default_rng(1).integers(0, warm_users, warmup, dtype=np.int64),
                                        minlength=warm_users)
            runs += compare_on_source(spark, root / "runs", ParquetSource(root / "parquet"),
                                      ParquetSource(root / "parquet-warm"), expected, warm_expected, make_job,
                                      _read_counts, args.rounds, tasks)
        if "kafka" in args.sources:
            from localstate.changelog.kafka.devbroker import DevBroker

            broker = DevBroker(log_file=root / "tansu.log").start()
            try:
                servers = broker.bootstrap_servers
                produced = produce_events(servers, "events", events, args.users, args.seed, partitions)
                warm_produced = produce_events(servers, "warm", warmup, warm_users, 1, partitions)
                assert np.array_equal(produced, expected)
                runs += compare_on_source(spark, root / "runs", KafkaSource(servers, "events", -(-events // 10)),
                                          KafkaSource(servers, "warm", -(-warmup // 2)), expected, warm_produced,
                                          make_job, _read_counts, args.rounds, tasks, partitioned=True)
            finally:
                broker.stop()
    finally:
        spark.stop()
    rates: dict[str, list[float]] = {}
    for run in runs:
        rates.setdefault(run.label, []).append(events / run.seconds)
        row = {"events_per_s": events / run.seconds, "seconds": run.seconds, "correct": run.correct}
        if run.reports:
            applied = sum(len(r.applied) for r in run.reports)
            row.update(batches=len(run.reports),
                       kept_open_pct=100.0 * sum(len(r.reused) for r in run.reports) / max(1, applied))
        report.add(run.label, **row)
    mean = {label: len(values) / sum(1 / v for v in values) for label, values in rates.items()}
    for source in ("Parquet", "Kafka"):
        spark_label = f"{source}: Spark groupBy(key).count(), RocksDB state store"
        if spark_label not in mean:
            continue
        for label, rate in mean.items():
            if label.startswith(f"{source}: DataFrame step"):
                target = None
                if "partitioned" not in label:
                    target = ">= 1.5" if "batch task" in label else ">= 1.0"
                report.ratio(f"{label[len(source) + 2:]} / Spark groupBy(key).count() ({source})",
                             rate / mean[spark_label], target)
        for suffix in ("", ", input already partitioned by key (no shuffle)"):
            record, batch = (f"{source}: DataFrame step, {what}{suffix}" for what in ("per-record task", "batch task"))
            if record in mean and batch in mean:
                report.ratio(f"{source}{suffix}: DataFrame step, batch task / per-record task", mean[batch] / mean[record],
                             ">= 1")
    if RETRIED:
        report.notes.append("run again after a query could not start its source (a Python process Spark started "
                            "did not connect back within 10 s): " + "; ".join(RETRIED))
    for source, task, prefix in (("Parquet", "per-record task", "dataframe time"),
                                 ("Parquet", "batch task", "dataframe batch task time"),
                                 ("Kafka", "batch task", "dataframe batch task time, Kafka")):
        chosen = [run for run in runs if run.label == f"{source}: DataFrame step, {task}"]
        if chosen:
            _dataframe_breakdown(report, sum(run.seconds for run in chosen), [r for run in chosen for r in run.reports],
                                 prefix)
    return all(run.correct for run in runs), mean


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench spark")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="200k events, short peer budgets")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--warmup-events", type=int, default=None,
                        help="events of each untimed warm-up (default: a fifth of the events)")
    parser.add_argument("--backend", default="rocksdb", choices=["rocksdb", "lmdb", "memory"])
    parser.add_argument("--no-peer", action="store_true",
                        help="skip Spark's transformWithStateInPandas (the peer script)")
    parser.add_argument("--no-native", action="store_true",
                        help="skip the native path (input already partitioned by key: JSON lines split by key)")
    parser.add_argument("--no-dataframe", action="store_true",
                        help="skip the same-source rows (Spark's aggregation and the DataFrame step)")
    parser.add_argument("--sources", default="parquet,kafka",
                        help="the same-source rows' streaming sources: parquet, kafka (default both)")
    parser.add_argument("--no-batch-task", action="store_true",
                        help="skip the batch task's runs (PageViewCounterBatch on every path)")
    parser.add_argument("--peer", type=Path, default=PEER, help="the peer script (default: ../shared/peers)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of each measurement, alternating; the ratios use all of them")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.sources = [name.strip() for name in args.sources.split(",") if name.strip()]
    if set(args.sources) - {"parquet", "kafka"}:
        parser.error("--sources takes parquet and/or kafka")
    events = args.events or (200_000 if args.quick else 1_000_000)
    warmup = max(2, args.warmup_events if args.warmup_events is not None else events // 5)
    partitions = 2
    peer = not args.no_peer and args.peer.exists()
    report = Report("spark", {"events": events, "users": args.users, "master": "local[2]", "partitions": partitions,
                              "backend": args.backend, "warmup_events": warmup})
    correct = True
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        root = Path(tmp)
        data = root / "data"
        data.mkdir()
        expected = _write_events(data, events, args.users, args.seed, partitions)
        budget = 20.0 if args.quick else 40.0
        same: dict[str, float] = {}
        if not args.no_dataframe:
            ok, same = _same_source(report, root, args, events, expected, warmup, partitions)
            correct = correct and ok
        rate = batch_rate = None
        if not args.no_native:
            cpu: dict[str, dict[str, float]] = {}  # each native run's CPU seconds (jvm_cpu_s, workers_cpu_s)
            runs, batch_runs = [], []
            for round_index in range(args.rounds):
                # The default JIT, not localstate run's quick one: this process's one JVM also runs the
                # same-source rows, where the JVM does the heavy work (the native figure is conservative).
                runs.append(_localstate(root / f"run{round_index + 1}", data, partitions, args.backend, events,
                                        expected, args.users, warmup=warmup,
                                        measured=cpu.setdefault(f"run{round_index + 1}", {})))
                if not args.no_batch_task:
                    batch_runs.append(_localstate(root / f"batch{round_index + 1}", data, partitions, args.backend,
                                                  events, expected, args.users, warmup=warmup, task="batch",
                                                  measured=cpu.setdefault(f"batch{round_index + 1}", {})))
            correct = correct and all(ok for _, _, ok in runs + batch_runs)
            native = "native path, input already partitioned by key (JSON lines split by key)"
            for label, task_runs, prefix in ((f"{native}, per-record task", runs, "run"),
                                             (f"{native}, batch task", batch_runs, "batch")):
                for index, (seconds, summary, ok) in enumerate(task_runs, 1):
                    tasks = sum(b.tasks for b in summary.batches)
                    report.add(f"{label} (kv/{args.backend}), run {index}", events_per_s=events / seconds,
                               seconds=seconds, batches=len(summary.batches), correct=ok,
                               kept_open_pct=100.0 * sum(b.reused for b in summary.batches) / max(1, tasks),
                               **cpu.get(f"{prefix}{index}", {}))
            rate = len(runs) * events / sum(seconds for seconds, _, _ in runs)
            if batch_runs:
                batch_rate = len(batch_runs) * events / sum(seconds for seconds, _, _ in batch_runs)
                report.ratio("native path: batch task / per-record task", batch_rate / rate, ">= 2")
            parquet_spark = same.get("Parquet: Spark groupBy(key).count(), RocksDB state store")
            if parquet_spark:
                report.ratio("native path, per-record task / Spark groupBy(key).count() on Parquet (input not "
                             "partitioned by key)", rate / parquet_spark, ">= 1.5")
                if batch_rate is not None:
                    report.ratio("native path, batch task / Spark groupBy(key).count() on Parquet (input not "
                                 "partitioned by key)", batch_rate / parquet_spark, ">= 3")
            _breakdown(report, [summary for _, summary, _ in runs])
            if batch_runs:
                _breakdown(report, [summary for _, summary, _ in batch_runs], prefix="batch task time")
        if peer:
            # transformWithStateInPandas (~2k events/s) on 100 smaller micro-batches so that several
            # complete within its time budget (its rate is then measured on those batches), with a
            # budget long enough for a loaded machine to finish some micro-batches; the peer adds
            # applyInPandasWithState if it fails.
            slow_budget = 4 * budget if args.quick else 6 * budget
            rates, failure = _peer(args.peer, events, args.users, args.seed, slow_budget, slow_budget + 180, "b", 100)
            names = {"b_tws_pandas": "Spark transformWithStateInPandas (peer script)",
                     "c_apply_pandas": "Spark applyInPandasWithState (peer script)"}
            for key, label in names.items():
                if key in rates:
                    report.add(label, events_per_s=rates[key])
            if "b_tws_pandas" in rates and rate is not None:
                report.ratio("native path / transformWithStateInPandas", rate / rates["b_tws_pandas"], ">= 30")
            parquet_record = same.get("Parquet: DataFrame step, per-record task")
            if "b_tws_pandas" in rates and parquet_record:
                report.ratio("DataFrame step, per-record task (Parquet) / transformWithStateInPandas",
                             parquet_record / rates["b_tws_pandas"], ">= 20")
            if failure:
                report.notes.append("peer produced no figures: " + failure.replace("\n", " | ")[-500:])
            if "b_tws_pandas" not in rates and not _has_protobuf():
                report.notes.append("transformWithStateInPandas needs protobuf in this Python: "
                                    "pip install -e '.[bench]'")
            report.notes.append("transformWithStateInPandas runs in the peer script's own JVM with 100 micro-batches "
                                "and, when slower than its budget, is rated on the batches it finished; "
                                "applyInPandasWithState runs only if it fails")
        report.notes.append("same-source rows: Spark's aggregation and the DataFrame step in one SparkContext "
                            "(local[2]), on the same stream; rates with several rounds are over all of them")
    report.emit(args.json)
    return 0 if correct else 1
