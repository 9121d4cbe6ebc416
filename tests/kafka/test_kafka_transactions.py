"""Transactional (exactly-once, read_committed) Kafka outputs, on the real dev broker (Tansu):

- the reference read_committed reader (localstate.testing.kafka) against a known log of committed,
  aborted, open and non-transactional batches;
- a commit's records are invisible to read_committed until the transaction is committed, then
  there exactly once; a recorded transaction is committed from another client, and again harmlessly;
- a zombie (an older producer of the task partition) cannot commit once a newer one opened; a
  recorded transaction the broker aborted is a typed error naming it, never silently dropped;
- ``transactions = false`` keeps the at-least-once path (no transaction, headers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from localstate.core.config import parse_job_config
from localstate.core.stream import open_output
from localstate.changelog.kafka.streams import PRODUCER_HEADER, SEQ_HEADER, KafkaOutput, ensure_topic
from localstate.core.checkpoint import Checkpoint
from localstate.runtime.driver.planner import BatchPlanner
from localstate.runtime.layout import checkpoint_store
from localstate.errors import CheckpointError, OutputError
from localstate.testing.kafka import read_committed

pytestmark = [pytest.mark.kafka]


def _output(tmp_path: Path, servers: str, topic: str, **options) -> KafkaOutput:
    job = parse_job_config({
        "job": {"name": "txn-job", "partitions": 1, "task": "m:C", "state_dir": str(tmp_path / "state")},
        "outputs": {"out": {"system": "kafka", "bootstrap_servers": servers, "topic": topic, **options}}},
        base_dir=tmp_path)
    output = open_output(job, "out")
    assert isinstance(output, KafkaOutput)
    return output


def _values(servers: str, topic: str) -> list[bytes]:
    return [record.value for record in read_committed(servers, topic, 0)]


def _consumer_read_committed(servers: str, topic: str) -> list[bytes]:
    """What kafka-python's own read_committed consumer gets (Tansu hides open transactions)."""
    consumer = KafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed", enable_auto_commit=False,
                             consumer_timeout_ms=1500)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return [message.value for message in consumer]
    finally:
        consumer.close()


def test_reference_reader_keeps_committed_drops_aborted_and_stops_at_an_open_transaction(kafka_broker, topic_prefix):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "log"
    ensure_topic({"bootstrap_servers": servers, "request_timeout_ms": 30000}, topic, 1, -1, create=True)
    plain = KafkaProducer(bootstrap_servers=servers, acks="all")
    one = KafkaProducer(bootstrap_servers=servers, transactional_id=topic + "-1", acks="all")
    two = KafkaProducer(bootstrap_servers=servers, transactional_id=topic + "-2", acks="all")
    try:
        one.init_transactions()
        two.init_transactions()
        one.begin_transaction()
        one.send(topic, b"c1", partition=0)
        one.flush()
        two.begin_transaction()
        two.send(topic, b"a1", partition=0)  # interleaved with one's transaction
        two.flush()
        plain.send(topic, b"n1", partition=0).get(10)
        one.commit_transaction()
        two.abort_transaction()
        one.begin_transaction()
        one.send(topic, b"open", partition=0)
        one.flush()
        plain.send(topic, b"n2", partition=0).get(10)  # after the open transaction: beyond the stable offset
        assert _values(servers, topic) == [b"c1", b"n1"]
        one.commit_transaction()
        assert _values(servers, topic) == [b"c1", b"n1", b"open", b"n2"]
    finally:
        for producer in (plain, one, two):
            producer.close(timeout=1)


def test_records_are_invisible_until_the_commit_then_there_exactly_once(tmp_path, kafka_broker, topic_prefix):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    output = _output(tmp_path, servers, topic)
    assert output.exactly_once and output.transactional
    try:
        assert output.truncate(0, 0) == 0
        output.fence(0)
        assert output.append(0, [("a", 1), ("b", 2)]) == 2
        pending = output.pending(0)
        assert pending is not None and pending["id"] == "localstate-txn-job.out.0.0"
        assert _values(servers, topic) == [] and _consumer_read_committed(servers, topic) == []
        output.commit(0)
        assert output.pending(0) is None
        assert _values(servers, topic) == [b"1", b"2"]
        assert output.append(0, [("c", 3)]) == 3
        assert _values(servers, topic) == [b"1", b"2"]
        output.commit(0)
        records = read_committed(servers, topic, 0)
        assert [r.value for r in records] == [b"1", b"2", b"3"]
        assert [dict(r.headers)[SEQ_HEADER] for r in records] == [b"0", b"1", b"2"]  # headers kept
        assert {dict(r.headers)[PRODUCER_HEADER] for r in records} == {b"txn-job/0"}
    finally:
        output.close()


def test_a_recorded_transaction_is_committed_from_another_client_and_again_harmlessly(tmp_path, kafka_broker,
                                                                                      topic_prefix):
    """What the Spark driver does after saving a batch's checkpoints; the task's next append then
    starts its next transaction on the same producer."""
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    task, driver = _output(tmp_path, servers, topic), _output(tmp_path, servers, topic)
    try:
        task.fence(0)
        task.append(0, [("a", 1)])
        recorded = task.pending(0)
        driver.commit_recorded(0, recorded)
        assert _values(servers, topic) == [b"1"]
        driver.commit_recorded(0, recorded)  # a retried commit, or a restart from that checkpoint
        task.append(0, [("b", 2)])  # the next batch: on the other transactional id
        assert task.pending(0)["id"] == "localstate-txn-job.out.0.1" and _values(servers, topic) == [b"1"]
        driver.commit_recorded(0, recorded)  # a restart from the older checkpoint cannot commit it
        assert _values(servers, topic) == [b"1"]
        driver.commit_recorded(0, task.pending(0))
        task.append(0, [("c", 3)])  # back on the first id: its producer's transaction is settled first
        assert task.pending(0) == recorded
        driver.commit_recorded(0, task.pending(0))
        assert _values(servers, topic) == [b"1", b"2", b"3"]
    finally:
        task.close()
        driver.close()


