"""Timers stored before timer namespaces keep firing: a timer store in the old layout (``b"e"/b"p" |
timestamp | key``, written here with the old encoding) is rewritten into namespace ``""`` when the
partition opens, in chunks, through the store's own writes: each timer fires exactly once, through
the task's on_timer, across a crash before the first commit (with spills of the migration's writes
before it) and across later restarts, on every backend."""

from __future__ import annotations

import pytest

from localstate.core import config as config_module
from localstate.core.serdes import JsonSerde, StringSerde
from localstate.core.task import StreamTask
from localstate.core.time import TIMER_STORE
from localstate.errors import ConfigError
from localstate.runtime.partition import timer_entries
from localstate.runtime.partition.timer_entries import OLD_PREFIX, PREFIX, encode_timestamp
from localstate.testing.driver import TaskTestDriver


class Fired(StreamTask):
    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        self.timers.register_event_time(envelope.key, envelope.value)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, [self.timers.firing_domain, timestamp])


class NoOnTimer(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass


OLD_TIMERS = [("event", "a", 5.0), ("event", ["x", 1], 5.0), ("event", "b", -2.5), ("event", 7, 30.0),
              ("processing", "p", 4.0), ("processing", {"k": None}, 1.0), ("event", "é\n", 12.0)]


def old_entry(domain: str, key, timestamp: float, serde=JsonSerde()) -> bytes:
    """A timer store key as the timers before namespaces wrote it."""
    return OLD_PREFIX[domain] + encode_timestamp(timestamp) + serde.serialize(key)


def expected(timers) -> list:
    """Event time first, then processing time, each in (timestamp, encoded key) order."""
    out = []
    for domain in ("event", "processing"):
        mine = sorted((ts, JsonSerde().serialize(key), key) for d, key, ts in timers if d == domain)
        out += [(key, [domain, ts]) for ts, _, key in mine]
    return out


def write_old_store(d: TaskTestDriver, timers, serde=JsonSerde()) -> None:
    """Commit ``timers`` into the driver's timer store in the old layout, then reopen the partition."""
    store = d.store(TIMER_STORE)
    for domain, key, ts in timers:
        store.put(old_entry(domain, key, ts, serde), b"")
    d.commit()
    d.crash()
    d.restart()


def layouts(d: TaskTestDriver) -> dict[bytes, int]:
    counts: dict[bytes, int] = {}
    with d.store(TIMER_STORE).all() as entries:
        for entry, _ in entries:
            counts[entry[:1]] = counts.get(entry[:1], 0) + 1
    return counts


def stored_timers(d: TaskTestDriver) -> list[tuple[str, bytes, bytes]]:
    """Every timer of the store as (domain, timestamp, key bytes), whatever its layout (one per entry)."""
    out = []
    with d.store(TIMER_STORE).all() as entries:
        for entry, _ in entries:
            new = entry[:1] in PREFIX.values()
            domain = "event" if entry[:1] in (PREFIX["event"], OLD_PREFIX["event"]) else "processing"
            out.append((domain, entry[1:9], entry[10:] if new else entry[9:]))
    return sorted(out)


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "memory"])
@pytest.mark.parametrize("write_batch", [2, None])
def test_old_timers_are_migrated_on_open_and_fire_exactly_once_across_a_crash(monkeypatch, tmp_path, backend,
                                                                              write_batch) -> None:
    """A crash before the first commit after the migration: the next open migrates again and each
    timer fires once. With a write batch of 2 the migration's writes spill while the partition opens,
    and the checkpoint the open takes covers what spilled: a spill holds the rewritten entries before
    the deletions of the old ones (put_many before delete_all), so every timer is stored in one layout
    or both, never neither, and the next open's rewrite of it is the same entry."""
    if write_batch is not None:
        monkeypatch.setattr(config_module, "TIMER_WRITE_BATCH", write_batch)
    monkeypatch.setattr(timer_entries, "MIGRATE_CHUNK", 3)
    all_timers = sorted((domain, encode_timestamp(ts), JsonSerde().serialize(key)) for domain, key, ts in OLD_TIMERS)
    with TaskTestDriver(Fired, time={"timers": True, "timer_backend": backend}, state_dir=tmp_path) as d:
        write_old_store(d, OLD_TIMERS)
        assert d.instances[0].time.migrated == len(OLD_TIMERS)
        assert (d.store(TIMER_STORE).spills > 0) == (write_batch is not None)
        d.advance_event_time(6.0)
        assert len(d.outputs("fired", pending=True)) == 3           # fired, not committed
        d.crash()
        d.restart()                                                 # rolled back to the open's checkpoint
        if write_batch is None:
            assert d.instances[0].time.migrated == len(OLD_TIMERS)  # nothing of the migration was committed
        assert d.outputs("fired", pending=True) == []
        assert sorted(set(stored_timers(d))) == all_timers          # each timer stored, in the new layout
        assert layouts(d) == {PREFIX["event"]: 5, PREFIX["processing"]: 2}
        d.advance_event_time(100.0)
        d.advance(10)
        d.commit()
        assert layouts(d) == {}
        d.crash()
        d.restart()
        assert d.instances[0].time.migrated == 0
        d.advance_event_time(1000.0)
        d.advance(1000)
        d.commit()
        assert d.outputs("fired") == expected(OLD_TIMERS)


def test_a_committed_migration_is_new_layout_only_and_new_timers_interleave_with_it() -> None:
    with TaskTestDriver(Fired, time={"timers": True, "timer_backend": "rocksdb"}) as d:
        write_old_store(d, OLD_TIMERS)
        d.commit()
        assert layouts(d) == {PREFIX["event"]: 5, PREFIX["processing"]: 2}
        d.send("in", "a", 5.0, timestamp=0.0)                      # the same timer as a migrated one: kept once
        d.send("in", "new", 6.0, timestamp=0.0)
        d.advance_event_time(100.0)
        d.advance(10)
        d.commit()
        assert d.outputs("fired") == expected([*OLD_TIMERS, ("event", "new", 6.0)])


def test_old_timers_of_a_string_key_serde_migrate_too() -> None:
    timers = [("event", "k1", 2.0), ("event", "k0", 2.0), ("processing", "", 1.0)]
    with TaskTestDriver(Fired, time={"timers": True, "timer_key_serde": "string"}) as d:
        write_old_store(d, timers, StringSerde())
        d.advance_event_time(10.0)
        d.advance(5)
        d.commit()
        assert d.outputs("fired") == [("k0", ["event", 2.0]), ("k1", ["event", 2.0]), ("", ["processing", 1.0])]


def test_old_timers_of_a_task_without_on_timer_stop_the_firing_with_a_config_error() -> None:
    """Say, a task that forwarded on_timer to its windows and dropped the forwarding too early."""
    with TaskTestDriver(NoOnTimer, time={"timers": True}) as d:
        write_old_store(d, [("event", "windows:counts", 10.0)])
        with pytest.raises(ConfigError) as caught:
            d.advance_event_time(20.0)
        assert "'windows:counts'" in str(caught.value) and "forward" in caught.value.hint
        assert caught.value.problems[0].path == "job.task"
        assert layouts(d) == {PREFIX["event"]: 1}                   # left in the store
        d.crash()
