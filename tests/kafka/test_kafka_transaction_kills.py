"""Transactional Kafka outputs SIGKILLed between the outputs' pre-commit and the checkpoint save,
and between the checkpoint save and the transaction commit, then restarted: every output record is
read exactly once by a read_committed reader (the reference one, localstate.testing.kafka: the
Tansu dev broker shows aborted transactions), against a plain-Python model (running count per key).

- the partition's own commit path (TaskInstance.commit, as the continuous runtime commits: the
  partition saves its checkpoint, then commits its transaction), in a child process
  (tests/kafka/txn_crash_job.py), killed at ``after_outputs`` and ``after_checkpoint``;
- micro-batch (``localstate run``): the driver killed at ``driver_commit`` (tasks pre-committed,
  no checkpoint saved) and ``driver_saved`` (a checkpoint saved, its transaction not committed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from localstate.streams.jsonl import by_key_partition, write_jsonl
from localstate.testing.kafka import read_committed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import txn_crash_job  # noqa: E402

pytestmark = [pytest.mark.kafka]

RECORDS = 200


def _run(command: list[str], crash: str | None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash:
        env["LOCALSTATE_CRASH_AT"] = crash
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a killed driver's JVM and workers too
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _committed_counts(servers: str, topic: str, partitions: int) -> Counter:
    """(key, running count) -> how many times a read_committed reader reads it."""
    value = txn_crash_job.job(".", servers, topic).registry.serde("int", allow_pickle=False).deserialize
    seen: Counter = Counter()
    for partition in range(partitions):
        for record in read_committed(servers, topic, partition):
            seen[(record.key.decode(), value(record.value))] += 1
    return seen


def _model(keys: list[str]) -> Counter:
    """Plain Python: every key's running counts 1..n, each once."""
    return Counter((key, n) for key, total in Counter(keys).items() for n in range(1, total + 1))


@pytest.mark.parametrize("crash", ["after_outputs:2", "after_checkpoint:3"])
def test_a_partition_killed_around_its_checkpoint_save_commits_each_output_once(tmp_path, kafka_broker,
                                                                                 topic_prefix, crash):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    command = [sys.executable, str(HERE / "txn_crash_job.py"), str(tmp_path / "state"), servers, topic, str(RECORDS)]
    killed = _run(command, crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    done = _run(command, None)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-2000:]
    assert _committed_counts(servers, topic, 1) == _model([txn_crash_job.input_key(i) for i in range(RECORDS)])


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from localstate.tools.cli import main; sys.exit(main())", *args]


@pytest.mark.spark
@pytest.mark.slow  # about 20 s each: the default suite covers the driver's steps in test_kafka_transactions.py
@pytest.mark.parametrize("crash", ["driver_commit:2", "driver_saved:3"])
def test_a_micro_batch_driver_killed_around_the_checkpoint_save_commits_each_output_once(tmp_path, kafka_broker,
                                                                                        topic_prefix, crash):
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "out"
    grouped = by_key_partition(({"key": f"u{i % 23}", "value": 1} for i in range(400)), 2)
    for partition, records in grouped.items():
        write_jsonl(tmp_path / "in", partition, records)
    keys = {partition: [record["key"] for record in records] for partition, records in grouped.items()}
    (tmp_path / "job.toml").write_text(f"""
[job]
name = "txn-batches"
partitions = 2
task = "count_task:CountByKey"
state_dir = "state"
pythonpath = ["{ROOT / 'tests' / 'spark'}"]

[spark]
batch_size = 60

[inputs.events]
system = "jsonl"
path = "in"

[outputs.counts-out]
system = "kafka"
bootstrap_servers = "{servers}"
topic = "{topic}"
value_serde = "int"

[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"
""")
    command = _cli("run", str(tmp_path / "job.toml"), "--master", "local[1]", "--until-drained")
    killed = _run(command, crash, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    done = _run(command, None, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _committed_counts(servers, topic, 2) == _model(keys[0] + keys[1])
