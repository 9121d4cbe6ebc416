"""``localstate demo``: one pipeline on local Spark over five generated event streams.

1. page views per user per event-time hour, emitted when the hour closes (windowed aggregation);
2. profiles joined with settings (table-table join; the joined store's changelog is the output);
3. page views enriched with the user's ZIP code (stream-table join);
4. ad clicks joined to impressions within 10 minutes, unmatched impressions expired (stream-stream).

Midway one partition's Python worker is SIGKILLed from inside the Spark task (once: a marker file
guards it); Spark retries the task, which restarts from the last committed state. At the end every
output is checked against an independent plain-Python computation over the generated files.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from localstate.core.config import JobConfig, load_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.stream import open_output
from localstate.runtime.partition.sink import StreamSink
from localstate.streams.jsonl import write_jsonl
from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, StreamTask, TaskContext
from localstate.core.serdes import JsonSerde, StringSerde

__all__ = ["DemoPipeline", "PageViewCounter", "PageViewCounterBatch", "generate_events", "expected_results", "actual_results", "run_demo", "demo_job_toml"]

HOUR = 3600
MATCH_WINDOW = 600.0   # a click attributes to an impression at most 10 minutes old
STREAMS = ("clicks", "impressions", "page_views", "profiles", "settings")   # sorted: the merge's tie order
_THEMES = ("light", "dark", "auto")
_NAMES = ("ana", "ben", "chen", "dara", "eli", "fatima", "goran", "hana", "ivan", "jun", "kofi", "lena")


# ---------------------------------------------------------------------------------------- data

def generate_events(directory: Path, events: int, partitions: int, *, users: int = 2000, seed: int = 42,
                    start_ts: float = 1_700_000_000.0, step: float = 0.5) -> dict[str, int]:
    """Write ``events`` events as ``<directory>/<stream>/<partition>.jsonl``, partitioned by key with
    the Kafka-compatible partitioner. Event times are unique and increasing (``step`` apart)."""
    rng = random.Random(seed)
    pending: dict[int, str] = {}        # slot -> impression id clicked at that slot
    buffers: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    counts: Counter[str] = Counter()
    impressions = 0
    for slot in range(events):
        ts = start_ts + slot * step
        if slot in pending:
            impression = pending.pop(slot)
            stream, key, value = "clicks", impression, {"ts": ts}
        else:
            roll = rng.random()
            user = f"user-{rng.randrange(users):05d}"
            if roll < 0.60:
                stream, key, value = "page_views", user, {"user": user, "page": f"/p/{rng.randrange(500)}", "ts": ts}
            elif roll < 0.70:
                stream, key = "profiles", user
                value = {"user": user, "name": rng.choice(_NAMES), "zip": f"{rng.randrange(10000, 99999)}", "ts": ts}
            elif roll < 0.78:
                stream, key = "settings", user
                value = {"user": user, "theme": rng.choice(_THEMES), "emails": rng.random() < 0.5, "ts": ts}
            else:
                impressions += 1
                stream, key = "impressions", f"imp-{impressions:07d}"
                value = {"ad": f"ad-{rng.randrange(100)}", "user": user, "ts": ts}
                clicks = 1 if rng.random() < 0.25 else 0
                clicks += 1 if clicks and rng.random() < 0.1 else 0     # a few double clicks
                for _ in range(clicks):
                    target = slot + rng.randrange(2, int(1.5 * MATCH_WINDOW / step))   # some arrive too late
                    while target in pending:
                        target += 1
                    pending[target] = key
        counts[stream] += 1
        buffers[(stream, partition_for(key, partitions))].append({"key": key, "value": value, "ts": ts})
    for stream in STREAMS:
        for partition in range(partitions):
            (directory / stream).mkdir(parents=True, exist_ok=True)
            write_jsonl(directory / stream, partition, buffers.get((stream, partition), []))
    return dict(counts)


# ------------------------------------------------------------------------------------ the task

class DemoPipeline(StreamTask):
    """All four pipelines in one task: input streams are routed by name."""

    def init(self, context: TaskContext) -> None:
        self.hourly = context.store("hourly")            # "<hour:012d>|<user>" -> views
        self.clock = context.store("clock")              # "hour" -> open hour, "wm" -> ad watermark
        self.profiles = context.store("profiles")        # user -> profile
        self.settings = context.store("settings")        # user -> settings
        self.users = context.store("users")              # user -> profile + settings (changelog = output)
        self.impressions = context.store("impressions")  # impression id -> impression
        self.expiry = context.store("expiry")            # "<ts_ms:015d>|<impression id>" -> ""

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        stream, key, value, ts = envelope.stream, envelope.key, envelope.value, envelope.timestamp
        if stream == "page_views":
            self.count_view(key, ts, collector)
            profile = self.profiles.get(key)
            collector.send("enriched-views", key, {"page": value["page"], "ts": ts,
                                                   "zip": profile["zip"] if profile else None})
        elif stream == "profiles":
            self.profiles.put(key, value)
            self.join_user(key)
        elif stream == "settings":
            self.settings.put(key, value)
            self.join_user(key)
        elif stream == "impressions":
            self.expire(ts, collector)
            self.impressions.put(key, value)
            self.expiry.put(f"{int(ts * 1000):015d}|{key}", "")
        elif stream == "clicks":
            self.expire(ts, collector)
            impression = self.impressions.get(key)
            if impression is not None and ts - impression["ts"] <= MATCH_WINDOW:
                collector.send("attributed-clicks", key, {"ad": impression["ad"], "user": impression["user"],
                                                          "impression_ts": impression["ts"], "click_ts": ts})
                self.impressions.delete(key)
                self.expiry.delete(f"{int(impression['ts'] * 1000):015d}|{key}")
            else:
                collector.send("unmatched-clicks", key, {"ts": ts})

    # 1. windowed aggregation
    def count_view(self, user: str, ts: float, collector: Collector) -> None:
        hour = int(ts // HOUR)
        open_hour = self.clock.get("hour")
        if open_hour is not None and hour < open_hour:
            return
        if open_hour is None or hour > open_hour:
            start = None if open_hour is None else f"{open_hour:012d}"   # older hours are gone
            with self.hourly.range(start, f"{hour:012d}") as closed:
                done = []
                for window_key, count in closed:
                    window, owner = window_key.split("|", 1)
                    collector.send("hourly-views", owner, {"hour": int(window), "count": count})
                    done.append(window_key)
            self.hourly.delete_all(done)
            self.clock.put("hour", hour)
        key = f"{hour:012d}|{user}"
        self.hourly.put(key, (self.hourly.get(key) or 0) + 1)

    # 2. table-table join
    def join_user(self, user: str) -> None:
        profile, settings = self.profiles.get(user), self.settings.get(user)
        if profile is not None and settings is not None:
            self.users.put(user, {"name": profile["name"], "zip": profile["zip"], "theme": settings["theme"],
                                  "emails": settings["emails"]})

    # 4. stream-stream join: expire impressions older than the match window
    def expire(self, ts: float, collector: Collector) -> None:
        horizon_ms = int((ts - MATCH_WINDOW) * 1000)
        scanned = self.clock.get("expired_to")
        if scanned is not None and horizon_ms <= scanned:
            return
        # Start where the previous scan stopped: below it are only deletions, which a RocksDB
        # iterator would have to step over again (the queue-in-an-LSM-tree anti-pattern).
        start = None if scanned is None else f"{scanned:015d}"
        self.clock.put("expired_to", horizon_ms)
        with self.expiry.range(start, f"{horizon_ms:015d}") as old:
            keys = [k for k, _ in old]
        for expiry_key in keys:
            impression_id = expiry_key.split("|", 1)[1]
            impression = self.impressions.get(impression_id)
            if impression is not None and ts - impression["ts"] > MATCH_WINDOW:
                collector.send("expired-impressions", impression_id, {"ad": impression["ad"]})
                self.impressions.delete(impression_id)
            self.expiry.delete(expiry_key)


def demo_job_toml(data: Path, state: Path, out: Path, partitions: int, backend: str = "rocksdb") -> str:
    """The demo job's config: five JSON-lines inputs, file-log and JSON-lines outputs, kv stores."""
    inputs = "".join(f'[inputs.{s}]\nsystem = "jsonl"\npath = "{data / s}"\n\n' for s in STREAMS)
    outputs = "".join(f'[outputs.{s}]\nsystem = "file"\npath = "{out}"\n\n'
                      for s in ("hourly-views", "attributed-clicks", "expired-impressions", "unmatched-clicks"))
    outputs += f'[outputs.enriched-views]\nsystem = "jsonl"\npath = "{out / "enriched-views"}"\nfsync = false\n\n'
    stores = ""
    for name, key_serde in (("hourly", "string"), ("clock", "string"), ("profiles", "string"),
                            ("settings", "string"), ("users", "string"), ("impressions", "string"),
                            ("expiry", "string")):
        value_serde = "int" if name in ("hourly", "clock") else "json"
        changelog = '\nchangelog = "demo-users"' if name == "users" else ""
        stores += (f'[stores.{name}]\nengine = "kv"\nbackend = "{backend}"\nkey_serde = "{key_serde}"\n'
                   f'value_serde = "{value_serde}"{changelog}\n\n')
    return (f'[job]\nname = "demo"\npartitions = {partitions}\ntask = "localstate.demo:DemoPipeline"\n'
            f'state_dir = "{state}"\n\n{inputs}{outputs}{stores}')


