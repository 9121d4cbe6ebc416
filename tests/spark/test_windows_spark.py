"""The windows library on Spark through the DataFrame step (``run_batch``): a tumbling count over
three batches with out-of-order and late rows, exact against the plain-Python reference model run
per job partition; a re-executed batch is not applied twice. (The native path runs the
windowed-counts example: tests/spark/test_spark_runtime.py.)"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from window_tasks import SIZE, job_config
from localstate.core.partitioner import partition_for
from localstate.spark import run_batch
from localstate.windows import Tumbling, count
from localstate.windows.reference import reference_windows, watermarks

pytestmark = pytest.mark.spark

SCHEMA = "user string, page string, ts double"


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def _batches(seed: int) -> list[list[dict]]:
    """Three batches of 10 s-aligned-ish event times; the second and third hold rows older than the
    batches before them (late, unless their window is still open)."""
    rng = random.Random(seed)
    batches, base = [], 1_700_000_000.0
    for b, size in enumerate([400, 300, 350]):
        rows = [{"user": f"u{rng.randrange(12)}", "page": f"/p/{rng.randrange(5)}",
                 "ts": base + b * 60 + rng.randrange(0, 1200) / 20} for _ in range(size)]
        if b:
            rows += [{"user": f"u{rng.randrange(12)}", "page": "/late", "ts": base + (b - 1) * 60 + rng.randrange(0, 1200) / 20}
                     for _ in range(40)]
        batches.append(rows)
    return batches


def _expected(batches: list[list[dict]], partitions: int) -> tuple[Counter, Counter]:
    """Per job partition: its rows batch by batch, each batch in (ts, input order) as the step feeds
    them, through the reference model with the partition's own watermark."""
    windows: Counter = Counter()
    late: Counter = Counter()
    for partition in range(partitions):
        stream = []
        for batch in batches:
            mine = [(row["ts"], i, row) for i, row in enumerate(batch) if partition_for(row["user"], partitions) == partition]
            stream += [row for *_, row in sorted(mine, key=lambda r: r[:2])]
        if not stream:
            continue
        marks = watermarks([row["ts"] for row in stream])
        result = reference_windows([(row["user"], row, row["ts"], w) for row, w in zip(stream, marks)], Tumbling(SIZE),
                                   count())
        windows.update((key, w.start, w.end, n) for key, w, n in result.outputs)
        late.update((key, value["ts"]) for key, value in result.late)
    return windows, late


def test_tumbling_count_through_the_dataframe_step_matches_the_reference(spark, tmp_path):
    job = job_config(tmp_path / "state", partitions=2)
    batches = _batches(5)
    rows = []
    for batch_id, batch in enumerate(batches):
        df = spark.createDataFrame(batch, SCHEMA).repartition(3)
        out = sorted(run_batch(df, job, key="user", order_by="ts", batch_id=batch_id).collect())
        if batch_id == 1:
            # Spark runs batch 1 again: the same rows, nothing applied twice (no window closes twice).
            assert sorted(run_batch(df, job, key="user", order_by="ts", batch_id=1).collect()) == out
        rows += out
    windows: Counter = Counter()
    late: Counter = Counter()
    for row in rows:
        key, value = json.loads(row.key), json.loads(row.value)
        if row.stream == "windows":
            windows[(key, value["start"], value["end"], value["value"])] += 1
        else:
            assert row.stream == "late"
            late[(key, value["ts"])] += 1
    expected_windows, expected_late = _expected(batches, job.partitions)
    assert expected_windows and expected_late, "the input must close windows and hold late rows"
    assert windows == expected_windows
    assert late == expected_late


def test_windowed_counts_batch_task_on_the_native_path_exact(tmp_path, spark_context):
    """The windowed-counts example's batch task (``add_batch``) through the native Spark path: the
    same closed (user, hour) counts as plain Python, each sent once."""
    import shutil

    from localstate.core.config import load_job_config
    from localstate.runtime.spark.runner import SparkJobRunner

    from .test_spark_runtime import EXAMPLES, actual_hourly, expected_hourly

    shutil.copytree(EXAMPLES / "windowed_counts", tmp_path / "job", ignore=shutil.ignore_patterns(".work", "__pycache__"))
    job_file = tmp_path / "job" / "job.toml"
    source = job_file.read_text()
    assert 'task = "windowed_counts:HourlyPageViews"' in source and "events = 20000" in source
    job_file.write_text(source.replace('task = "windowed_counts:HourlyPageViews"',
                                       'task = "windowed_counts:HourlyPageViewsBatch"')
                              .replace("events = 20000", "events = 12000"))
    job = load_job_config(job_file)
    summary = SparkJobRunner(job, context=spark_context, batch_size=5000, progress=None).run()
    assert summary.lag == 0 and len(summary.batches) == 3
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
