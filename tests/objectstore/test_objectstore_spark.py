"""``localstate run`` on local Spark with the ``objectstore`` changelog on SeaweedFS S3: batches
commit manifests through the driver's checkpoints; a run on a "host" whose local stores are gone
rebuilds them from snapshot + tail and the counts stay exact."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.core.runtime import checkpoint_store
from localstate.core.spark.runner import SparkJobRunner
from localstate.core.streams import open_output

pytestmark = pytest.mark.spark

SPARK_TESTS = Path(__file__).resolve().parent.parent / "spark"


@pytest.fixture(scope="module")
def spark_context():
    from localstate.core.spark.runner import spark_context as make_context

    context = make_context("local[2]", "localstate-objectstore-tests")
    yield context
    context.stop()


def write_inputs(data: Path, keys: list[str]) -> None:
    import json

    data.mkdir(parents=True, exist_ok=True)
    for partition in range(2):
        mine = [k for k in keys if partition_for(k, 2) == partition]
        with open(data / f"{partition}.jsonl", "a") as out:
            for i, key in enumerate(mine):
                out.write(json.dumps({"key": key, "value": i, "ts": float(i)}) + "\n")


def job_file(tmp_path: Path, seaweed) -> Path:
    options = seaweed.options(f"spark-{tmp_path.name}")
    (tmp_path / "job.toml").write_text(f"""
[job]
name = "durable-counts"
partitions = 2
task = "count_task:CountByKey"
state_dir = "state"
changelog = "objectstore"

[changelogs.objectstore]
url = "{options['url']}"
endpoint = "{options['endpoint']}"
access_key = "{options['access_key']}"
secret_key = "{options['secret_key']}"
snapshot_every = 2

[inputs.events]
system = "jsonl"
path = "data"

[outputs.counts-out]
system = "file"
path = "out"

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"

[spark]
pythonpath = ["{SPARK_TESTS}"]
""")
    return tmp_path / "job.toml"


def final_counts(job) -> dict:
    output = open_output(job, "counts-out")
    final = {}
    for partition in range(2):
        for key, count in output.read(partition):
            final[key] = count
    output.close()
    return final


def test_spark_job_on_s3_is_exact_across_a_move_to_empty_local_disks(tmp_path, seaweed, spark_context):
    keys = [f"k{i % 13}" for i in range(300)]
    write_inputs(tmp_path / "data", keys)
    job = load_job_config(job_file(tmp_path, seaweed))
    summary = SparkJobRunner(job, context=spark_context, batch_size=25, progress=None).run()
    assert summary.records_in == 300
    assert final_counts(job) == dict(Counter(keys))
    manifests = [checkpoint_store(job).load(p).manifests["counts"] for p in range(2)]
    assert all(m["end"] > 0 for m in manifests)
    # The job continues on a "host" with no local stores: rebuilt from shared storage.
    shutil.rmtree(job.state_dir / "durable-counts" / "stores")
    more = [f"k{i % 17}" for i in range(120)]
    write_inputs(tmp_path / "data", more)
    job = load_job_config(job_file(tmp_path, seaweed))
    SparkJobRunner(job, context=spark_context, batch_size=25, progress=None).run()
    assert final_counts(job) == dict(Counter(keys + more))
