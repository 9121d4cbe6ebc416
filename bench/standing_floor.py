"""The floor under ``bench standing``'s latencies: the counting job's I/O, and nothing else.

Run as a process of its own by ``bench standing`` (the ``floor`` rows), one forked process per
partition, each following its partition and committing as soon as it has caught up, as a continuous
localstate task does, with the same durable steps per commit in the same order:

1. read what arrived: JSON lines from ``<job>/data/<p>.jsonl`` (a poll of the file's size every
   ``--poll`` seconds), or a Kafka consumer kept assigned to input partition ``p`` (fetches waiting at
   most ``--fetch-wait-ms`` at the broker); each record decoded as JSON;
2. count per key in a dict (no store, no task, no Spark);
3. the changelog: one line per changed key appended to ``state/changelog-<p>``, fsynced;
4. the outputs: JSON lines: each changed key's count appended to ``<job>/out/<p>.jsonl``, fsynced
   (visible to the bench's reader from here); Kafka: each changed key's count sent to the output
   topic in a transaction (its own transactional id), acknowledged;
5. the checkpoint: positions written to a temporary file, fsynced, renamed over the last one, its
   directory fsynced; Kafka: then the transaction is committed (visible to a read_committed reader
   from here).

What is left is what any exactly-once pipeline on this machine pays per commit with these clients
(kafka-python, the dev broker): two fsyncs (three on JSON lines: the output file's too), the
transaction's round trips, the reads and sends of the records. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from multiprocessing import Process
from pathlib import Path
from typing import Any, Callable


def _fsync_append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        handle.write(json.dumps(state).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Counts:
    """Counts per key and the keys changed since the last commit."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.dirty: dict[str, int] = {}

    def add(self, key: str) -> None:
        count = self.counts.get(key, 0) + 1
        self.counts[key] = count
        self.dirty[key] = count

    def take(self) -> dict[str, int]:
        dirty, self.dirty = self.dirty, {}
        return dirty


def _jsonl(partition: int, job: Path, state: Path, poll: float, stopping: Callable[[], bool]) -> None:
    source, out = job / "data" / f"{partition}.jsonl", job / "out" / f"{partition}.jsonl"
    changelog, checkpoint = state / f"changelog-{partition}", state / f"checkpoint-{partition}.json"
    counts, position = _Counts(), 0
    while not stopping():
        size = source.stat().st_size
        if size <= position:
            time.sleep(poll)
            continue
        with open(source, "rb") as handle:
            handle.seek(position)
            data = handle.read(size - position)
        cut = data.rfind(b"\n") + 1
        if not cut:
            time.sleep(poll)
            continue
        position += cut
        for line in data[:cut].splitlines():
            counts.add(json.loads(line)["key"])
        dirty = counts.take()
        _fsync_append(changelog, "".join(f"{k}\t{v}\n" for k, v in dirty.items()).encode())
        _fsync_append(out, "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in dirty.items()).encode())
        _checkpoint(checkpoint, {"position": position})


def _kafka(partition: int, servers: str, events: str, output: str, state: Path, fetch_wait_ms: int,
           stopping: Callable[[], bool]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=servers, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=fetch_wait_ms, max_poll_records=5000)
    tp = TopicPartition(events, partition)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True, linger_ms=5,
                             batch_size=256 * 1024, transactional_id=f"standing-floor-{output}-{partition}",
                             transaction_timeout_ms=900_000)
    producer.init_transactions()
    changelog, checkpoint = state / f"changelog-{partition}", state / f"checkpoint-{partition}.json"
    counts, position = _Counts(), 0
    try:
        while not stopping():
            records = consumer.poll(timeout_ms=100).get(tp)
            if not records:
                continue
            for record in records:
                json.loads(record.value)
                counts.add(record.key.decode())
            position = records[-1].offset + 1
            dirty = counts.take()
            _fsync_append(changelog, "".join(f"{k}\t{v}\n" for k, v in dirty.items()).encode())
            producer.begin_transaction()
            for key, value in dirty.items():
                producer.send(output, key=key.encode(), value=str(value).encode(), partition=partition)
            producer.flush()
            _checkpoint(checkpoint, {"position": position})
            producer.commit_transaction()
    finally:
        consumer.close()
        producer.close(timeout=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", choices=("jsonl", "kafka"), required=True)
    parser.add_argument("--root", required=True, help="jsonl: the job folder (data/, out/); both: where state goes")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--poll", type=float, default=0.001, help="jsonl: seconds between two looks at a file")
    parser.add_argument("--servers")
    parser.add_argument("--events")
    parser.add_argument("--output")
    parser.add_argument("--fetch-wait-ms", type=int, default=10)
    args = parser.parse_args()
    root = Path(args.root)
    state = root / "floor-state"
    state.mkdir(parents=True, exist_ok=True)
    stop = [False]

    def run(partition: int) -> None:
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
        stopping = lambda: stop[0]  # noqa: E731
        if args.input == "jsonl":
            _jsonl(partition, root, state, args.poll, stopping)
        else:
            _kafka(partition, args.servers, args.events, args.output, state, args.fetch_wait_ms, stopping)

    workers = [Process(target=run, args=(p,), daemon=True) for p in range(args.partitions)]
    for worker in workers:
        worker.start()
    print("started", flush=True)

    def end(*_: Any) -> None:
        for worker in workers:
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGTERM)  # type: ignore[arg-type]
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, end)
    while all(worker.is_alive() for worker in workers):
        time.sleep(0.5)
    end()


if __name__ == "__main__":
    main()
