"""Every rollback path of every engine, against a model: a job that crashes (between a spill and its
commit, or with nothing flushed) must come back to exactly the state of a twin job that ran only the
committed part of the same history, at the same times, and never crashed.

The job keeps one store of each kind that has a rollback path of its own: kv on each backend, kv
with processing-time and event-time ttl, a top-N heap with eviction, HLL and Bloom sketches, a
tantivy index, a tumbling window's store, and the timer store (processing- and event-time timers).
Hypothesis draws the history: records, the clock moving (past the ttl, so that committed values
expire before the crash), timer firings, commits, *spills* (``prepare_commit``: every store flushed
to local state and changelog, outputs written, no checkpoint) and crashes. After each crash the
reopened job is compared with the twin before any input is re-delivered (the rollback itself), and
again at the end (the re-delivered records applied once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.config import TIMER_STORE, parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.runtime.partition.instance import MemorySink, TaskInstance
from localstate.windows import Tumbling, WindowedAggregation, count

KEYS = [f"k{i}" for i in range(4)]
TTL = 10.0

STORES: dict[str, dict[str, Any]] = {
    "kv_rocksdb": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"},
    "kv_lmdb": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "json"},
    "kv_memory": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"},
    "ttl_processing": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int",
                       "ttl": f"{TTL}s", "ttl_sweep": 2},
    "ttl_event": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "json",
                  "ttl": f"{TTL}s", "ttl_time": "event"},
    "ttl_memory": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int",
                   "ttl": f"{TTL}s"},
    "top": {"engine": "heap", "key_serde": "string", "value_serde": "json", "order": "max", "capacity": 3},
    "hll": {"engine": "sketch", "kind": "hll", "key_serde": "string", "precision": 6},
    "bloom": {"engine": "sketch", "kind": "bloom", "key_serde": "string", "capacity": 1000},
    "docs": {"engine": "search", "key_serde": "string",
             "fields": {"body": {"type": "text", "stored": True}}},
    "win": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"},
}


class EveryEngineTask(StreamTask):
    """Each record ``(key, n, ts)`` changes every store; processing-time timers count firings."""

    def init(self, context):
        self.context = context
        self.timers = context.timers
        self.window = WindowedAggregation(context, Tumbling(5), count(), store="win", output="windows")

    def process(self, envelope, collector, coordinator):
        key, n, ts = envelope.key, envelope.value, envelope.timestamp
        store = self.context.store
        kv = store("kv_rocksdb")
        kv.put(key, (kv.get(key) or 0) + n)
        store("kv_lmdb").put(key, {"last": n})
        if n % 3 == 0:
            store("kv_memory").delete(key)
        else:
            store("kv_memory").put(key, n)
        store("ttl_processing").put(key, n)
        store("ttl_event").put(key, [n, ts])
        store("ttl_memory").put(key, n)
        store("top").push(key, n)
        store("hll").add(key, f"{key}/{n}")
        store("bloom").add("seen", f"{key}/{n}")
        if n % 4 == 0:
            store("docs").delete(key)
        else:
            store("docs").add(key, {"body": f"w{n} {key}"})
        self.window.add(key, n, ts, collector)
        self.timers.register_processing_time(key, self.timers.processing_time() + 3)
        collector.send("echo", key, n)

    def on_timer(self, key, timestamp, collector, coordinator):
        if self.window.on_timer(key, timestamp, collector):
            return
        fired = self.context.store("kv_rocksdb")
        fired.put(f"fired:{key}", (fired.get(f"fired:{key}") or 0) + 1)
        collector.send("fired", key, timestamp)


def _job(state_dir: Path):
    return parse_job_config({
        "job": {"name": "rollback-model", "task": "unused:Unused", "commit_interval": 10 ** 9,
                "state_dir": str(state_dir)},
        "time": {"timers": True, "allowed_lateness": 1.0},
        "stores": STORES,
    }, base_dir=state_dir)


def snapshot(instance: TaskInstance, sink: MemorySink) -> dict[str, Any]:
    """Everything the job's stores and outputs show (every kind through its own query API)."""
    instance.refresh_store_time()
    engines = {name: store.engine for name, store in instance.stores.items()}
    seen: dict[str, Any] = {}
    for name in ("kv_rocksdb", "kv_lmdb", "kv_memory", "ttl_processing", "ttl_event", "ttl_memory", "win"):
        seen[name] = dict(engines[name].all())
    seen["timers"] = sorted(engines[TIMER_STORE].all())
    seen["top"] = [(entry.item, entry.score) for entry in engines["top"].top(10)]
    seen["hll"] = {key: engines["hll"].registers(key).tolist() for key in KEYS if key in engines["hll"].names()}
    seen["bloom"] = [engines["bloom"].contains("seen", f"{k}/{n}") for k in KEYS for n in range(12)]
    seen["docs"] = {key: engines["docs"].get(key) for key in KEYS}
    seen["outputs"] = {stream: [(m.key, m.value) for m in sink.messages(stream)]
                       for stream in ("echo", "fired", "windows")}
    seen["watermark"] = instance.time.watermark
    return seen


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Job:
    """One job's instance of partition 0, reopened after each crash (the model: never crashed)."""

    directory: Path
    clock: Clock = field(default_factory=Clock)
    sink: MemorySink = field(default_factory=MemorySink)

    def __post_init__(self) -> None:
        self.config = _job(self.directory)
        self.instance: TaskInstance | None = None
        self.open()

    def open(self) -> None:
        self.changelogs = open_changelog_system(self.config)
        self.instance = TaskInstance(self.config, 0, self.changelogs, self.sink, EveryEngineTask,
                                     clock=self.clock, processing_clock=self.clock)
        self.instance.open()

    def crash(self) -> None:
        assert self.instance is not None
        self.instance.abandon()
        self.changelogs.close()
        self.open()

    def close(self) -> None:
        if self.instance is not None:
            self.instance.abandon()
            self.changelogs.close()


