"""Timers and the watermark on the real stores, through the TaskTestDriver and the TaskInstance:
firing once, in order, deduplicated; deletes; timers registered while firing; the watermark's
monotonicity and its checkpointing; processing time; bad config and misuse as typed errors."""

from __future__ import annotations

import json
import random
import struct

import pytest

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import parse_job_config
from localstate.core.time import TIMER_STORE, TIMER_WRITE_BATCH
from localstate.core.task import BatchTask, StreamTask
from localstate.core.time import EVENT_TIME, PROCESSING_TIME, Timers
from localstate.errors import ConfigError, InvalidValueError
from localstate.runtime.partition import timer_entries
from localstate.runtime.partition import timers as timer_module
from localstate.runtime.partition.timers import decode_timestamp, encode_timestamp
from localstate.testing.driver import TaskTestDriver

TIMERS = {"timers": True, "allowed_lateness": "2s", "timer_backend": "rocksdb"}


class Scheduler(StreamTask):
    """Input value: ``["event" | "processing" | "delete-event", timestamp]`` for the record's key."""

    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        what, ts = envelope.value
        if what == "event":
            self.timers.register_event_time(envelope.key, ts)
        elif what == "processing":
            self.timers.register_processing_time(envelope.key, ts)
        elif what == "delete-event":
            self.timers.delete_event_time(envelope.key, ts)
        elif what == "delete-processing":
            self.timers.delete_processing_time(envelope.key, ts)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, [self.timers.firing_domain, timestamp])


def driver(task=Scheduler, time=TIMERS, **kwargs) -> TaskTestDriver:
    return TaskTestDriver(task, time=time, **kwargs)


def test_event_time_timers_fire_once_in_timestamp_order_deduplicated() -> None:
    with driver() as d:
        d.send("in", "b", ["event", 30.0], timestamp=1.0)
        d.send("in", "a", ["event", 30.0], timestamp=1.0)
        d.send("in", "c", ["event", 10.0], timestamp=1.0)
        d.send("in", "c", ["event", 10.0], timestamp=1.0)       # the same timer: kept once
        d.send("in", "c", ["event", -5.5], timestamp=1.0)       # negative times order too
        assert d.outputs("fired", pending=True) == [("c", ["event", -5.5])]  # watermark -1.0 reached it
        d.send("in", "x", ["none", 0], timestamp=12.0)           # watermark 10: c@10 is due
        assert d.outputs("fired", pending=True)[1:] == [("c", ["event", 10.0])]
        d.advance_event_time(100.0)
        d.commit()
        assert d.outputs("fired") == [("c", ["event", -5.5]), ("c", ["event", 10.0]), ("a", ["event", 30.0]),
                                      ("b", ["event", 30.0])]
        d.advance_event_time(1000.0)
        d.commit()
        assert len(d.outputs("fired")) == 4                      # each fired once


def test_deleted_timers_do_not_fire_and_deleting_an_absent_one_is_harmless() -> None:
    with driver() as d:
        d.send("in", "a", ["event", 50.0], timestamp=1.0)
        d.send("in", "b", ["event", 50.0], timestamp=1.0)
        d.send("in", "a", ["delete-event", 50.0], timestamp=1.0)
        d.send("in", "z", ["delete-event", 7.0], timestamp=1.0)
        d.send("in", "p", ["processing", 5.0], timestamp=1.0)
        d.send("in", "p", ["delete-processing", 5.0], timestamp=1.0)
        d.advance(10)
        d.advance_event_time(60.0)
        d.commit()
        assert d.outputs("fired") == [("b", ["event", 50.0])]


