"""The Kafka changelog system against a real Kafka-protocol broker (Tansu): the changelog contract
(append/flush/read/end_offset, tombstones, exact ranges, many records), topic creation and
checks, configuration and connection errors."""

from __future__ import annotations

import logging
import os
import time

import pytest

from localstate.changelog.kafka import KafkaChangelogSystem, check_cleanup_policy, client_settings
from localstate.changelog.kafka.devbroker import free_port
from localstate.core.options import validate_options
from localstate.errors import ChangelogError, ConfigError

pytestmark = pytest.mark.kafka


def kafka(broker, prefix: str, **options) -> KafkaChangelogSystem:
    return KafkaChangelogSystem({"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix, **options})


def pairs(records) -> list[tuple[bytes, bytes | None]]:
    return [(r.key, r.value) for r in records]


def test_append_flush_read_tombstones_and_exact_ranges(kafka_broker, topic_prefix):
    system = kafka(kafka_broker, topic_prefix)
    system.ensure_stream("log", 2)
    part = system.partition("log", 1)
    assert part.end_offset() == 0 and list(part.read()) == []
    part.append(b"a", b"1")
    part.append_many([(b"b", b""), (b"a", None), (b"", b"empty key"), (bytearray(b"c"), memoryview(b"3"))])
    assert part.end_offset() == 5                       # counts appended, unflushed records
    assert list(part.read()) == []                      # a writer reads only what it flushed
    first = part.flush()
    assert first == 5
    big = os.urandom(300_000)
    part.append(b"big", big)
    part.append(b"c", None)
    second = part.flush()
    assert second > first + 1                           # the transaction marker took an offset: a gap
    assert part.flush() == second == part.end_offset()  # nothing pending: same end
    everything = list(part.read())
    assert pairs(everything) == [(b"a", b"1"), (b"b", b""), (b"a", None), (b"", b"empty key"), (b"c", b"3"),
                                 (b"big", big), (b"c", None)]
    offsets = [r.offset for r in everything]
    assert offsets[:5] == [0, 1, 2, 3, 4] and offsets[-1] == second - 1
    for start, end in [(0, 0), (0, 1), (1, 3), (2, first), (first, second), (first, first + 1), (3, 10**9),
                       (second, second + 5), (offsets[5], offsets[6])]:
        assert [r.offset for r in part.read(start, end)] == [o for o in offsets if start <= o < end], (start, end)
    assert list(system.partition("log", 0).read()) == []  # co-partitioned: partition 0 untouched
    system.close()


def test_many_records_and_exact_end_for_a_fresh_writer_and_reader(kafka_broker, topic_prefix):
    system = kafka(kafka_broker, topic_prefix, batch_size="16KB")  # many producer batches per flush
    system.ensure_stream("many", 1)
    part = system.partition("many", 0)
    records = [(b"k%05d" % (i % 3000), None if i % 10 == 0 else b"v%d" % i) for i in range(20_000)]
    ends = []
    for i in range(0, len(records), 5000):
        part.append_many(records[i:i + 5000])
        ends.append(part.flush())
    read = list(part.read())
    assert pairs(read) == records
    assert read[-1].offset + 1 == ends[-1]
    part.close()
    system.close()

    # Nothing written in this process: the end must still be exact (not Tansu's ListOffsets answer).
    again = kafka(kafka_broker, topic_prefix)
    writer = again.partition("many", 0)
    assert writer.end_offset() == ends[-1]
    # Restore up to a checkpointed offset yields exactly the records before it.
    assert pairs(writer.read(0, ends[1])) == records[:10_000]
    assert pairs(writer.read(ends[1], ends[2])) == records[10_000:15_000]
    reader = again.reader("many", 0)
    assert reader.end_offset() == ends[-1] and pairs(reader.read(ends[2])) == records[15_000:]
    # The new writer continues after the end it found; a reader sees the new end.
    writer.append(b"next", b"1")
    assert writer.flush() == reader.end_offset() > ends[-1]
    assert pairs(writer.read(ends[-1])) == pairs(reader.read(ends[-1])) == [(b"next", b"1")]
    again.close()


def test_without_transactions_offsets_are_contiguous_and_end_found_past_a_multi_record_batch(kafka_broker,
                                                                                              topic_prefix):
    system = kafka(kafka_broker, topic_prefix, transactions=False)
    system.ensure_stream("plain", 1)
    part = system.partition("plain", 0)
    part.append_many((b"k%d" % i, b"x" * 50) for i in range(1000))
    assert part.flush() == 1000                         # no markers: the next offset
    part.append(b"k0", None)
    assert part.flush() == 1001
    part.close()
    # The last batch holds many records here, so the broker's ListOffsets may answer less than
    # the end (Tansu does); the end is found by reading forward to the high watermark.
    other = kafka(kafka_broker, topic_prefix, transactions=False)
    fresh = other.reader("plain", 0)
    assert fresh.end_offset() == 1001
    assert [r.offset for r in fresh.read(998)] == [998, 999, 1000]
    other.close()
    system.close()


def test_topic_is_created_compacted_and_checked(kafka_broker, topic_prefix):
    system = kafka(kafka_broker, topic_prefix)
    assert system.describe("orders") is None
    system.ensure_stream("orders", 3)
    assert system.describe("orders") == 3
    assert system.topic("orders") == f"{topic_prefix}orders"
    assert system.cleanup_policy("orders") == "compact"
    system.ensure_stream("orders", 3)                    # present and right: fine

    other = kafka(kafka_broker, topic_prefix)
    with pytest.raises(ChangelogError) as info:
        other.ensure_stream("orders", 4)
    text = str(info.value)
    assert "has 3 partitions but the job uses 4" in text and f"{topic_prefix}orders" in text
    assert "what to do" in text and "previous partition count" in text
    with pytest.raises(ChangelogError, match="partition 3 does not exist"):
        other.partition("orders", 3)

    assert system.delete_stream("orders") and system.describe("orders") is None
    assert not system.delete_stream("orders")

    strict = kafka(kafka_broker, topic_prefix, create_topics=False)
    with pytest.raises(ChangelogError) as info:
        strict.ensure_stream("absent", 2)
    assert "does not exist" in str(info.value) and "cleanup.policy=compact" in str(info.value)
    assert "create_topics = true" in str(info.value)
    for s in (system, other, strict):
        s.close()


def test_topic_with_a_delete_policy_is_refused_and_an_unreported_one_warned(kafka_broker, topic_prefix, caplog):
    from kafka.admin import NewTopic

    system = kafka(kafka_broker, topic_prefix)
    system.admin().create_topics([NewTopic(f"{topic_prefix}expiring", 2, 1, topic_configs={"cleanup.policy": "delete"}),
                                  NewTopic(f"{topic_prefix}default", 2, 1)])
    with pytest.raises(ChangelogError) as info:
        system.ensure_stream("expiring", 2)
    text = str(info.value)
    assert "cleanup.policy='delete'" in text and "kafka-configs.sh" in text and f"{topic_prefix}expiring" in text
    # Tansu reports only configs set on the topic: here the policy is unknown -> a warning, not an error
    # (Apache Kafka always reports it, and its default is 'delete', which is refused above).
    with caplog.at_level(logging.WARNING, logger="localstate.changelog.kafka"):
        system.ensure_stream("default", 2)
    assert any("cannot be verified" in r.getMessage() and f"{topic_prefix}default" in r.getMessage()
               for r in caplog.records)
    system.close()


def test_cleanup_policy_check():
    check_cleanup_policy("t", {"cleanup.policy": "compact"}, "k:9092")
    for wrong in ("delete", "compact,delete"):
        with pytest.raises(ChangelogError) as info:
            check_cleanup_policy("t", {"cleanup.policy": wrong}, "k:9092")
        assert "cleanup.policy=compact" in str(info.value) and "kafka-configs.sh" in str(info.value)


def test_append_rejects_non_bytes_and_reader_is_read_only(kafka_broker, topic_prefix):
    system = kafka(kafka_broker, topic_prefix)
    system.ensure_stream("types", 1)
    part = system.partition("types", 0)
    with pytest.raises(ChangelogError, match="key must be bytes"):
        part.append("text", b"v")
    with pytest.raises(ChangelogError, match="value must be bytes or None"):
        part.append_many([(b"k", 3)])
    with pytest.raises(ChangelogError, match="read-only"):
        system.reader("types", 0).append(b"k", b"v")
    system.close()
    with pytest.raises(ChangelogError, match="closed"):
        part.append(b"k", b"v")


def test_options_are_validated_and_secrets_come_from_the_environment(monkeypatch):
    with pytest.raises(ConfigError) as info:
        KafkaChangelogSystem({"bootstrap_servers": "nohostport", "compression": "brotli", "linger": "soon",
                              "replicas": 3})
    text = str(info.value)
    for path in ("changelogs.kafka.bootstrap_servers", "changelogs.kafka.compression", "changelogs.kafka.linger",
                 "changelogs.kafka.replicas"):
        assert path in text
    with pytest.raises(ConfigError, match="bootstrap_servers: required"):
        KafkaChangelogSystem({})
    options = validate_options(KafkaChangelogSystem.options, {
        "bootstrap_servers": ["b1:9092", "b2:9093"], "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "jobs", "sasl_plain_password_env": "LS_TEST_KAFKA_PASSWORD",
        "ssl_cafile": "/etc/ca.pem"}, "changelogs.kafka")
    monkeypatch.delenv("LS_TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(ConfigError) as info:
        client_settings(options, path="changelogs.kafka")
    assert "changelogs.kafka.sasl_plain_password_env" in str(info.value) and "LS_TEST_KAFKA_PASSWORD" in str(info.value)
    monkeypatch.setenv("LS_TEST_KAFKA_PASSWORD", "s3cret")
    settings = client_settings(options)
    assert settings["bootstrap_servers"] == ["b1:9092", "b2:9093"]
    assert settings["sasl_plain_password"] == "s3cret" and settings["sasl_plain_username"] == "jobs"
    assert settings["security_protocol"] == "SASL_SSL" and settings["ssl_cafile"] == "/etc/ca.pem"


def test_unreachable_broker_fails_fast_naming_the_servers():
    servers = f"127.0.0.1:{free_port()}"
    system = KafkaChangelogSystem({"bootstrap_servers": servers, "connect_timeout": "1s"})
    started = time.monotonic()
    with pytest.raises(ChangelogError) as info:
        system.ensure_stream("any", 1)
    # A bound far above connect_timeout: this checks "no hang", not speed.
    assert time.monotonic() - started < 30
    text = str(info.value)
    assert servers in text and "unreachable" in text and "what to do" in text
