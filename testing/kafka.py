"""A reference ``read_committed`` reader of one Kafka topic partition, for tests of transactional
outputs against brokers that do not filter aborted transactions themselves.

:func:`read_committed` returns what a real Kafka broker's ``read_committed`` fetch delivers: the
records of non-transactional batches and of committed transactions, in offset order, up to the
last stable offset (the first record of a transaction still open); records of aborted transactions
are left out. It decides from the log itself: it fetches the raw record batches (control batches
included) and, per producer id, holds each transaction's batches until its COMMIT or ABORT marker.
The Tansu development broker hides open transactions from ``read_committed`` consumers but
delivers aborted ones; this reader does not depend on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, TopicPartition
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.record.memory_records import MemoryRecords

__all__ = ["CommittedRecord", "read_committed", "log_batches"]

_FETCH_BYTES = 1 << 20


@dataclass(frozen=True)
class CommittedRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class _Batch:
    base_offset: int
    producer_id: int
    transactional: bool
    control: bool
    records: tuple[Any, ...]  # data: CommittedRecord; control: the marker type (0 abort, 1 commit)


def log_batches(admin: KafkaAdminClient, topic: str, partition: int) -> list[_Batch]:
    """Every record batch of ``topic[partition]`` up to its high watermark, control batches included."""
    cluster = admin._manager.cluster
    leader = cluster.leader_for_partition(TopicPartition(topic, partition))
    node = leader if leader is not None and leader >= 0 else None

    async def fetch(offset: int) -> Any:
        part = FetchRequest.FetchTopic.FetchPartition(partition=partition, fetch_offset=offset,
                                                      partition_max_bytes=_FETCH_BYTES)
        request = FetchRequest(max_wait_ms=100, min_bytes=1, max_bytes=_FETCH_BYTES, isolation_level=0,
                               topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])], max_version=12)
        return await admin._manager.send(request, node_id=node)

    batches: list[_Batch] = []
    offset = 0
    while True:
        answer = admin._manager.run(fetch, offset).responses[0].partitions[0]
        if answer.error_code:
            raise RuntimeError(f"fetch of {topic}[{partition}] at {offset} failed: error code {answer.error_code}")
        records = MemoryRecords(answer.records or b"")
        start = offset
        while (batch := records.next_batch()) is not None:
            if batch.is_control_batch:
                items: tuple[Any, ...] = tuple(record.type for record in batch)
            else:
                items = tuple(CommittedRecord(r.offset, r.key, r.value, tuple(r.headers)) for r in batch)
            batches.append(_Batch(batch.base_offset, batch.producer_id, batch.is_transactional,
                                  batch.is_control_batch, items))
            offset = batch.next_offset
        if offset == start or offset >= answer.high_watermark:
            return batches


def read_committed(bootstrap_servers: str, topic: str, partition: int, **client: Any) -> list[CommittedRecord]:
    """The records a real Kafka ``read_committed`` consumer reads from ``topic[partition]`` (see the
    module docstring). ``client``: more KafkaAdminClient settings (security)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **client)
    try:
        batches = log_batches(admin, topic, partition)
    finally:
        admin.close()
    decided: list[tuple[CommittedRecord, bool | None]] = []  # (record, committed); None: still open
    open_txn: dict[int, list[int]] = {}  # producer id -> indexes in `decided` of its open transaction
    for batch in batches:
        if batch.control:
            commit = 1 in batch.records
            for index in open_txn.pop(batch.producer_id, []):
                decided[index] = (decided[index][0], commit)
        elif batch.transactional:
            for record in batch.records:
                open_txn.setdefault(batch.producer_id, []).append(len(decided))
                decided.append((record, None))
        else:
            decided.extend((record, True) for record in batch.records)
    stable = min((decided[indexes[0]][0].offset for indexes in open_txn.values() if indexes), default=None)
    return [record for record, committed in decided
            if committed and (stable is None or record.offset < stable)]