def test_processing_time_timers_follow_the_drivers_clock() -> None:
    with driver() as d:
        d.send("in", "late", ["processing", 9.0], timestamp=1.0)
        d.send("in", "soon", ["processing", 4.0], timestamp=1.0)
        d.advance(3)
        assert d.outputs("fired", pending=True) == []
        d.advance_processing_time(1)
        assert d.outputs("fired", pending=True) == [("soon", ["processing", 4.0])]
        d.advance(10)
        d.commit()
        assert d.outputs("fired") == [("soon", ["processing", 4.0]), ("late", ["processing", 9.0])]


class Chain(StreamTask):
    """Each firing registers the next timer 1s later (due already when the watermark is far ahead),
    and one in the past; both fire in the same round, in timestamp order."""

    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        self.timers.register_event_time(envelope.key, envelope.value)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, timestamp)
        if timestamp < 104 and key != "past":
            self.timers.register_event_time(key, timestamp + 1)
        if timestamp == 102 and key in ("k", "k0"):
            self.timers.register_event_time("past", 50.0)        # before the watermark: fires next


def test_timers_registered_while_firing_that_are_due_fire_in_the_same_round_in_order() -> None:
    with driver(Chain) as d:
        d.send("in", "k", 100.0, timestamp=0.0)
        d.send("in", "other", 103.5, timestamp=0.0)
        d.advance_event_time(200.0)
        fired = d.outputs("fired", pending=True)
        assert fired == [("k", 100.0), ("k", 101.0), ("k", 102.0), ("past", 50.0), ("k", 103.0),
                         ("other", 103.5), ("k", 104.0), ("other", 104.5)]


def test_a_firing_reads_its_chunks_across_scans(monkeypatch) -> None:
    monkeypatch.setattr(timer_module, "SCAN_CHUNK", 3)
    with driver(Chain) as d:
        for i in range(10):
            d.send("in", f"k{i}", 100.0 + i * 0.1, timestamp=0.0)
        d.advance_event_time(1000.0)
        fired = d.outputs("fired", pending=True)
        expected = []
        for i in range(10):
            ts = 100.0 + i * 0.1
            expected.append((ts, f"k{i}"))
            while ts < 104:  # as the task adds them
                ts += 1
                expected.append((ts, f"k{i}"))
        expected.sort()
        expected.insert(expected.index((102.0, "k0")) + 1, (50.0, "past"))
        assert [(ts, key) for key, ts in fired] == expected


