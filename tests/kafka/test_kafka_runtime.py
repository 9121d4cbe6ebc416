"""The commit protocol over Kafka changelogs: restore after losing all local state, trim, a broker
frozen during commit, an unreachable broker at start, and zombie fencing of a stale instance.
Uses the kv engine on RocksDB and a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.changelog.kafka.devbroker import free_port
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.errors import ChangelogError, ChangelogFencedError, FencedError
from tests.core.test_runtime import crash_after_flush_and_restart

pytestmark = pytest.mark.kafka

COUNTS = {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}}


class Counter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def driver_for(tmp_path, broker, prefix, partitions=1, stores=COUNTS, **options):
    return TaskTestDriver(Counter, stores=stores, state_dir=tmp_path, partitions=partitions, changelog="kafka",
                          changelog_options={"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix,
                                             **options})


def snapshot(driver, partitions=1):
    merged = {}
    for partition in range(partitions):
        merged.update(dict(driver.store("counts", partition).all()))
    return merged


def delete_local_state(driver):
    for partition in range(driver.job.partitions):
        shutil.rmtree(store_directory(driver.job, "counts", partition))


def test_restore_from_kafka_after_deleting_local_state_is_identical(tmp_path, kafka_broker, topic_prefix):
    with driver_for(tmp_path, kafka_broker, topic_prefix, partitions=2) as driver:
        for i in range(3000):
            driver.send("views", f"user-{i % 401}", i)
            if i % 1000 == 999:
                driver.commit()
        before = snapshot(driver, 2)
        assert sum(before.values()) == 3000
        # A clean restart needs no replay and no trim: the checkpointed offset is the exact end.
        driver.crash()
        recoveries = driver.restart()
        assert [r.status for r in recoveries] == ["ready", "ready"]
        assert all(r.replayed == 0 and r.trimmed == 0 for r in recoveries)
        # All local state lost: every store partition is rebuilt from its Kafka topic partition.
        driver.crash()
        delete_local_state(driver)
        recoveries = driver.restart()
        assert [r.status for r in recoveries] == ["rebuilt", "rebuilt"]
        assert sum(r.replayed for r in recoveries) > 0
        assert snapshot(driver, 2) == before


def test_uncommitted_changelog_records_are_trimmed_over_kafka(tmp_path, kafka_broker, topic_prefix):
    with driver_for(tmp_path, kafka_broker, topic_prefix) as driver:
        recoveries = crash_after_flush_and_restart(driver)  # the changelog: Kafka
        assert recoveries[0].trimmed == 2
        assert snapshot(driver) == {"a": 2, "b": 1}
        driver.crash()
        delete_local_state(driver)
        driver.restart()
        assert snapshot(driver) == {"a": 2, "b": 1}


def test_broker_frozen_during_commit_fails_cleanly_then_the_job_continues_exactly(tmp_path, private_broker,
                                                                                   topic_prefix):
    driver = driver_for(tmp_path, private_broker, topic_prefix, commit_timeout="2s")
    expected: dict[str, int] = {}

    def send(i):
        key = f"k{i % 13}"
        expected[key] = expected.get(key, 0) + 1
        driver.send("views", key, i)

    for i in range(200):
        send(i)
    driver.commit()
    checkpoint_path = checkpoint_store(driver.job).path(0)
    committed = checkpoint_path.read_text()
    for i in range(200, 300):
        send(i)

    private_broker.pause()                       # SIGSTOP: sockets stay open, nothing answers
    try:
        started = time.monotonic()
        with pytest.raises(ChangelogError) as info:
            driver.commit()
        # Far above commit_timeout (2 s): this checks "no hang", not speed.
        assert time.monotonic() - started < 30
    finally:
        private_broker.resume()
    text = str(info.value)
    assert "commit_timeout" in text and private_broker.bootstrap_servers in text
    assert f"topic={topic_prefix}test-job-counts-changelog" in text and "partition=0" in text
    assert checkpoint_path.read_text() == committed  # nothing checkpointed
    with pytest.raises(ChangelogError, match="failed flush"):
        driver.commit()                           # the partition refuses use until the task restarts

    driver.restart()                              # uncommitted inputs are delivered again
    for i in range(300, 400):
        send(i)
    driver.commit()
    assert snapshot(driver) == expected
    assert json.loads(checkpoint_path.read_text())["inputs"] == {"views": 400}
    driver.crash()
    delete_local_state(driver)
    driver.restart()
    assert snapshot(driver) == expected
    driver.close()


def test_restore_from_a_frozen_broker_fails_instead_of_hanging(private_broker, topic_prefix):
    options = {"bootstrap_servers": private_broker.bootstrap_servers, "topic_prefix": topic_prefix,
               "request_timeout": "1s", "connect_timeout": "1s"}
    system = KafkaChangelogSystem(options)
    system.ensure_stream("frozen", 1)
    writer = system.partition("frozen", 0)
    writer.append_many((b"k%d" % i, b"v") for i in range(2000))
    end = writer.flush()
    reader = KafkaChangelogSystem(options).reader("frozen", 0)
    assert reader.end_offset() == end            # connected and read once
    private_broker.pause()
    try:
        started = time.monotonic()
        with pytest.raises(ChangelogError) as info:
            for _ in reader.read(0, end):
                pass
        assert time.monotonic() - started < 30   # "no hang", not speed
        with pytest.raises(ChangelogError):      # a new reader cannot even connect
            KafkaChangelogSystem(options).reader("frozen", 0)
    finally:
        private_broker.resume()
    assert private_broker.bootstrap_servers in str(info.value) and "topic=" in str(info.value)
    assert [r.offset for r in reader.read(0, end)] == list(range(2000))  # fine again once it thaws
    reader.system.close()
    system.close()


def test_unreachable_broker_at_start_names_the_servers(tmp_path):
    servers = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ChangelogError) as info:
        TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path, changelog="kafka",
                       changelog_options={"bootstrap_servers": servers, "connect_timeout": "1s"})
    assert time.monotonic() - started < 30         # "no hang", not speed
    assert servers in str(info.value) and "what to do" in str(info.value)


def test_stale_instance_cannot_commit_or_write_after_a_newer_one_took_over(tmp_path, kafka_broker, topic_prefix):
    # Two live instances of one partition cannot share a RocksDB directory: in-memory local state.
    driver = driver_for(tmp_path, kafka_broker, topic_prefix, stores={"counts": {**COUNTS["counts"], "backend": "memory"}})
    job = driver.job
    for i in range(50):
        driver.send("views", f"k{i % 5}", i)
    driver.commit()
    stale = driver.instances[0]
    # A writer opened by the stale generation before the takeover (e.g. a recovery about to trim).
    early_system = KafkaChangelogSystem(job.changelog_options["kafka"])
    early_writer = early_system.partition(f"{job.name}-counts-changelog", 0)
    # The stale instance loses its lock (a lease expired, a network partition) but keeps running.
    stale.checkpoints.unlock(0)
    newer = TaskInstance(job, 0, open_changelog_system(job), task_factory=Counter)
    newer.open()
    assert newer.generation == stale.generation + 1

    for i in range(50, 60):                      # the stale instance processes on ...
        stale.process(Envelope("views", 0, i, "stale", i, 0.0))
    with pytest.raises(FencedError) as info:     # ... but the broker refuses its changelog writes
        stale.commit()
    assert isinstance(info.value, ChangelogFencedError)
    assert "newer writer" in str(info.value) and "stop this one" in str(info.value)
    with pytest.raises(FencedError):             # and the checkpoint refuses its generation
        stale.save_checkpoint(stale._checkpoint({}))
    early_writer.append(b"k0", b"\x00\x00\x00\x00\x00\x00\x03\xe7")
    with pytest.raises(ChangelogFencedError):
        early_writer.flush()
    early_system.close()
    stale.abandon()

    for i in range(50, 70):
        newer.process(Envelope("views", 0, i, f"k{i % 5}", i, 0.0))
    newer.close()
    newer.changelogs.close()
    expected = {f"k{k}": 14 for k in range(5)}
    # Rebuilt from Kafka alone, the state is exactly the newer instance's: nothing of the stale writes.
    delete_local_state(driver)
    rebuilt = TaskInstance(job, 0, open_changelog_system(job), task_factory=Counter)
    rebuilt.open()
    assert dict(rebuilt.stores["counts"].engine.all()) == expected
    rebuilt.close()
    rebuilt.changelogs.close()
    driver.changelogs.close()


def test_job_toml_selects_kafka_changelogs(tmp_path, kafka_broker, topic_prefix):
    path = tmp_path / "job.toml"
    path.write_text(f"""
