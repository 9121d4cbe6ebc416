"""examples/dataframe keeps working: the rate source counted per user through foreach_batch, run
twice on the same checkpoint; the JSON sink and the state are exact against plain Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.core.runtime import TaskInstance, open_changelog_system
from localstate.core.task import add_task_paths

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dataframe"
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_rate_counts_example(tmp_path):
    example = tmp_path / "dataframe"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("state", "out", "checkpoint", "__pycache__"))
    for _ in range(2):  # the second run continues from the query checkpoint and the job's state
        done = subprocess.run([sys.executable, str(example / "rate_counts.py"), "--batches", "2", "--seconds", "300",
                               "--rows-per-second", "40"], capture_output=True, text=True, timeout=600,
                              env={**os.environ})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "output row(s)" in done.stdout

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
