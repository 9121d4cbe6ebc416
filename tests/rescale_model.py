"""A job with every kind of state a rescale moves, and the drivers the state-as-data tests run it with.

``ModelTask`` keeps, per record (key, value, timestamp): a count per key (kv), a value with a ttl (kv
with ttl), a top-N of keys by count (heap), a HyperLogLog per key and one of every key (sketch), a
document per key (search), a job-wide total (a kv key that is not a routing key, merged with
``add_all``), a tumbling-window count per key (windows: state keyed ``"<window>|<key>"``, an aligned
timer per window), and a processing-time timer per key that sends an alarm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localstate import StreamTask, TaskTestDriver
from localstate.core.config import JobConfig, parse_job_config
from localstate.core.time import TIMER_STORE
from localstate.runtime.driver.views import committed_contents, load_checkpoints
from localstate.runtime.layout import resolve_epoch
from localstate.windows import Tumbling, WindowedAggregation, count

TTL = 30.0
ALARM_AFTER = 40.0


def add_all(values: list[int]) -> int:
    """The ``rescale_merge`` of the job-wide total."""
    return sum(values)


class ModelTask(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")
        self.recent = context.store("recent")
        self.top = context.store("top")
        self.seen = context.store("seen")
        self.everyone = context.store("everyone")
        self.docs = context.store("docs")
        self.total = context.store("total")
        self.windows = WindowedAggregation(context, Tumbling(10.0), count(), store="win", output="windowed")
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        key, value = envelope.key, envelope.value
        seen = self.counts.get(key) or 0
        self.counts.put(key, seen + 1)
        self.recent.put(key, value)
        self.top.push(key, seen + 1)
        self.seen.add(key, value)
        self.everyone.add("all", key)
        self.docs.add(key, {"text": f"word{value % 5} key {key}", "n": seen + 1})
        self.total.put("total", (self.total.get("total") or 0) + 1)
        self.windows.add(key, value, envelope.timestamp, collector)
        if seen == 0:
            self.timers.register_processing_time(key, self.timers.processing_time() + ALARM_AFTER)

    def on_timer(self, key, timestamp, collector, coordinator):
        if self.windows.on_timer(key, timestamp, collector):
            return
        collector.send("alarms", key, {"count": self.counts.get(key), "at": timestamp})


def model_job(state_dir: Path, partitions: int, *, backend: str = "memory", changelog: str = "file",
              changelog_options: dict[str, Any] | None = None, stores: dict[str, Any] | None = None,
              inputs: dict[str, Any] | None = None, name: str = "model", time: dict[str, Any] | None = None
              ) -> JobConfig:
    """The model job with ``partitions`` partitions, its state in ``state_dir``; ``stores`` replaces
    (or, None as a value, removes) store tables, ``inputs`` declares inputs, ``time`` adds to ``[time]``."""
    kv = {"engine": "kv", "backend": backend}
    model_stores = {
        "counts": {**kv, "key_serde": "string", "value_serde": "int"},
        "recent": {**kv, "key_serde": "string", "value_serde": "int", "ttl": f"{TTL}s"},
        "top": {"engine": "heap", "backend": backend, "key_serde": "string"},
        "seen": {"engine": "sketch", "kind": "hll", "backend": backend, "key_serde": "string"},
        "everyone": {"engine": "sketch", "kind": "hll", "backend": backend, "key_serde": "string", "rescale": "all"},
        "docs": {"engine": "search", "key_serde": "string", "fields": {"text": {"type": "text"},
                                                                        "n": {"type": "int"}}},
        "total": {**kv, "key_serde": "string", "value_serde": "int", "rescale": "one",
                  "rescale_merge": "rescale_model:add_all"},
        "win": {**kv, "key_serde": "string", "value_serde": "json",
                "rescale": "localstate.windows.rescale:window_state_owner"},
    }
    for store, table in (stores or {}).items():
        if table is None:
            model_stores.pop(store, None)
        else:
            model_stores[store] = table
    return parse_job_config({
        "job": {"name": name, "partitions": partitions, "task": "rescale_model:ModelTask",
                "state_dir": str(state_dir), "commit_interval": 10 ** 9, "changelog": changelog},
        "changelogs": {changelog: dict(changelog_options or {})},
        "time": {"timers": True, "allowed_lateness": "1000s", "timer_backend": backend, **(time or {})},
        "inputs": dict(inputs or {}),
        "outputs": {"windowed": {"system": "jsonl", "path": str(state_dir / "out-windowed")},
                    "alarms": {"system": "jsonl", "path": str(state_dir / "out-alarms")}},
        "stores": model_stores}, base_dir=state_dir)


Record = tuple[str, int, float]


class ModelRun:
    """The model job driven in this process (a TaskTestDriver on the job's current epoch), its
    processing clock moved by :meth:`feed` as the records ask."""

    def __init__(self, job: JobConfig, now: float = 0.0) -> None:
        self.job = resolve_epoch(job)
        self.driver = TaskTestDriver(ModelTask, job=self.job)
        self.driver.now = now
        self.driver.__enter__()

    def feed(self, records: list[Record], tick: float = 1.0) -> None:
        for key, value, timestamp in records:
            self.driver.send("events", key, value, timestamp=timestamp)
            self.driver.advance(tick)

    def event_time(self, to: float) -> None:
        self.driver.advance_event_time(to)

    def state(self) -> dict[str, Any]:
        """Commit, and every store's committed records (:func:`committed_state`)."""
        self.driver.commit()
        return committed_state(self.job, self.driver.now)

    def outputs(self) -> dict[str, list[Any]]:
        return {name: sorted(map(repr, self.driver.outputs(name))) for name in ("windowed", "alarms")}

    def close(self) -> float:
        now = self.driver.now
        self.driver.close()
        return now


def committed_state(job: JobConfig, now: float) -> dict[str, Any]:
    """Every store's committed records per partition, raw (a ttl store: its entries live at ``now``);
    the merged stores (``everyone``, ``total``) as the union over partitions."""
    from localstate.core.serdes import IntSerde
    from localstate.engines.kv.ttl import unpack_expiry

    job = resolve_epoch(job)
    checkpoints = load_checkpoints(job)
    state: dict[str, Any] = {}
    for name, config in sorted(job.stores.items()):
        per_partition = {p: committed_contents(job, config, p, checkpoints[p], live=False)
                         for p in range(job.partitions)}
        if name == "recent":
            per_partition = {p: [(k, v) for k, v in entries if unpack_expiry(v)[0] > now]
                             for p, entries in per_partition.items()}
        if name == "everyone":  # one HLL of every key, merged over partitions: its registers' maxima
            registers: dict[bytes, int] = {}
            for entries in per_partition.values():
                for key, value in entries:
                    if key != b"\xff":  # the layout record
                        registers[key] = max(registers.get(key, 0), value[0])
            state[name] = sorted(registers.items())
        elif name == "total":
            state[name] = sum(IntSerde().deserialize(v) for entries in per_partition.values() for _, v in entries)
        else:
            state[name] = per_partition
    assert TIMER_STORE in state
    return state
