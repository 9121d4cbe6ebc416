"""The windows' timers in their namespaces: any job timer key serde (int here) and any JSON key work,
beside the task's own timers; two aggregations cannot share a store's namespace; and window state
from before timer namespaces (its timers stored as the task's own, for the keys
``"windows:<store>"`` and ``"windows:<store>|<key>"``) keeps closing exactly once through a task
that forwards its on_timer, after the migration, with new records joining its open windows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import parse_job_config
from localstate.core.serdes import JsonSerde, Serde, StringSerde
from localstate.core.task import StreamTask
from localstate.core.time import TIMER_STORE
from localstate.errors import ConfigError
from localstate.runtime.partition.timer_entries import OLD_PREFIX, PREFIX
from localstate.testing.driver import TaskTestDriver
from localstate.windows import Session, Tumbling, WindowedAggregation, count, sum_of
from localstate.windows.reference import reference_windows, watermarks

BASE = 1_700_000_000.0
ALLOWED_LATENESS = 2.0
TUMBLING, SESSIONS = Tumbling(10), Session(3)
STORES = {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"},
          "sessions": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "json"}}


def job(state_dir: Path, timer_key_serde: str = "json") -> Any:
    return parse_job_config({
        "job": {"name": "windows", "partitions": 1, "task": "unused:Unused", "state_dir": str(state_dir),
                "commit_interval": 10 ** 9},
        "time": {"timers": True, "allowed_lateness": ALLOWED_LATENESS, "timer_key_serde": timer_key_serde},
        "stores": STORES, "changelogs": {"file": {}}}, base_dir=state_dir)


class Windows(StreamTask):
    """A tumbling count and a session sum; no on_timer."""

    def init(self, context: Any) -> None:
        self.tumbling = WindowedAggregation(context, TUMBLING, count(), store="counts", output="tumbling",
                                            late_output="late")
        self.sessions = WindowedAggregation(context, SESSIONS, sum_of(), store="sessions", output="sessions",
                                            lateness=1.0)

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.tumbling.add(envelope.key, envelope.value, envelope.timestamp, collector)
        self.sessions.add(envelope.key, envelope.value, envelope.timestamp, collector)


class Forwarding(Windows):
    """A task written before timer namespaces: it forwards its on_timer to its aggregations."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.forwarded: list[tuple[Any, float, bool]] = []

    def on_timer(self, key: Any, timestamp: float, collector: Any, coordinator: Any) -> None:
        closed = self.tumbling.on_timer(key, timestamp, collector) or self.sessions.on_timer(key, timestamp, collector)
        self.forwarded.append((key, timestamp, closed))


