"""A Kafka input topic that changes under a job (issue #37), on a real broker (Tansu): the topic is
deleted and re-created with fewer records than the checkpoint says were read. The planner raises an
InputPositionError naming the input, partition, position and end (never ``done ... lag 0`` with the
new records unread), ``inspect`` shows it, and ``localstate seek`` moves the position on purpose.

The other Kafka case, records deleted below the position (a log start offset above it: retention,
DeleteRecords), is checked by the same code through ``KafkaInput.start_offset`` (ListOffsets
earliest); Tansu does not implement DeleteRecords, so here only the log start of a live topic is
read (0), and tests/core/test_input_changes.py covers the check itself."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.io import close_clients
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.core.options import validate_options
from localstate.core.stream import open_input
from localstate.errors import InputPositionError
from localstate.runtime.spark.driver import SparkJobRunner
from localstate.tools.cli import main

pytestmark = pytest.mark.kafka



def _settings(servers: str) -> dict[str, Any]:
    return client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "test"))


def _fill(settings: dict[str, Any], topic: str, count: int) -> None:
    assert ensure_topic(settings, topic, 1, -1, create=True) == 1
    produce(settings, topic, [(f"k{i}".encode(), json.dumps({"i": i}).encode(), 0) for i in range(count)])


def _recreate(broker, topic: str) -> None:  # noqa: ANN001
    """Delete ``topic`` and wait until the broker no longer lists it, this process's pooled clients
    dropped before and after, as a new driver process starts without them (their cached metadata
    would still name the deleted topic, and a produce to it would auto-create it with the broker's
    default partitions)."""
    from kafka.admin import KafkaAdminClient

    # This process's pooled clients go first: a client's metadata refresh naming the topic could make
    # the broker create it again (with its default partition count) between the delete and the wait.
    close_clients()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while topic in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert topic not in admin.list_topics()
    finally:
        admin.close()
    close_clients()


def _job_file(tmp_path: Path, broker, topic: str) -> Path:  # noqa: ANN001
    return write_counting_job(tmp_path, "kafka-positions", partitions=1, job={"task": "count_task:CountByKey"},
                              kafka={"bootstrap_servers": broker.bootstrap_servers, "topic": topic}, store={"backend": "memory", "changelog": False})


def test_recreated_topic_with_fewer_records_is_a_typed_error(tmp_path: Path, kafka_broker, topic_prefix,  # noqa: ANN001
                                                            capsys: pytest.CaptureFixture) -> None:
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "events"
    _fill(settings, topic, 10)
    job_file = _job_file(tmp_path, kafka_broker, topic)
    job = load_job_config(job_file)
    source = open_input(job, "events")
    assert (source.end_offset(0), source.start_offset(0)) == (10, 0)
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 10}))
    assert SparkJobRunner(job, progress=None).plan(0) == ([], 0)  # all read: nothing to do

    _recreate(kafka_broker, topic)
    _fill(settings, topic, 4)
    runner = SparkJobRunner(job, progress=None)  # a new run (a new driver): it plans from the broker
    with pytest.raises(InputPositionError) as changed:
        runner.plan(0)
    error = changed.value
    assert (error.input, error.partition, error.position, error.end) == ("events", 0, 10, 4)
    assert error.context["topic"] == topic
    assert "localstate seek" in error.hint and "--input events" in error.hint

    capsys.readouterr()
    assert main(["inspect", str(job_file), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["input_partitions"]
    assert (row["position"], row["end"], row["lag"]) == (10, 4, None) and "past the input's end 4" in row["problem"]

    assert main(["seek", str(job_file), "--input", "events", "--to-start", "--yes"]) == 0
    assert checkpoint_store(job).load(0).inputs == {"events": 0}
    plans, lag = SparkJobRunner(job, progress=None).plan(0)
    assert lag == 4 and plans[0].ranges == {"events": (0, 4)}


def test_recreated_topic_refilled_past_the_position_is_a_typed_error(tmp_path: Path, kafka_broker,  # noqa: ANN001
                                                                     topic_prefix, capsys: pytest.CaptureFixture) -> None:
    """A topic deleted and created again, then refilled past the checkpoint's position: its end no
    longer tells (4 read, 10 there now), its id does. The planner raises naming both ids; ``seek``
    moves the position onto the new topic and records its id."""
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "refilled"
    _fill(settings, topic, 4)
    job_file = _job_file(tmp_path, kafka_broker, topic)
    job = load_job_config(job_file)
    old_id = open_input(job, "events").identity()
    assert isinstance(old_id, str) and old_id
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 4}, input_ids={"events": old_id}))
    assert SparkJobRunner(job, progress=None).plan(0) == ([], 0)

    _recreate(kafka_broker, topic)
    _fill(settings, topic, 10)
    new_id = open_input(job, "events").identity()
    assert new_id not in (None, old_id)
    with pytest.raises(InputPositionError) as changed:
        SparkJobRunner(job, progress=None).plan(0)
    error = changed.value
    assert (error.input, error.partition, error.position, error.end) == ("events", 0, 4, 10)
    assert (error.context["recorded_id"], error.context["current_id"], error.context["topic"]) == (old_id, new_id, topic)
    assert "deleted and created again" in error.message and "localstate seek" in error.hint

    capsys.readouterr()
    assert main(["inspect", str(job_file), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["input_partitions"]
    assert row["position"] == 4 and "created again" in row["problem"]

    assert main(["seek", str(job_file), "--input", "events", "--to-start", "--yes"]) == 0
    moved = checkpoint_store(job).load(0)
    assert (moved.inputs, moved.input_ids) == ({"events": 0}, {"events": new_id})
    plans, lag = SparkJobRunner(job, progress=None).plan(0)
    assert lag == 10 and plans[0].ranges == {"events": (0, 10)}


def test_a_checkpoint_without_the_topic_id_plans_as_before(tmp_path: Path, kafka_broker, topic_prefix) -> None:  # noqa: ANN001
    """A checkpoint written before topic ids were recorded (or by an input that has none) is not
    refused: the position is checked as before, and the next commit records the id."""
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "unrecorded"
    _fill(settings, topic, 6)
    job = load_job_config(_job_file(tmp_path, kafka_broker, topic))
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 2}))
    runner = SparkJobRunner(job, progress=None)
    plans, lag = runner.plan(0)
    assert lag == 4 and plans[0].ranges == {"events": (2, 6)}
    assert runner.planner.input_ids == {0: {"events": open_input(job, "events").identity(0)}}


@pytest.mark.spark
def test_a_run_records_the_topic_id_it_read(tmp_path: Path, kafka_broker, topic_prefix) -> None:  # noqa: ANN001
    """Each batch's checkpoints record the id of the topic the positions were read from (what the
    planner compares, see the test above)."""
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "recorded"
    _fill(settings, topic, 5)
    job = load_job_config(_job_file(tmp_path, kafka_broker, topic))
    summary = SparkJobRunner(job, progress=None).run()
    assert summary.records_in == 5
    committed = checkpoint_store(job).load(0)
    read_id = open_input(job, "events").identity()
    assert read_id is not None and committed.inputs == {"events": 5} and committed.input_ids == {"events": read_id}