class Counted(BatchTask):
    """Counts per key and 10s window (state keyed by window: a batch may hold records of the next
    window before the previous one's timer fires at the batch's end)."""

    def init(self, context):
        self.timers = context.timers
        self.counts = context.kv("counts")
        self.store_names = set(context.stores)

    def process_batch(self, batch, collector, coordinator):
        for key, ts in zip(batch.column("key").to_pylist(), batch.column("timestamp").to_pylist()):
            end = (ts // 10 + 1) * 10                                    # the end of the record's window
            self.counts.put(f"{key}@{end}", (self.counts.get(f"{key}@{end}") or 0) + 1)
            self.timers.register_event_time(key, end)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("windows", key, [timestamp, self.counts.get(f"{key}@{timestamp}")])
        self.counts.delete(f"{key}@{timestamp}")


def test_a_batch_task_gets_timers_and_the_watermark_from_its_batches() -> None:
    stores = {"counts": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int"}}
    with driver(Counted, stores=stores) as d:
        d.send_batch("in", ["a", "b", "a"], [1, 1, 1], timestamps=[1.0, 3.0, 5.0])
        assert d.watermark() == 3.0
        d.send_batch("in", ["a"], [1], timestamps=[13.0])        # watermark 11: the [0, 10) windows end
        d.commit()
        assert d.outputs("windows") == [("a", [10.0, 2]), ("b", [10.0, 1])]
        assert d.instances[0].task.store_names == {"counts"}             # the timer store is internal


def test_the_watermark_never_goes_back_and_is_checkpointed(tmp_path) -> None:
    with driver(state_dir=tmp_path) as d:
        assert d.watermark() is None
        d.send("in", "a", ["none", 0], timestamp=100.0)
        assert d.watermark() == 98.0
        d.send("in", "a", ["none", 0], timestamp=50.0)            # late: the watermark stays
        assert d.watermark() == 98.0
        d.commit()
        d.send("in", "a", ["none", 0], timestamp=200.0)           # not committed
        assert d.watermark() == 198.0
        saved = Checkpoint.from_json((tmp_path / "test-job" / "checkpoints" / "0.json").read_text(), "test")
        assert saved.watermark == 98.0
        d.crash()
        d.restart()                                               # replays the record at 200
        assert d.watermark() == 198.0
        d.crash()
        d.inputs.clear()
        d.restart()                                               # nothing to replay: the checkpoint's
        assert d.watermark() == 98.0
        d.send("in", "a", ["none", 0], timestamp=60.0)
        assert d.watermark() == 98.0


def test_timers_survive_a_restart_and_uncommitted_firings_fire_again() -> None:
    with driver() as d:
        d.send("in", "a", ["event", 10.0], timestamp=1.0)
        d.send("in", "b", ["event", 20.0], timestamp=1.0)
        d.commit()
        d.advance_event_time(15.0)
        assert d.outputs("fired", pending=True) == [("a", ["event", 10.0])]
        d.crash()
        d.restart()                                               # the firing was not committed
        assert d.outputs("fired", pending=True) == []
        d.advance_event_time(30.0)
        d.commit()
        d.crash()
        d.restart()
        d.advance_event_time(100.0)
        d.commit()
        assert d.outputs("fired") == [("a", ["event", 10.0]), ("b", ["event", 20.0])]


def test_old_checkpoints_without_a_watermark_still_load() -> None:
    text = json.dumps({"format": 1, "partition": 0, "generation": 3, "inputs": {"in": 5}, "changelogs": {}})
    checkpoint = Checkpoint.from_json(text, "old")
    assert checkpoint.watermark is None and checkpoint.next_timer is None
    assert "watermark" not in checkpoint.to_json()
    again = Checkpoint.from_json(Checkpoint(0, watermark=12.5, next_timer=3.0).to_json(), "new")
    assert (again.watermark, again.next_timer) == (12.5, 3.0)


@pytest.mark.parametrize("bad", ['"soon"', "NaN", "[1]"])
def test_a_corrupt_checkpoint_watermark_is_a_checkpoint_error(bad: str) -> None:
    from localstate.errors import CheckpointError

    text = '{"format": 1, "partition": 0, "inputs": {}, "changelogs": {}, "watermark": %s}' % bad
    with pytest.raises(CheckpointError, match="watermark"):
        Checkpoint.from_json(text, "bad")


def test_the_timestamp_encoding_preserves_order() -> None:
    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, -1.0, 1e-300, -1e-300, 1.7e9, -1.7e9, 5e-324, 1e308, -1e308]
    values += [rng.uniform(-1e10, 1e10) for _ in range(2000)]
    encoded = sorted(values, key=encode_timestamp)
    assert encoded == sorted(values)
    for value in values:
        assert decode_timestamp(encode_timestamp(value)) == value
        assert len(encode_timestamp(value)) == 8
    assert encode_timestamp(-0.0) == encode_timestamp(0.0)
    assert struct.unpack(">d", struct.pack(">d", decode_timestamp(encode_timestamp(-0.0))))[0] == 0.0


def test_context_timers_is_the_timers_protocol_and_the_stores_time_source() -> None:
    stores = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}
    with driver(Counted, stores=stores) as d:
        instance = d.instances[0]
        assert isinstance(instance.time, Timers)
        assert instance.stores["counts"].engine.context.time is instance.time
        assert TIMER_STORE in instance.stores
        assert instance.time.firing_domain is None
        assert {EVENT_TIME, PROCESSING_TIME} == {"event", "processing"}


# -- bad config and misuse ---------------------------------------------------------------------------