class WithOwnTimers(Windows):
    """The windows, and the task's own timers keyed by the record's int value (timer_key_serde int)."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.timers = context.timers

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        super().process(envelope, collector, coordinator)
        self.timers.register_event_time(envelope.value, envelope.timestamp + 5)

    def on_timer(self, key: Any, timestamp: float, collector: Any, coordinator: Any) -> None:
        assert type(key) is int
        collector.send("own", key, timestamp)


def stream(n: int, keys: list[Any]) -> list[tuple[Any, int, float]]:
    """``(key, value, ts)``: out of order by up to 6 s, every 37th 40 s late."""
    return [(keys[(i * 7) % len(keys)], i % 13, BASE + i * 0.5 + (i * 5) % 7 - 3 - (40.0 if i % 37 == 36 else 0.0))
            for i in range(n)]


def expected(records: list[tuple[Any, int, float]], final_watermark: float) -> dict[str, Counter]:
    marks = watermarks([ts for *_, ts in records], ALLOWED_LATENESS)
    rows = [(k, v, ts, w) for (k, v, ts), w in zip(records, marks)]
    json_key = lambda key: json.loads(json.dumps(key))  # noqa: E731 - a window's key is sent as its JSON value
    out = {}
    kinds = (("tumbling", TUMBLING, count(), 0.0), ("sessions", SESSIONS, sum_of(), 1.0))
    for name, kind, aggregate, lateness in kinds:
        result = reference_windows(rows, kind, aggregate, lateness=lateness, final_watermark=final_watermark)
        out[name] = Counter((repr(json_key(k)), w.start, w.end, n) for k, w, n in result.outputs)
    out["late"] = Counter(repr(kv) for kv in reference_windows(rows, TUMBLING, count()).late)
    return out


def sent(driver: TaskTestDriver) -> dict[str, Counter]:
    out = {name: Counter((repr(k), v["start"], v["end"], v["value"]) for k, v in driver.outputs(name))
           for name in ("tumbling", "sessions")}
    out["late"] = Counter(repr(kv) for kv in driver.outputs("late"))
    return out


def test_windows_with_an_int_timer_key_serde_json_keys_and_the_tasks_own_int_timers(tmp_path: Path) -> None:
    records = stream(200, ["k0", 7, ("a", 1), "k1"])
    with TaskTestDriver(WithOwnTimers, job=job(tmp_path, "int")) as driver:
        for i, (key, value, ts) in enumerate(records):
            driver.send("events", key, value, timestamp=ts)
            if i == 90:
                driver.commit()
            if i == 120:
                driver.crash()
                driver.restart()
        driver.advance_event_time(BASE + 10_000)
        driver.commit()
        assert sent(driver) == expected(records, BASE + 10_000)
        assert Counter(driver.outputs("own")) == Counter({(value, ts + 5) for _, value, ts in records})
        assert list(driver.store(TIMER_STORE).all()) == []


def test_two_aggregations_on_one_store_are_a_config_error(tmp_path: Path) -> None:
    class Twice(StreamTask):
        def init(self, context: Any) -> None:
            WindowedAggregation(context, TUMBLING, count(), store="counts", output="a")
            WindowedAggregation(context, Tumbling(60), count(), store="counts", output="b")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            raise AssertionError("not reached")

    with pytest.raises(ConfigError) as caught:
        TaskTestDriver(Twice, job=job(tmp_path))
    assert "'windows:counts'" in str(caught.value) and "store each" in caught.value.hint


def legacy_key(namespace: str, key_bytes: bytes) -> str:
    """The timer key the windows registered before namespaces: the namespace for an aligned window,
    ``namespace|<key as text>`` for a session (a str as it is, anything else NUL + sorted JSON)."""
    if namespace.startswith("windows:counts"):
        return namespace
    key = json.loads(key_bytes)
    return f"{namespace}|" + (key if isinstance(key, str) else "\x00" + json.dumps(key, sort_keys=True))


def rewrite_as_before_namespaces(driver: TaskTestDriver, serde: Serde) -> Counter:
    """Turn every window timer of the driver's timer store into the entry the windows wrote before
    namespaces (the task's own timer, the key in ``serde``) and commit: the store a job had then.
    Returns how many of each namespace."""
    store = driver.store(TIMER_STORE)
    with store.all() as entries:
        current = [entry for entry, _ in entries]
    namespaces: Counter = Counter()
    for entry in current:
        domain = "event" if entry[:1] == PREFIX["event"] else "processing"
        cut = 10 + entry[9]
        namespace = entry[10:cut].decode()
        namespaces[namespace] += 1
        store.put(OLD_PREFIX[domain] + entry[1:9] + serde.serialize(legacy_key(namespace, entry[cut:])), b"")
        store.delete(entry)
    driver.commit()
    return namespaces


@pytest.mark.parametrize("serde_name, serde", [("json", JsonSerde()), ("string", StringSerde())])
def test_window_state_from_before_namespaces_closes_exactly_once_through_a_forwarding_task(
        tmp_path: Path, serde_name: str, serde: Serde) -> None:
    records = stream(300, ["k0", "k1", "k2", 7, ("a", 1)] if serde_name == "json" else ["k0", "k1", "k2", "k3"])
    half = 150
    with TaskTestDriver(Forwarding, job=job(tmp_path, serde_name)) as driver:
        for key, value, ts in records[:half]:
            driver.send("events", key, value, timestamp=ts)
        driver.commit()
        stored = rewrite_as_before_namespaces(driver, serde)
        assert set(stored) == {"windows:counts", "windows:sessions"}
        driver.crash()
        driver.restart()                                            # the migration: they are the task's own now
        assert driver.instances[0].time.migrated == stored.total()
        for key, value, ts in records[half:]:                       # records join the windows left open
            driver.send("events", key, value, timestamp=ts)
        driver.advance_event_time(BASE + 10_000)
        driver.commit()
        forwarded = driver.instances[0].task.forwarded
        assert len(forwarded) == stored.total() and any(closed for *_, closed in forwarded)
        assert sent(driver) == expected(records, BASE + 10_000)
        assert list(driver.store(TIMER_STORE).all()) == []
