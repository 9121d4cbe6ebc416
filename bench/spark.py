"""Page-view counting on local[2]: localstate's Spark runtime vs Spark's own stateful streaming
(native groupBy().count(), transformWithStateInPandas, applyInPandasWithState; measured by
../shared/peers/spark_peer.py in a subprocess of the same run, on the same workload shape).

    python -m bench spark [--json] [--quick] [--events N] [--users K] [--warmup-events W] [--rounds R]
                          [--no-peer] [--no-dataframe] [--no-batch-task] [--peer PATH]

Workload: N events, user ``user-%08d`` uniform over K users (numpy default_rng(seed), as the
peer), written untimed as pre-partitioned JSON lines; one micro-batch per N/10 events. Timed: the
run from the first batch to the last commit, closing the instances kept open included (SparkContext
start and a warm-up excluded, as the peer does). Warm-up: W events (default a fifth of N) in two
micro-batches through the same path, untimed, so that what is timed is the steady state a long-running
query reaches (the JVM's JIT and Spark's generated code warm); the same W for both localstate paths and
for Spark's native aggregation (the pandas variants keep the peer's 4,000: at ~1k events/s a larger
warm-up would not fit their budget). localstate runs before and after Spark's native aggregation
(the machine is shared: the ratios use every run); ``--rounds R`` repeats the pair (native path,
DataFrame path) R times, alternating, and the DataFrame/native ratio uses all of them. Correctness:
every user's count read back from the stores equals numpy.bincount.

The DataFrame entry point (``localstate.spark.foreach_batch``) runs the same job on the same
events, read by a Parquet file streaming source with one file per micro-batch (ten, as the peer
reads them), outputs to a ``noop`` sink; timed from ``start()`` to the query's end and the kept
instances closed (``release``), after an untimed warm-up query. ``kept_open_pct``: partitions whose
instance was still open in their Python worker. Rows ``dataframe time: <phase>`` say where its time goes.

Where the time goes: rows ``time: <phase>`` split the timed run's wall clock into driver phases
(planning, checkpoint saves), Spark's own overhead (job wall time minus the busiest task: scheduling,
Python worker hand-off, plan/result serialization) and the phases each task measures (lock wait,
open/recover, input read+decode, process() with its store calls, changelog append+fsync, store
flush, outputs, close), counted on each batch's critical path. ``kept_open_pct``: tasks that found
their partition's instance still open in their Python worker (no reopen, warm caches).

transformWithStateInPandas needs ``protobuf`` in the interpreter running the Spark workers (this
one): ``pip install -e '.[bench]'``.
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

import numpy as np

from bench.report import Report
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.runner import RunSummary, SparkJobRunner, spark_context
from localstate.runtime.spark.dataframe import TASK_PHASES as DATAFRAME_PHASES
from localstate.runtime.spark.dataframe import DataFrameBatch, foreach_batch, release
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


def _dataframe_query(spark, job, source: Path, checkpoint: Path, reports: list[DataFrameBatch]) -> None:
    """The DataFrame path: a file streaming query (one Parquet file per micro-batch), each micro-batch
    through foreach_batch; outputs consumed by a noop sink (as the peer's)."""
    events = spark.readStream.schema("user_id string, page string, ts long").option("maxFilesPerTrigger", 1) \
        .parquet(str(source))

    def sink(outputs, batch_id: int) -> None:
        outputs.write.format("noop").mode("overwrite").save()

    handler = foreach_batch(job, key="user_id", order_by="ts", sink=sink, progress=reports.append)
    query = events.writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint)) \
        .trigger(availableNow=True).start()
    query.awaitTermination()