def parse(time: dict, stores: dict | None = None):
    return parse_job_config({"job": {"name": "j", "task": "m:T"}, "time": time, "stores": stores or {}})


@pytest.mark.parametrize("lateness", [0, "0s", -1, "-5s", "soon"])
def test_a_zero_or_negative_lateness_is_a_config_error_naming_the_option(lateness) -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"allowed_lateness": lateness})
    assert [p.path for p in caught.value.problems] == ["time.allowed_lateness"]


@pytest.mark.parametrize("time, path", [
    ({"timers": "yes"}, "time.timers"),
    ({"timers": True, "past_timers": "later"}, "time.past_timers"),
    ({"timers": True, "timer_backend": "berkeley"}, "time.timer_backend"),
    ({"timers": True, "timer_key_serde": "nope"}, "time.timer_key_serde"),
    ({"timers": True, "timer_changelog": "bad/name"}, "time.timer_changelog"),
    ({"timer_backend": "lmdb"}, "time.timer_backend"),             # timers are off: the key does nothing
    ({"timers": True, "lateness": "1s"}, "time.lateness"),
])
def test_bad_time_config_is_reported_at_its_key(time: dict, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(time)
    assert path in [p.path for p in caught.value.problems]


def test_the_timer_store_name_is_reserved() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({}, {TIMER_STORE: {"engine": "kv"}})
    assert f"stores.{TIMER_STORE}" in [p.path for p in caught.value.problems]


def test_the_timer_store_is_a_logged_kv_store_of_the_job() -> None:
    job = parse({"timers": True, "timer_backend": "lmdb"})
    store = job.stores[TIMER_STORE]
    assert (store.engine, store.options["backend"], store.changelog) == ("kv", "lmdb", "j-timers-changelog")
    assert (store.options["cache_size"], store.options["write_batch_size"]) == (0, TIMER_WRITE_BATCH)
    assert job.time.allowed_lateness == 0.0 and parse({"allowed_lateness": "1m"}).time.allowed_lateness == 60.0


def test_registering_a_timer_without_timers_enabled_names_what_to_add() -> None:
    with driver(time={}) as d:
        with pytest.raises(ConfigError) as caught:
            d.send("in", "a", ["event", 1.0], timestamp=0.0)
    assert caught.value.problems[0].path == "time.timers"
    assert "timers = true" in caught.value.hint


class NoCallback(StreamTask):
    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        self.timers.register_event_time(envelope.key, 5.0)


def test_a_task_that_registers_timers_without_on_timer_is_refused() -> None:
    with driver(NoCallback) as d:
        with pytest.raises(ConfigError) as caught:
            d.send("in", "a", 1, timestamp=0.0)
    assert caught.value.problems[0].path == "job.task" and "on_timer" in caught.value.hint


def test_a_past_timer_fires_next_by_default_and_is_refused_when_the_policy_forbids_it() -> None:
    with driver() as d:
        d.send("in", "a", ["none", 0], timestamp=100.0)
        d.send("in", "a", ["event", 10.0], timestamp=100.0)       # before the watermark (98): fires next
        assert d.outputs("fired", pending=True) == [("a", ["event", 10.0])]
    with driver(time={**TIMERS, "past_timers": "error"}) as d:
        d.send("in", "a", ["none", 0], timestamp=100.0)
        d.send("in", "b", ["event", 98.0], timestamp=100.0)       # at the watermark: allowed
        with pytest.raises(ConfigError) as caught:
            d.send("in", "a", ["event", 10.0], timestamp=100.0)
        assert caught.value.problems[0].path == "time.past_timers"
        d.advance(50)
        with pytest.raises(ConfigError, match="processing"):
            d.send("in", "a", ["processing", 10.0], timestamp=100.0)


@pytest.mark.parametrize("ts", [float("nan"), float("inf"), "10", None, True])
def test_a_timer_needs_a_finite_timestamp(ts) -> None:
    with driver() as d:
        with pytest.raises(InvalidValueError, match="finite timestamp"):
            d.send("in", "a", ["event", ts], timestamp=0.0)


class Failing(Scheduler):
    def on_timer(self, key, timestamp, collector, coordinator):
        raise RuntimeError("boom")


def test_an_on_timer_failure_is_a_task_error_naming_the_timer() -> None:
    from localstate.errors import TaskError

    with driver(Failing) as d:
        d.send("in", "a", ["event", 1.0], timestamp=0.0)
        with pytest.raises(TaskError) as caught:
            d.advance_event_time(5.0)
        assert "on_timer()" in str(caught.value) and "'a'" in str(caught.value)
        d.crash()


class SeesWatermark(StreamTask):
    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        collector.send("seen", envelope.timestamp, self.timers.watermark)


class SeesWatermarkBatch(BatchTask):
    def init(self, context):
        self.timers = context.timers

    def process_batch(self, batch, collector, coordinator):
        collector.send("seen", batch.num_rows, self.timers.watermark)


def test_a_task_sees_the_watermark_from_before_its_record_or_batch() -> None:
    with driver(SeesWatermark) as d:
        for ts in (10.0, 20.0, 15.0, 17.0):
            d.send("in", "k", None, timestamp=ts)
        assert d.outputs("seen", pending=True) == [(10.0, None), (20.0, 8.0), (15.0, 18.0), (17.0, 18.0)]
    with driver(SeesWatermarkBatch) as d:
        d.send_batch("in", ["a", "b"], [1, 2], timestamps=[10.0, 30.0])
        d.send_batch("in", ["a"], [1], timestamps=[12.0])
        assert d.outputs("seen", pending=True) == [(2, None), (1, 28.0)]


def test_timers_on_the_objectstore_changelog_with_pipelined_commits(tmp_path) -> None:
    options = {"url": str(tmp_path / "shared")}
    with driver(changelog="objectstore", changelog_options=options, state_dir=tmp_path / "state") as d:
        assert d.instances[0].pipelined
        for i in range(20):
            d.send("in", f"k{i % 4}", ["event", float(i)], timestamp=0.0)
        d.commit()
        d.advance_event_time(9.5)                                  # fires k0..k1 @0..9
        d.commit()
        d.advance_event_time(14.5)                                 # not committed: fires again later
        d.crash()
        d.restart()
        d.advance_event_time(100.0)
        d.commit()
        d.instances[0].settle_commit()
        fired = d.outputs("fired")
        assert [ts for _, (_, ts) in fired] == [float(i) for i in range(20)]
        assert [key for key, _ in fired] == [f"k{i % 4}" for i in range(20)]


def test_arrow_rows_move_the_watermark_of_a_batch_task_after_the_batch() -> None:
    """The DataFrame step's rows (ArrowRows) reach a BatchTask as they are; their timestamp column
    moves the watermark once the batch is processed, and its timers fire at the boundary."""
    from localstate.core.task import record_batch
    from localstate.runtime.partition.records import ArrowRows

    stores = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}
    with driver(Counted, stores=stores) as d:
        instance = d.instances[0]
        batch = record_batch(["df"] * 3, [0, 1, 2], ["a", "b", "a"], [1, 1, 1], [1.0, 4.0, 25.0])
        instance.feed([ArrowRows("df", batch, 0)])
        assert instance.time.watermark == 23.0
        instance.fire_timers()
        assert [(m.key, m.value) for m in instance.collector.pending] == [("a", [10.0, 1]), ("b", [10.0, 1])]


