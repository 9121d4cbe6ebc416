"""examples/dataframe keeps working, with its per-record and its batch task: the rate source counted
per user through foreach_batch, run
twice on the same checkpoint (on the tests' one SparkContext: the example's ``run``; ``main`` only
adds its own SparkSession); the JSON sink and the state are exact against plain Python."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import add_task_paths

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dataframe"
pytestmark = pytest.mark.spark


def _load_example(example: Path):
    spec = importlib.util.spec_from_file_location("rate_counts_copy", example / "rate_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # HERE is the copy: its job.toml, state/, out/, checkpoint/
    return module


# The example's default task in the default run; its batch task as this streaming query is the slow
# soak (`-m slow`): tests/spark/test_batch_examples_spark.py's test_counting_dataframe_step runs both
# of the example's tasks through a DataFrame step in the default run.
@pytest.mark.parametrize("task", ["CountPerUser", pytest.param("CountPerUserBatch", marks=pytest.mark.slow)])
def test_rate_counts_example(spark_context, tmp_path, capsys, task):
    from pyspark.sql import SparkSession

    example = tmp_path / "dataframe"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("state", "out", "checkpoint", "__pycache__"))
    job_file = example / "job.toml"
    job_file.write_text(job_file.read_text().replace('"counting:CountPerUser"', f'"counting:{task}"'))
    rate_counts = _load_example(example)
    spark = SparkSession(spark_context)
    for _ in range(2):  # the second run continues from the query checkpoint and the job's state
        written = rate_counts.run(spark, batches=2, seconds=300, rows_per_second=40, trigger="0.5 seconds")
        assert len(written) == 2
        assert "output row(s)" in capsys.readouterr().out

    values: dict[str, list[tuple[int, int]]] = {}
    batches = sorted((example / "out").glob("batch=*"))
    # Two runs of two batches each; a batch whose commit the stop cut off is executed again by the
    # second run (its outputs served from what localstate kept), so three or four batch folders.
    assert len(batches) >= 3
    for batch in batches:
        for part in batch.glob("part-*.json"):
            for line in part.read_text().splitlines():
                row = json.loads(line)
                count, value = json.loads(row["value"])
                values.setdefault(json.loads(row["key"]), []).append((value, count))
    seen = sorted(value for pairs in values.values() for value, _ in pairs)
    assert seen == list(range(len(seen))) and seen  # every rate row once, none lost, none twice
    for user, pairs in values.items():
        assert all(user == f"user-{value % 7}" for value, _ in pairs)
        assert [count for _, count in sorted(pairs)] == list(range(1, len(pairs) + 1))  # counted in value order

    job = load_job_config(example / "job.toml")
    add_task_paths(job)  # counting.py, next to job.toml
    changelogs = open_changelog_system(job)
    state: dict[str, int] = {}
    for partition in range(job.partitions):
        instance = TaskInstance(job, partition, changelogs)
        instance.open()
        with instance.stores["counts"].engine.all() as items:
            state.update(items)
        instance.close(commit=False)
    changelogs.close()
    assert state == {user: len(pairs) for user, pairs in values.items()}