@dataclass
class History:
    """The main job, its twin, the input log and the steps not committed yet."""

    main: Job
    twin: Job
    log: list[InputRecord] = field(default_factory=list)
    epoch: list[tuple[str, float, Any]] = field(default_factory=list)

    def at(self, now: float, step: str, argument: Any = None) -> None:
        """Run ``step`` on the main job at ``now`` and remember it for the twin."""
        self.main.clock.now = now
        self._run(self.main.instance, step, argument)
        self.epoch.append((step, now, argument))

    def _run(self, instance: TaskInstance, step: str, argument: Any) -> None:
        if step == "feed":
            instance.feed([("events", self.log[argument])])
        elif step == "fire":
            instance.fire_timers()
        elif step == "refresh":
            instance.refresh_store_time()

    def commit(self, now: float) -> None:
        self.main.clock.now = now
        self.main.instance.commit()
        for step, at, argument in self.epoch:  # the twin runs the committed steps, at their times
            self.twin.clock.now = at
            self._run(self.twin.instance, step, argument)
        self.twin.clock.now = now
        self.twin.instance.commit()
        self.epoch.clear()

    def crash(self, now: float, spill: bool) -> None:
        self.main.clock.now = now
        if spill:
            self.main.instance.prepare_commit()  # every store flushed, no checkpoint: then the crash
        self.epoch.clear()
        self.main.crash()
        self.twin.clock.now = now
        assert snapshot(self.main.instance, self.main.sink) == snapshot(self.twin.instance, self.twin.sink)
        # the uncommitted input again, now (what a restarted job does)
        for offset in range(self.main.instance.position("events"), len(self.log)):
            self.at(now, "feed", offset)


rounds = st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from(KEYS[:3]), st.integers(0, 11), st.floats(-3, 6)), max_size=3),  # records
    st.sampled_from([0.5, 4.0, TTL + 1]),                                          # then the clock moves
    st.booleans(),                                                                 # timers fire or not
    st.sampled_from(["commit", "spill_crash", "crash"]),                           # and the round ends
), min_size=2, max_size=6)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=rounds)
def test_a_crash_rolls_every_engine_back_to_exactly_the_committed_state(tmp_path_factory: pytest.TempPathFactory,
                                                                       history: list[tuple]) -> None:
    root = tmp_path_factory.mktemp("rollback")
    run = History(Job(root / "main"), Job(root / "twin"))
    now, event_time = 1_000.0, 1_000.0
    try:
        for records, advance, fire, end in history:
            run.at(now, "refresh")  # a batch starts: the stores read the time
            for key, n, skew in records:
                event_time += 1.0
                run.log.append(InputRecord(len(run.log), key, n, event_time + skew))
                run.at(now, "feed", len(run.log) - 1)
            now += advance
            event_time += advance
            if fire:
                run.at(now, "fire")
            if end == "commit":
                run.commit(now)
            else:
                run.crash(now, spill=end == "spill_crash")
        run.commit(now)
        assert snapshot(run.main.instance, run.main.sink) == snapshot(run.twin.instance, run.twin.sink)
    finally:
        run.main.close()
        run.twin.close()


@pytest.mark.parametrize("store", ["ttl_processing", "ttl_event", "ttl_memory"])
@pytest.mark.parametrize("spill", [True, False])
def test_an_uncommitted_write_over_an_expired_committed_value_is_rolled_back(tmp_path: Path, store: str,
                                                                             spill: bool) -> None:
    """The example of the class: a committed value expires, a newer write is spilled to local state
    (and the changelog), the job crashes before its checkpoint: the key must be gone after the
    restart, not show the uncommitted value."""
    run = History(Job(tmp_path / "main"), Job(tmp_path / "twin"))
    later = 1_000.0 + 3 * TTL
    try:
        run.log.append(InputRecord(0, "k0", 1, 1_000.0))
        run.at(1_000.0, "feed", 0)
        run.commit(1_000.0)
        # committed next: the clock and the watermark past k0's expiry (k1 moves the watermark)
        run.log.append(InputRecord(1, "k1", 1, later))
        run.at(later, "refresh")  # a batch starts: the stores read the time
        run.at(later, "feed", 1)
        run.commit(later)
        run.log.append(InputRecord(2, "k0", 2, later))
        run.at(later, "feed", 2)
        main = run.main.instance
        assert main.stores[store].engine.get("k0") == (2 if store != "ttl_event" else [2, later])
        if spill:
            main.prepare_commit()
        run.epoch.clear()
        run.main.crash()
        engine = run.main.instance.stores[store].engine
        assert engine.get("k0") is None
        assert snapshot(run.main.instance, run.main.sink) == snapshot(run.twin.instance, run.twin.sink)
    finally:
        run.main.close()
        run.twin.close()