class FailsOnce(StreamTask):
    """Records each firing; the first firing of key ``"b"`` raises."""

    def init(self, context):
        self.fired = []
        self.failed = False

    def process(self, envelope, collector, coordinator):
        pass

    def on_timer(self, key, timestamp, collector, coordinator):
        if key == "b" and not self.failed:
            self.failed = True
            raise RuntimeError("boom")
        self.fired.append((key, timestamp))


@pytest.mark.parametrize("chunk", [2, 3, 100])
def test_a_round_stopped_by_a_failure_leaves_the_unfired_timers_of_its_chunk_in_the_store(
        tmp_path, monkeypatch, chunk) -> None:
    """A chunk's deletions are batched before its timers fire: the ones a failure kept from firing
    are put back, so a caller that goes on (without the restart that rolls back) still fires them."""
    from localstate.runtime.layout import open_changelog_system
    from localstate.errors import TaskError
    from localstate.runtime.partition.instance import TaskInstance

    monkeypatch.setattr(timer_module, "SCAN_CHUNK", chunk)
    job = parse_job_config({
        "job": {"name": "fails-once", "task": "unused:Unused", "state_dir": str(tmp_path)},
        "time": {"timers": True, "timer_backend": "rocksdb"}}, base_dir=tmp_path)
    changelogs = open_changelog_system(job)
    instance = TaskInstance(job, 0, changelogs, task_factory=FailsOnce)
    instance.open()
    try:
        for i, key in enumerate("abcde"):
            instance.time.register_event_time(key, 10.0 + i)
        instance.time.register_event_time(["a", 1], 10.5)  # a json key that is no string
        instance.commit()
        instance.time.advance_watermark(100.0)
        with pytest.raises(TaskError):
            instance.fire_timers()
        assert instance.task.fired == [("a", 10.0), (["a", 1], 10.5)]
        assert instance.fire_timers() == 3  # "b" was deleted as it fired; the rest were put back
        assert instance.task.fired[2:] == [("c", 12.0), ("d", 13.0), ("e", 14.0)]
        assert instance.fire_timers() == 0
        assert list(instance.stores[TIMER_STORE].engine.all()) == []
    finally:
        instance.close(commit=False)
        changelogs.close()


