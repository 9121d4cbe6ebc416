"""An idle continuous task waits on its Kafka input with a long-poll fetch
(:class:`~localstate.core.stream.WaitableInput`), on a real broker (Tansu): the wait returns False
after its timeout on an idle topic without spinning, True once a record past a position arrives, and
never for records below the positions."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.config import parse_job_config
from localstate.core.options import validate_options
from localstate.core.stream import FollowedInput, WaitableInput, open_input
from localstate.errors import InputError

pytestmark = pytest.mark.kafka


def _settings(servers: str) -> dict[str, Any]:
    return client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "test"))


def _records(partition: int, count: int) -> list[tuple[bytes, bytes, int]]:
    return [(json.dumps(f"k{i}").encode(), json.dumps({"i": i}).encode(), partition) for i in range(count)]


def _input(tmp_path: Path, servers: str, topic: str, partitions: int) -> Any:
    job = parse_job_config({
        "job": {"name": "kafka-wait", "partitions": partitions, "task": "m:T"},
        "inputs": {"events": {"system": "kafka", "bootstrap_servers": servers, "topic": topic,
                              "key_serde": "json", "value_serde": "json", "connect_timeout": "1s"}},
    }, base_dir=tmp_path)
    return open_input(job, "events")


def _topic_input(tmp_path: Path, kafka_broker: Any, topic: str, per_partition: tuple[int, int]) -> tuple[Any, Any]:
    """A two-partition topic holding ``per_partition`` records (partition 0, partition 1) and the job
    input on it: ``(settings, input)``."""
    settings = _settings(kafka_broker.bootstrap_servers)
    assert ensure_topic(settings, topic, 2, -1, create=True) == 2
    produce(settings, topic, _records(0, per_partition[0]) + _records(1, per_partition[1]))
    return settings, _input(tmp_path, kafka_broker.bootstrap_servers, topic, 2)


def test_wait_is_quiet_when_idle_and_wakes_on_a_record_past_the_positions(tmp_path: Path, kafka_broker,
                                                                          topic_prefix) -> None:
    topic = topic_prefix + "wait"
    settings, source = _topic_input(tmp_path, kafka_broker, topic, (5, 3))
    assert isinstance(source, WaitableInput)
    try:
        # Records below the positions are not a reason to wake; a record at a position is.
        assert source.wait_for_records({0: 4, 1: 3}, 30.0)
        assert source.wait_for_records({0: 5, 1: 0}, 30.0)

        # Idle: False after the timeout, with the fetch waiting at the broker rather than the
        # caller spinning (a busy loop would use about as much CPU as the wait lasts). The wait runs
        # on the calling thread (a consumer assigned by hand has no background thread), so that
        # thread's CPU time is the measure: the process's also counts every other thread the test
        # process has (clients of earlier tests, the xdist worker's own).
        cpu = time.thread_time()
        assert not source.wait_for_records({0: 5, 1: 3}, 2.0)
        assert time.thread_time() - cpu < 0.5

        # A record produced during the wait wakes it (True: the timeout is only the test's bound).
        producer = threading.Timer(0.3, produce, (settings, topic, _records(1, 1)))
        producer.start()
        try:
            assert source.wait_for_records({0: 5, 1: 3}, 60.0)
        finally:
            producer.join()
        assert not source.wait_for_records({0: 5, 1: 4}, 0.3)
    finally:
        source.close()


def test_wait_raises_a_typed_error_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    source = _input(tmp_path, "127.0.0.1:1", "nowhere", 1)
    with pytest.raises(InputError):
        source.wait_for_records({0: 0}, 0.2)
    source.close()


def test_a_followed_input_reads_what_its_follower_fetched_and_sees_rollbacks(tmp_path: Path, kafka_broker,
                                                                              topic_prefix) -> None:
    """A continuous task follows its Kafka input (:class:`~localstate.core.stream.FollowedInput`): the
    end comes from the follower's fetches (no end probe), ``read`` hands out the records it fetched,
    records arriving later are found by the next ``follow_end``, and a position outside what it
    follows (a rollback to a checkpoint, a read by a planned batch) reads the same records."""
    topic = topic_prefix + "follow"
    settings, source = _topic_input(tmp_path, kafka_broker, topic, (7, 2))
    assert isinstance(source, FollowedInput)
    try:
        assert source.follow_end({0: 3}) == {0: 7}
        assert [r.value["i"] for r in source.read(0, 3, 7)] == [3, 4, 5, 6]
        assert source.follow_end({1: 0}) == {1: 2}  # a second partition joins the same follower
        assert source.follow_end({0: 7}) == {0: 7}  # caught up: nothing made up

        produce(settings, topic, [(json.dumps("k").encode(), json.dumps({"i": 7 + i}).encode(), 0)
                                  for i in range(5)])
        assert source.wait_for_records({0: 7, 1: 2}, 60.0)  # what the wait fetched is kept for the read
        end = source.follow_end({0: 7})[0]
        assert 7 < end <= 12
        assert [r.value["i"] for r in source.read(0, 7, end)] == list(range(7, end))

        # A rollback (a reopen at an older checkpoint) reads the same records again, in order.
        assert source.follow_end({0: 2}) == {0: 12}
        assert [r.value["i"] for r in source.read(0, 2, 12)] == list(range(2, 12))
        assert [r.value["i"] for r in source.read(1, 0, 2)] == [0, 1]
    finally:
        source.close()