def test_reopening_twice_from_one_checkpoint_commits_its_transaction_again_harmlessly(tmp_path, kafka_broker,
                                                                                      topic_prefix):
    """A partition reopened from a checkpoint (commit its transaction, fence, pre-commit the next)
    that dies before a newer checkpoint is saved (in cluster mode the open's own checkpoint is not
    saved either): the next open commits the same record again. The open left the recorded id's
    epoch alone, so that commit still succeeds; the dead attempt's transaction is aborted."""
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    first = _output(tmp_path, servers, topic)
    first.fence(0)
    first.append(0, [("a", 1)])
    recorded = first.pending(0)
    first.close()  # died after the checkpoint naming `recorded` was saved, before the commit
    for attempt in range(2):
        reopened = _output(tmp_path, servers, topic, delivery_timeout="3s")
        try:
            reopened.commit_recorded(0, recorded)  # what resume does at open
            reopened.fence(0)
            reopened.append(0, [("b", 2)])  # then dies before its checkpoint is saved
            assert reopened.pending(0)["id"] != recorded["id"]
        finally:
            reopened.close()
    last = _output(tmp_path, servers, topic)
    try:
        last.commit_recorded(0, recorded)
        last.fence(0)  # aborts the second attempt's transaction
        last.append(0, [("b", 2)])
        last.commit(0)
    finally:
        last.close()
    assert _values(servers, topic) == [b"1", b"2"]


def test_a_run_commits_the_transactions_its_saved_checkpoints_name(tmp_path, kafka_broker, topic_prefix):
    """A driver that died between saving a checkpoint and committing its transaction, on a partition
    that gets no further batch (so no task reopens it): the next run's start commits it."""
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    task = _output(tmp_path, servers, topic)
    job = task.job
    try:
        task.fence(0)
        task.append(0, [("a", 1)])
        store = checkpoint_store(job)
        store.save(Checkpoint(0, outputs={"out": 1}, transactions={"out": task.pending(0)}))
        assert _values(servers, topic) == []
        BatchPlanner(job, store, {}).start_run()
        assert _values(servers, topic) == [b"1"]
    finally:
        task.close()


def test_a_zombie_cannot_commit_after_a_newer_instance_opened(tmp_path, kafka_broker, topic_prefix):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    zombie, newer = (_output(tmp_path, servers, topic, delivery_timeout="3s"),
                     _output(tmp_path, servers, topic, delivery_timeout="3s"))
    try:
        zombie.fence(0)
        zombie.append(0, [("z", 1)])
        recorded = zombie.pending(0)
        newer.fence(0)  # init_transactions: aborts the zombie's open transaction and fences it
        with pytest.raises(OutputError) as fenced:
            zombie.commit(0)
        assert fenced.value.context["transactional_id"] == "localstate-txn-job.out.0.0"
        assert fenced.value.context["partition"] == 0 and fenced.value.hint
        newer.append(0, [("n", 2)])
        newer.commit(0)
        assert _values(servers, topic) == [b"2"]  # the zombie's record was aborted
        # The aborted transaction, as a checkpoint would have recorded it, cannot be committed: a
        # typed error naming it (Tansu drops the connection instead of answering PRODUCER_FENCED).
        with pytest.raises(OutputError) as aborted:
            newer.commit_recorded(0, recorded)
        assert aborted.value.context["transactional_id"] == recorded["id"]
        assert aborted.value.context["topic"] == topic and aborted.value.context["stream"] == "out"
        assert _values(servers, topic) == [b"2"]
    finally:
        zombie.close()
        newer.close()


def test_without_transactions_outputs_are_at_least_once_with_headers(tmp_path, kafka_broker, topic_prefix):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    output = _output(tmp_path, servers, topic, transactions=False)
    assert not output.exactly_once and not output.transactional
    try:
        output.fence(0)
        assert output.truncate(0, 0) == 0 and output.append(0, [("a", 1)]) == 1
        assert output.pending(0) is None
        records = read_committed(servers, topic, 0)  # visible at once: no transaction
        assert [r.value for r in records] == [b"1"] and dict(records[0].headers)[SEQ_HEADER] == b"0"
        assert output.truncate(0, 0) == 0 and output.append(0, [("a", 1)]) == 1  # a replay delivers again
        assert [dict(r.headers)[SEQ_HEADER] for r in read_committed(servers, topic, 0)] == [b"0", b"0"]
    finally:
        output.close()


def test_the_checkpoint_field_is_optional_and_validated():
    old = Checkpoint(0, inputs={"in": 3}).to_json()
    assert "transactions" not in old and Checkpoint.from_json(old, "old").transactions == {}
    txn = {"out": {"id": "localstate-j.out.0.1", "producer_id": 7, "epoch": 2}}
    assert Checkpoint.from_json(Checkpoint(0, transactions=txn).to_json(), "new").transactions == txn
    for bad in ({"out": {"id": "x", "producer_id": -1, "epoch": 0}}, {"out": {"id": "", "producer_id": 1, "epoch": 0}},
                {"out": {"id": "x", "producer_id": 1}}, {"out": {"id": "x", "producer_id": 1, "epoch": 1 << 20}},
                ["out"]):
        text = Checkpoint(0).to_json()[:-1] + ', "transactions": ' + json.dumps(bad) + "}"
        with pytest.raises(CheckpointError, match="transactions"):
            Checkpoint.from_json(text, "bad")