def test_a_chunk_whose_keys_the_fast_decoding_refuses_fires_through_the_serde(monkeypatch) -> None:
    """A json key the chunk-level decoding refuses is decoded by itself as it fires, through the same
    path as before batching (the others of its chunk are unaffected)."""
    monkeypatch.setattr(timer_entries, "json_decode_many", lambda texts: (_ for _ in ()).throw(ValueError("no")))
    with driver() as d:
        d.send("in", "k1", ["event", 5.0], timestamp=0.0)
        d.send("in", "k2", ["event", 6.0], timestamp=0.0)
        d.advance_event_time(50.0)
        assert d.outputs("fired", pending=True) == [("k1", ["event", 5.0]), ("k2", ["event", 6.0])]


def test_the_json_chunk_decoding_accepts_exactly_one_json_value_per_key() -> None:
    from localstate.core.serdes import JsonSerde

    keys = ["a", "é\n\"", 1, 1.5, True, None, ["x", {"b": 2, "a": 1}], {}]
    texts = [JsonSerde().serialize(k) for k in keys]
    assert timer_entries.json_decode_many(texts) == keys
    for bad in ([b"1,[2", b"3]"], [b"\"a\" "], [b"[1"], [b"nope"], [b""], [b"\xff"]):
        with pytest.raises((ValueError, StopIteration)):
            timer_entries.json_decode_many(bad)


def test_a_chunks_timestamps_decode_as_each_one_does() -> None:
    stamps = [-1e300, -1.5, -0.0, 0.0, 5e-324, 1.0, 1.7e9 + 0.25, 1e300, 2.0 ** 62]
    entries = [b"E" + encode_timestamp(ts) + b'\x00"k"' for ts in stamps]
    assert timer_entries.decode_timestamps(entries) == tuple(map(decode_timestamp, [e[1:9] for e in entries]))
    assert timer_entries.decode_timestamps(entries) == tuple(ts + 0.0 for ts in stamps)
    assert timer_entries.decode_timestamps([]) == ()
