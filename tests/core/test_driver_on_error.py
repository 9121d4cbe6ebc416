"""Bad-record policies (``on_error``) through the TaskTestDriver, without Spark: the driver feeds
records through the same loop as the Spark executors (TaskInstance.feed)."""

from __future__ import annotations

import pytest

from localstate import InputRecord, KeyValueStore, StreamTask, TaskTestDriver
from localstate.errors import ConfigError, InputError

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


class Count(StreamTask):
    def init(self, context):
        self.counts = context.kv("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        collector.send("seen", envelope.key, envelope.offset)


def test_fail_is_the_default_and_names_the_record():
    with TaskTestDriver(Count, stores=STORES) as driver:
        driver.send("clicks", "a", 1, partition=0)
        with pytest.raises(InputError) as info:
            driver.send_bad("clicks", raw="{not json", error="invalid JSON")
        assert info.value.context == {"stream": "clicks", "partition": 0, "offset": 1}
        assert "invalid JSON" in str(info.value) and "{not json" in str(info.value)
        assert "on_error" in info.value.hint
        assert driver.instances[0].position("clicks") == 1  # the bad record is not consumed


def test_skip_counts_the_record_as_consumed_and_keeps_going(caplog):
    with TaskTestDriver(Count, stores=STORES, inputs={"clicks": {"on_error": "skip"}}) as driver:
        driver.send("clicks", "a", 1, partition=0)
        bad = driver.send_bad("clicks", raw="\x00garbage", error="undecodable")
        driver.send("clicks", "a", 2, partition=0)
        driver.commit()
        assert bad.offset == 1
        assert driver.store("counts").get("a") == 2
        assert driver.outputs("seen") == [("a", 0), ("a", 2)]
        assert driver.instances[0].position("clicks") == 3
        assert "skipping bad record of clicks[0] at offset 1" in caplog.text


def test_dead_letter_writes_the_bad_record_at_commit_and_survives_a_crash():
    with TaskTestDriver(Count, stores=STORES,
                        inputs={"clicks": {"on_error": "dead_letter", "dead_letter": "bad"}}) as driver:
        driver.feed("clicks", [InputRecord(0, "a", 1), InputRecord(0, None, None, error="no key", raw="\udc80x"),
                               InputRecord(0, "b", 1)])
        assert driver.outputs("bad") == []                       # delivered at commit, like any output
        assert len(driver.outputs("bad", pending=True)) == 1
        driver.crash()
        driver.restart()                                          # uncommitted: replayed, dead-lettered once
        driver.commit()
        [(key, letter)] = driver.outputs("bad")
        assert key is None
        assert letter == {"stream": "clicks", "partition": 0, "offset": 1, "error": "no key", "raw": "\\udc80x"}
        assert driver.store("counts").get("a") == 1 and driver.store("counts").get("b") == 1


def test_declare_input_rejects_a_dead_letter_policy_without_output():
    with TaskTestDriver(Count, stores=STORES) as driver:
        with pytest.raises(ConfigError):
            driver.declare_input("clicks", on_error="dead_letter")
        with pytest.raises(ConfigError):
            driver.declare_input("clicks", on_error="ignore")


class WantsKV(StreamTask):
    def init(self, context):
        self.store = context.kv("tops")

    def process(self, envelope, collector, coordinator):
        pass


def test_typed_store_accessor_checks_the_engine():
    with TaskTestDriver(Count, stores=STORES) as driver:
        assert isinstance(driver.store("counts"), KeyValueStore)
    heap = {"tops": {"engine": "heap", "key_serde": "string", "value_serde": "json"}}
    with pytest.raises(ConfigError) as info:
        TaskTestDriver(WantsKV, stores=heap)
    assert "as a KeyValueStore" in str(info.value)