def _localstate_dataframe(root: Path, source: Path, partitions: int, backend: str, events: int,
                          expected: np.ndarray, users: int, *, warmup: int,
                          task: str = "record") -> tuple[float, list[DataFrameBatch], bool]:
    """One timed run of the DataFrame path on a fresh local[2] SparkContext (started and warmed up
    untimed): seconds, the batches' reports, and whether every count read back equals ``expected``."""
    from pyspark.sql import SparkSession

    root.mkdir()
    job = load_job_config(_job(root, source, partitions, backend, task))  # its [inputs] are not used
    context = spark_context("local[2]", "bench-localstate-dataframe")
    try:
        spark = SparkSession(context)
        warm = root / "warm"
        warm.mkdir()
        _write_parquet_batches(warm / "data", warmup, min(users, warmup), 1, 2)  # two micro-batches
        warm_job = load_job_config(_job(warm, warm / "data", partitions, backend, task))
        _dataframe_query(spark, warm_job, warm / "data", warm / "query", [])
        release(warm_job)
        reports: list[DataFrameBatch] = []
        started = time.perf_counter()
        _dataframe_query(spark, job, source, root / "query", reports)
        release(job)  # the instances the workers kept open, as the native run closes its own
        seconds = time.perf_counter() - started
    finally:
        context.stop()
    records = sum(report.records for report in reports)
    correct = bool(np.array_equal(_read_counts(job, users), expected)) and records == events
    return seconds, reports, correct


_DATAFRAME_PHASES = {
    "input": "task: receive the partition's rows (shuffle read, Arrow to Python) and sort them",
    "open": "task: open + recover the partition",
    "convert": "task: Arrow rows -> records (to_pylist)",
    "process": "task: process() incl. store get/put (the one feed loop)",
    "commit": "task: store flush, changelog fsync, outputs file, close",
}


