"""``localstate run`` on local Spark with the ``objectstore`` changelog on SeaweedFS S3: batches
commit manifests through the driver's checkpoints; a run on a "host" whose local stores are gone
rebuilds them from snapshot + tail and the counts stay exact."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.runtime.spark.runner import SparkJobRunner
from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark_context():
    """A local Spark for the module: the running one (get-or-create, e.g. tests/spark's session
    context when the same worker ran those tests first), stopped at the end only if started here."""
    from pyspark import SparkContext

    from localstate.runtime.spark.runner import spark_context as make_context

    existing = SparkContext._active_spark_context
    context = make_context("local[2]", "localstate-objectstore-tests")
    yield context
    if existing is None:
        context.stop()


def job_file(tmp_path: Path, seaweed) -> Path:
    """The counting job with its changelogs on the test's own bucket of ``seaweed``, a snapshot
    every 2 commits."""
    options = seaweed.options(f"spark-{tmp_path.name}")
    objectstore = {key: options[key] for key in ("url", "endpoint", "access_key", "secret_key")}
    return write_counting_job(tmp_path, "durable-counts", job={"changelog": "objectstore"},
                              changelogs={"objectstore": {**objectstore, "snapshot_every": 2}})


def test_spark_job_on_s3_is_exact_across_a_move_to_empty_local_disks(tmp_path, seaweed, spark_context):
    keys = [f"k{i % 13}" for i in range(300)]
    write_keyed_events(tmp_path / "data", keys)
    job = load_job_config(job_file(tmp_path, seaweed))
    summary = SparkJobRunner(job, context=spark_context, batch_size=25, progress=None).run()
    assert summary.records_in == 300
    assert final_counts(job) == dict(Counter(keys))
    manifests = [checkpoint_store(job).load(p).manifests["counts"] for p in range(2)]
    assert all(m["end"] > 0 for m in manifests)
    # The job continues on a "host" with no local stores: rebuilt from shared storage.
    shutil.rmtree(job.state_dir / "durable-counts" / "stores")
    more = [f"k{i % 17}" for i in range(120)]
    write_keyed_events(tmp_path / "data", more)
    job = load_job_config(job_file(tmp_path, seaweed))
    SparkJobRunner(job, context=spark_context, batch_size=25, progress=None).run()
    assert final_counts(job) == dict(Counter(keys + more))