# ------------------------------------------------------------------------------ verification

def _events_by_partition(data: Path, partitions: int) -> dict[int, list[tuple[float, int, int, str, dict]]]:
    merged: dict[int, list] = {}
    for partition in range(partitions):
        rows = []
        for index, stream in enumerate(STREAMS):
            path = data / stream / f"{partition}.jsonl"
            with open(path, encoding="utf-8") as handle:
                for offset, line in enumerate(handle):
                    record = json.loads(line)
                    rows.append((record["ts"], index, offset, stream, record))
        rows.sort(key=lambda row: row[:3])
        merged[partition] = rows
    return merged


def expected_results(data: Path, partitions: int) -> dict[str, Any]:
    """What the pipeline must output, computed independently with dicts over the input files."""
    hourly: Counter[tuple[str, int]] = Counter()
    enriched: list[tuple[str, Any]] = []
    users: dict[str, dict] = {}
    attributed, unmatched, expired = {}, Counter(), set()
    for partition, rows in _events_by_partition(data, partitions).items():
        profiles, settings, impressions = {}, {}, {}
        last_view = None
        ad_wm = None
        for ts, _, _, stream, record in rows:
            key, value = record["key"], record["value"]
            if stream == "page_views":
                hourly[(key, int(ts // HOUR))] += 1
                last_view = ts if last_view is None else max(last_view, ts)
                enriched.append((key, profiles[key]["zip"] if key in profiles else None))
            elif stream == "profiles":
                profiles[key] = value
            elif stream == "settings":
                settings[key] = value
            elif stream == "impressions":
                impressions[key] = value
                ad_wm = ts
            else:
                ad_wm = ts
                imp = impressions.get(key)
                if imp is not None and ts - imp["ts"] <= MATCH_WINDOW and key not in attributed:
                    attributed[key] = (imp["ad"], ts)
                else:
                    unmatched[key] += 1
        for user in profiles.keys() & settings.keys():
            users[user] = {"name": profiles[user]["name"], "zip": profiles[user]["zip"],
                           "theme": settings[user]["theme"], "emails": settings[user]["emails"]}
        if ad_wm is not None:
            expired |= {k for k, imp in impressions.items() if k not in attributed and ad_wm - imp["ts"] > MATCH_WINDOW}
        # only hours before the partition's last page-view hour are closed and emitted
        if last_view is not None:
            open_hour = int(last_view // HOUR)
            for (user, hour) in [k for k in hourly if k[1] >= open_hour and partition_for(k[0], partitions) == partition]:
                del hourly[(user, hour)]
    return {"hourly": dict(hourly), "enriched": Counter(enriched), "users": users, "attributed": attributed,
            "unmatched": dict(unmatched), "expired": expired}


def actual_results(job: JobConfig) -> dict[str, Any]:
    """Read the committed outputs and the joined table's changelog back."""
    outputs = {name: open_output(job, name) for name in job.outputs}
    rows = {name: [kv for p in range(job.partitions) for kv in out.read(p)] for name, out in outputs.items()}
    hourly: Counter[tuple[str, int]] = Counter()
    for user, value in rows["hourly-views"]:
        hourly[(user, value["hour"])] += value["count"]
    users: dict[str, Any] = {}
    changelogs = open_changelog_system(job)
    store = job.stores["users"]
    for partition in range(job.partitions):
        log = changelogs.reader(store.changelog, partition)  # type: ignore[attr-defined]
        for record in log.read(0):
            user = StringSerde().deserialize(record.key)
            if record.value is None:
                users.pop(user, None)
            else:
                users[user] = JsonSerde().deserialize(record.value)
        log.close()
    for out in outputs.values():
        out.close()
    unmatched: Counter[str] = Counter(k for k, _ in rows["unmatched-clicks"])
    return {"hourly": dict(hourly), "enriched": Counter((k, v["zip"]) for k, v in rows["enriched-views"]),
            "users": users, "attributed": {k: (v["ad"], v["click_ts"]) for k, v in rows["attributed-clicks"]},
            "unmatched": dict(unmatched), "expired": {k for k, _ in rows["expired-impressions"]},
            "duplicates": {"attributed": len(rows["attributed-clicks"]) - len({k for k, _ in rows["attributed-clicks"]}),
                           "enriched": len(rows["enriched-views"])}}


def compare(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Names of the results that differ (empty: everything exact)."""
    problems = [name for name in ("hourly", "enriched", "users", "attributed", "unmatched", "expired")
                if expected[name] != actual[name]]
    if actual["duplicates"]["attributed"]:
        problems.append("attributed (duplicates)")
    return problems


def measure_full_restore(job: JobConfig, partition: int = 0) -> tuple[int, float]:
    """Delete one partition's local stores and rebuild them from the changelogs: (records, seconds)."""
    for name in job.stores:
        shutil.rmtree(store_directory(job, name, partition), ignore_errors=True)
    changelogs = open_changelog_system(job)
    instance = TaskInstance(job, partition, changelogs, StreamSink(job))
    started = time.perf_counter()
    recoveries = instance.open()
    seconds = time.perf_counter() - started
    instance.close(commit=False)
    changelogs.close()
    return sum(r.replayed for r in recoveries), seconds


# ------------------------------------------------------------------------------------- driver

def run_demo(*, events: int = 200_000, partitions: int = 2, kill: bool = True, master: str = "local[2]",
             directory: str | None = None, batch_size: int | None = None, context: Any = None,
             out: Any = print) -> int:
    """Generate, run with a worker kill, summarise, verify. Returns 0 when every result is exact."""
    # CLI start-up: the runner loads pyspark (--help imports this package for `localstate demo`)
    from localstate.runtime.spark.runner import SparkJobRunner

    tmp = None
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="localstate-demo-")
        directory = tmp.name
    root = Path(directory).resolve()
    try:
        data, state, outputs = root / "data", root / "state", root / "out"
        out(f"work directory {root}: " + ("a temporary directory, removed at the end (--dir DIR keeps the "
                                          "results)" if tmp is not None else "kept after the run"))
        started = time.perf_counter()
        counts = generate_events(data, events, partitions)
        out(f"generated {events:,} events in {time.perf_counter() - started:.1f}s: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        job_file = root / "demo.toml"
        job_file.write_text(demo_job_toml(data, state, outputs, partitions))
        job = load_job_config(job_file)
        batch_size = batch_size or max(1000, events // partitions // 4 + 1)
        marker = root / "killed-once"
        fault = {"partition": 0, "batch": 1, "after": batch_size // 2, "marker": str(marker)} if kill else None
        runner = SparkJobRunner(job, context=context, master=master, batch_size=batch_size, fault=fault,
                                progress=lambda line: out("  " + line))
        runner.context
        out(f"running job {job.name!r}: {partitions} partitions on {runner.master}, {batch_size:,} records per "
            f"partition per batch" + (", one Python worker will be SIGKILLed in batch 1" if kill else ""))
        summary = runner.run()
        if kill:
            killed = marker.exists()
            retried = summary.batches[1] if len(summary.batches) > 1 else None
            out(f"worker kill: {'done (' + marker.read_text().strip() + ')' if killed else 'did not happen'}; "
                f"Spark retried the task, which reopened the partition from its last checkpoint"
                + (f" (restore {retried.restore_seconds * 1000:.0f} ms, {retried.replayed:,} replayed, "
                   f"{retried.trimmed:,} uncommitted changelog records trimmed)" if retried else ""))
        replayed, restore_seconds = measure_full_restore(job)
        expected = expected_results(data, partitions)
        actual = actual_results(job)
        rate = summary.records_in / summary.seconds if summary.seconds else 0.0
        out("summary:")
        out(f"  events processed      {summary.records_in:,} in {summary.seconds:.1f}s ({rate:,.0f} events/s, "
            f"{len(summary.batches)} batches)")
        out(f"  hourly view counts    {len(actual['hourly']):,} closed (user, hour) windows, "
            f"{sum(actual['hourly'].values()):,} views")
        out(f"  profile+settings join {len(actual['users']):,} users")
        out(f"  enriched page views   {sum(actual['enriched'].values()):,} "
            f"({sum(n for (u, z), n in actual['enriched'].items() if z):,} with a ZIP code)")
        out(f"  click attribution     {len(actual['attributed']):,} matched, "
            f"{sum(actual['unmatched'].values()):,} unmatched clicks, {len(actual['expired']):,} impressions expired")
        out(f"  full restore          partition 0 rebuilt from its changelogs: {replayed:,} records in "
            f"{restore_seconds:.2f}s")
        out(f"  outputs               in {outputs}: " + ", ".join(
            f"{name} ({job.outputs[name].system})" for name in sorted(job.outputs)))
        out(f"  state                 {state} (checkpoints, local stores, changelogs)")
        if tmp is None:
            out(f"  look at it            localstate inspect {job_file}")
        problems = compare(expected, actual)
        if kill and not marker.exists():
            problems.append("the worker kill did not happen")
        if problems:
            out("verification: FAILED: " + ", ".join(problems))
            return 1
        out("verification: OK (every output equals an independent plain-Python computation)")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()
            out(f"removed {root} (run with --dir DIR to keep the outputs and state)")


class PageViewCounter(StreamTask):
    """The benchmark job: a running count of page views per user (store ``counts``)."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        counts = self.counts
        counts.put(envelope.key, (counts.get(envelope.key) or 0) + 1)


class PageViewCounterBatch(BatchTask):
    """:class:`PageViewCounter` as a batch task: the batch's keys counted in Arrow
    (``value_counts``), then one ``merge_many`` of the distinct users (the same counts)."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process_batch(self, batch: Any, collector: Collector, coordinator: Coordinator) -> None:
        import pyarrow.compute as pc  # only batch tasks need pyarrow

        counted = pc.value_counts(batch.column("key"))
        self.counts.merge_many(counted.field("values").to_pylist(), counted.field("counts").to_pylist())