def _dataframe_breakdown(report: Report, seconds: float, reports: list[DataFrameBatch]) -> None:
    """Rows ``dataframe time: <phase>``: the timed DataFrame run's wall clock split into the task
    phases (on each batch's critical path), the rest of each batch's Spark job (reading Parquet,
    routing rows to their partition, the shuffle, Arrow transfer to Python, checkpoint saves) and
    the streaming query around it (planning micro-batches, the query's own checkpoint, the sink)."""
    busy = sum(r.busiest_task for r in reports)
    summed = {phase: sum(r.task_seconds.get(phase, 0.0) for r in reports) for phase in DATAFRAME_PHASES}
    total = sum(summed.values())
    for phase, label in _DATAFRAME_PHASES.items():
        value = summed[phase] / total * busy if total else 0.0
        report.add(f"dataframe time: {label}", phase_s=value, share_pct=100.0 * value / seconds)
    plan = sum(r.plan_seconds for r in reports)
    report.add("dataframe time: Spark plans the batch's job (analysis, optimizer, physical plan)",
               phase_s=plan, share_pct=100.0 * plan / seconds)
    first = sum(r.first_task_seconds for r in reports)
    report.add("dataframe time: Spark job until the apply tasks start (read, route, shuffle write, scheduling)",
               phase_s=first, share_pct=100.0 * first / seconds)
    spark_job = sum(r.seconds for r in reports) - busy - first - plan
    report.add("dataframe time: rest of the Spark job (task hand-off, results, checkpoint saves)",
               phase_s=spark_job, share_pct=100.0 * spark_job / seconds)
    query = seconds - sum(r.seconds for r in reports)
    report.add("dataframe time: streaming query (micro-batch planning, query checkpoint, sink)", phase_s=query,
               share_pct=100.0 * query / seconds)


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
    parser.add_argument("--no-peer", action="store_true", help="skip Spark's own stateful streaming")
    parser.add_argument("--no-dataframe", action="store_true", help="skip the DataFrame entry point")
    parser.add_argument("--no-batch-task", action="store_true",
                        help="skip the batch task's runs (PageViewCounterBatch on both paths)")
    parser.add_argument("--peer", type=Path, default=PEER, help="the peer script (default: ../shared/peers)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of (native path, DataFrame path), alternating; the ratio uses all of them")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    events = args.events or (200_000 if args.quick else 1_000_000)
    warmup = max(2, args.warmup_events if args.warmup_events is not None else events // 5)
    partitions = 2
    peer = not args.no_peer and args.peer.exists()
    report = Report("spark", {"events": events, "users": args.users, "master": "local[2]", "partitions": partitions,
                              "backend": args.backend, "warmup_events": warmup})
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        root = Path(tmp)
        data = root / "data"
        data.mkdir()
        expected = _write_events(data, events, args.users, args.seed, partitions)
        budget = 20.0 if args.quick else 40.0

        cpu: dict[str, dict[str, float]] = {}  # each native run's CPU seconds (jvm_cpu_s, workers_cpu_s)

        def native(name: str, task: str = "record") -> tuple[float, RunSummary, bool]:
            # The default JIT, not localstate run's quick one: this process's one JVM also runs the
            # DataFrame path, where the JVM does the heavy work (the native figure is conservative).
            return _localstate(root / name, data, partitions, args.backend, events, expected, args.users,
                               warmup=warmup, task=task, measured=cpu.setdefault(name, {}))

        if not args.no_dataframe:
            _write_parquet_batches(root / "parquet", events, args.users, args.seed, 10)
        # Rounds alternate the native path and the DataFrame path, so that a change of background load
        # during the run weighs on both; the ratio uses every round's runs.
        runs, df_runs = [], []
        batch_runs, df_batch_runs = [], []
        for round_index in range(args.rounds):
            runs.append(native(f"run{len(runs) + 1}"))
            if not args.no_batch_task:
                batch_runs.append(native(f"batch{round_index + 1}", task="batch"))
            if peer and round_index == 0:
                # Measure localstate before and after Spark's native aggregation and compare with the
                # mean, so that a change of background load between the two shows (both rows).
                rates, failure = _peer(args.peer, events, args.users, args.seed, budget, budget + 60, "a", 10,
                                       warmup)
                runs.append(native(f"run{len(runs) + 1}"))
            if not args.no_dataframe:
                df_runs.append(_localstate_dataframe(root / f"dataframe{round_index + 1}", root / "parquet",
                                                     partitions, args.backend, events, expected, args.users,
                                                     warmup=warmup))
                if not args.no_batch_task:
                    df_batch_runs.append(_localstate_dataframe(
                        root / f"dataframe-batch{round_index + 1}", root / "parquet", partitions, args.backend,
                        events, expected, args.users, warmup=warmup, task="batch"))
        correct = all(ok for _, _, ok in runs + batch_runs) and all(ok for _, _, ok in df_runs + df_batch_runs)
        for index, (seconds, summary, ok) in enumerate(runs, 1):
            tasks = sum(b.tasks for b in summary.batches)
            report.add(f"localstate on Spark (kv/{args.backend}), run {index}", events_per_s=events / seconds,
                       seconds=seconds, batches=len(summary.batches), correct=ok,
                       kept_open_pct=100.0 * sum(b.reused for b in summary.batches) / max(1, tasks),
                       **cpu.get(f"run{index}", {}))
        rate = len(runs) * events / sum(seconds for seconds, _, _ in runs)
        if len(runs) > 1:
            report.add(f"localstate on Spark (kv/{args.backend}), all runs", events_per_s=rate)
        batch_rate = None
        for index, (seconds, summary, ok) in enumerate(batch_runs, 1):
            tasks = sum(b.tasks for b in summary.batches)
            report.add(f"localstate on Spark, batch task (kv/{args.backend}), run {index}",
                       events_per_s=events / seconds, seconds=seconds, batches=len(summary.batches), correct=ok,
                       kept_open_pct=100.0 * sum(b.reused for b in summary.batches) / max(1, tasks),
                       **cpu.get(f"batch{index}", {}))
        if batch_runs:
            batch_rate = len(batch_runs) * events / sum(seconds for seconds, _, _ in batch_runs)
            report.ratio("native path: batch task / per-record task", batch_rate / rate, ">= 2")
        df_batch_rate = None
        for index, (seconds, reports, ok) in enumerate(df_batch_runs, 1):
            report.add(f"localstate DataFrame entry point, batch task (kv/{args.backend}), run {index}",
                       events_per_s=events / seconds, seconds=seconds, batches=len(reports), correct=ok)
        if df_batch_runs:
            df_batch_rate = len(df_batch_runs) * events / sum(seconds for seconds, _, _ in df_batch_runs)
            report.ratio("DataFrame path, batch task / native path, per-record task", df_batch_rate / rate, ">= 1")
        _breakdown(report, [summary for _, summary, _ in runs])
        if batch_runs:
            _breakdown(report, [summary for _, summary, _ in batch_runs], prefix="batch task time")
        if df_runs:
            for index, (seconds, reports, ok) in enumerate(df_runs, 1):
                applied = sum(len(r.applied) for r in reports)
                report.add(f"localstate DataFrame entry point (foreachBatch, kv/{args.backend}), run {index}",
                           events_per_s=events / seconds, seconds=seconds, batches=len(reports), correct=ok,
                           kept_open_pct=100.0 * sum(len(r.reused) for r in reports) / max(1, applied))
            df_seconds = sum(seconds for seconds, _, _ in df_runs)
            df_rate = len(df_runs) * events / df_seconds
            if len(df_runs) > 1:
                report.add(f"localstate DataFrame entry point (foreachBatch, kv/{args.backend}), all runs",
                           events_per_s=df_rate)
            report.ratio("DataFrame path / native input path", df_rate / rate, ">= 0.5")
            _dataframe_breakdown(report, df_seconds, [r for _, reports, _ in df_runs for r in reports])
        if peer:
            # The pandas variants (~2k events/s) run on 100 smaller micro-batches so that several
            # complete within their time budget (their rate is then measured on those batches).
            # transformWithStateInPandas alone (the peer adds applyInPandasWithState if it fails), with
            # a budget long enough for a loaded machine to finish some micro-batches: under load its
            # first 10k-event batch alone takes minutes, and a variant with no finished batch has no rate.
            slow_budget = 4 * budget if args.quick else 6 * budget
            slow, failure_b = _peer(args.peer, events, args.users, args.seed, slow_budget, slow_budget + 180, "b", 100)
            rates.update(slow)
            failure = failure or failure_b
            names = {"a_sql_count": "Spark native groupBy().count()",
                     "b_tws_pandas": "Spark transformWithStateInPandas",
                     "c_apply_pandas": "Spark applyInPandasWithState"}
            for key, label in names.items():
                if key in rates:
                    report.add(label, events_per_s=rates[key])
            if "b_tws_pandas" in rates:
                report.ratio("localstate / transformWithStateInPandas", rate / rates["b_tws_pandas"], ">= 30")
                if not args.no_dataframe:
                    report.ratio("localstate DataFrame path / transformWithStateInPandas",
                                 df_rate / rates["b_tws_pandas"], ">= 20")
            if "c_apply_pandas" in rates:
                report.ratio("localstate / applyInPandasWithState", rate / rates["c_apply_pandas"])
            if "a_sql_count" in rates:
                report.ratio("localstate / Spark native groupBy().count()", rate / rates["a_sql_count"], ">= 1.5")
                if batch_rate is not None:
                    report.ratio("localstate batch task / Spark native groupBy().count()",
                                 batch_rate / rates["a_sql_count"], ">= 3")
                if df_batch_rate is not None:
                    report.ratio("localstate DataFrame path, batch task / Spark native groupBy().count()",
                                 df_batch_rate / rates["a_sql_count"])
            if failure:
                report.notes.append("peer produced no figures: " + failure.replace("\n", " | ")[-500:])
            if "b_tws_pandas" not in rates and not _has_protobuf():
                report.notes.append("transformWithStateInPandas needs protobuf in this Python: "
                                    "pip install -e '.[bench]'")
            report.notes.append("localstate ran before and after Spark native (ratios use every run); "
                                "transformWithStateInPandas runs with 100 micro-batches (native with 10, like "
                                "localstate) and, when slower than its budget, is rated on the batches it finished; "
                                "applyInPandasWithState runs only if it fails")
    report.emit(args.json)
    return 0 if correct else 1