[job]
name = "toml-job"
partitions = 3
task = "unused:Unused"
changelog = "kafka"
commit_interval = "1h"

[changelogs.kafka]
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic_prefix = "{topic_prefix}"
commit_timeout = "20s"
linger = "2ms"

[stores.counts]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"
""")
    job = load_job_config(path)
    assert job.changelog_options["kafka"]["commit_timeout"] == 20.0
    with TaskTestDriver(Counter, job=job) as driver:
        for i in range(30):
            driver.send("views", f"k{i}", i)
        driver.commit()
        system = driver.changelogs
        assert isinstance(system, KafkaChangelogSystem)
        assert system.describe("toml-job-counts-changelog") == 3
        assert system.topic("toml-job-counts-changelog") == f"{topic_prefix}toml-job-counts-changelog"
        assert snapshot(driver, 3) == {f"k{i}": 1 for i in range(30)}


def write_reset_job(tmp_path, name, broker, topic_prefix, *, inputs: str = "", store: str = ""):
    """Write a job with store ``counts`` on Kafka changelogs (and ``inputs`` tables, ``store`` options) to job.toml."""
    job_file = tmp_path / "job.toml"
    job_file.write_text(f"""
[job]
name = "{name}"
task = "localstate.demo:PageViewCounter"
state_dir = "{tmp_path / 'state'}"
changelog = "kafka"
[changelogs.kafka]
bootstrap_servers = "{broker.bootstrap_servers}"
topic_prefix = "{topic_prefix}"
{inputs}[stores.counts]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"
{store}""")
    return job_file


def test_reset_deletes_the_kafka_changelog_topics(tmp_path, kafka_broker, topic_prefix, capsys):
    from localstate.tools.cli import main

    job_file = write_reset_job(tmp_path, "resetme", kafka_broker, topic_prefix)
    job = load_job_config(job_file)
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Counter)
    instance.open()
    instance.process(Envelope("views", 0, 0, "a", 0))
    instance.close(commit=True)
    system = open_changelog_system(job)
    stream = job.stores["counts"].changelog
    assert system.describe(stream) == 1

    assert main(["reset", str(job_file)]) == 0
    assert f"would delete changelog {stream!r} on kafka" in capsys.readouterr().out
    assert system.describe(stream) == 1  # a dry run deletes nothing
    assert main(["reset", str(job_file), "--yes"]) == 0
    assert system.describe(stream) is None
    assert not (tmp_path / "state" / "resetme").exists()
    system.close()
