"""The state reader over Kafka changelogs (a real Tansu broker on loopback): the committed state comes
from the topics alone — every local store deleted first — and records produced after the checkpoint
(a crash between the changelog flush and the checkpoint) are not returned."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import localstate.spark
from localstate.changelog.kafka.devbroker import DevBroker
from localstate.core.config import load_job_config
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

JOB = """
[job]
name = "kafka-reader"
partitions = 2
task = "unused:Unused"
changelog = "kafka"
commit_interval = 1000000000
state_dir = "state"

[changelogs.kafka]
bootstrap_servers = "{servers}"
topic_prefix = "reader-"

[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"
"""


class Counter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        if envelope.value < 0:
            self.counts.delete(envelope.key)
        else:
            self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    started = DevBroker(log_file=tmp_path_factory.mktemp("broker") / "tansu.log").start()
    yield started
    started.stop()


def test_committed_state_from_kafka_topics_only(tmp_path, broker, spark_context):
    from pyspark.sql import SparkSession

    job_file = tmp_path / "job.toml"
    job_file.write_text(JOB.format(servers=broker.bootstrap_servers))
    job = load_job_config(job_file)
    committed: dict[str, int] = {}
    driver = TaskTestDriver(Counter, job=job)
    for i in range(500):
        key = f"user-{i % 37}"
        driver.send("views", key, -1 if i % 50 == 49 else i)
        if i % 50 == 49:
            committed.pop(key, None)
        else:
            committed[key] = committed.get(key, 0) + 1
    driver.commit()
    for i in range(40):  # produced to Kafka, never checkpointed
        driver.send("views", f"late-{i % 3}", i)
    for instance in driver.instances.values():
        instance.prepare_commit()
    driver.crash()
    shutil.rmtree(Path(job.state_dir) / job.name / "stores")  # nothing local left to read

    spark = SparkSession(spark_context)
    localstate.spark.register(spark)
    counts = localstate.spark.read_state(spark, job_file, store="counts")
    assert counts.rdd.getNumPartitions() == 2
    rows = counts.collect()
    assert {r["key"]: r["value"] for r in rows} == committed
    assert len(rows) == len(committed)

    log = {r["partition"]: r for r in localstate.spark.read_state(spark, job_file, view="changelog").collect()}
    assert all(r["location"] == "kafka" and r["segments"] is None for r in log.values())
    assert any(r["end_offset"] > r["committed_offset"] for r in log.values())  # the late records are there
    feed = localstate.spark.read_state(spark, job_file, store="counts", view="changelog", readChangeFeed=True,
                                       endOffset="end").collect()
    assert {r["key"] for r in feed if not r["committed"]} == {f"late-{i}" for i in range(3)}
    assert {r["key"] for r in feed if r["committed"]} == {f"user-{i}" for i in range(37)}
    assert any(r["tombstone"] for r in feed if r["committed"])
