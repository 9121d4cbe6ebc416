"""Inputs that change under a job, end to end on local Spark (issue #37): a jsonl input replaced by a
shorter file fails the next run with an InputPositionError (never ``done ... lag 0`` with the new
records unread); ``localstate seek --to-start --yes`` then lets the run process exactly the new
records. An unterminated last line is shown next to the lag and read once its writer completes it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.core.config import load_job_config
from localstate.errors import InputPositionError
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.tools.cli import main

pytestmark = pytest.mark.spark


def _lines(keys: list[str]) -> str:
    return "".join(json.dumps({"key": key, "value": 1}) + "\n" for key in keys)


def test_replaced_input_fails_then_seek_processes_the_new_records(tmp_path: Path, spark_context) -> None:  # noqa: ANN001
    job_file = write_counting_job(tmp_path, "replaced", partitions=1)
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "0.jsonl"
    path.write_text(_lines([f"old-{i % 3}" for i in range(10)]))
    job = load_job_config(job_file)
    first = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert first.records_in == 10 and first.lag == 0

    replacement = tmp_path / "new.jsonl"
    replacement.write_text(_lines(["new-a", "new-b", "new-a", "new-c", "new-a"]))
    os.replace(replacement, path)
    lines: list[str] = []
    with pytest.raises(InputPositionError) as changed:
        SparkJobRunner(job, context=spark_context, progress=lines.append).run()
    assert (changed.value.position, changed.value.end) == (10, 5) and not lines  # no batch ran

    assert main(["seek", str(job_file), "--input", "events", "--to-start", "--yes"]) == 0
    again = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert again.records_in == 5 and again.lag == 0
    assert final_counts(job) == {"old-0": 4, "old-1": 3, "old-2": 3, "new-a": 3, "new-b": 1, "new-c": 1}


def test_input_replaced_by_a_longer_file_in_place_fails_then_seek_processes_it(tmp_path: Path,
                                                                              spark_context) -> None:  # noqa: ANN001
    """Issue 43: a longer file used to be read on from the old position (its first lines skipped,
    silently); its identity (device, inode, first bytes) tells it from the file the position was
    read in, even written in place over the same inode."""
    job_file = write_counting_job(tmp_path, "replaced-longer", partitions=1)
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "0.jsonl"
    path.write_text(_lines([f"old-{i % 3}" for i in range(10)]))
    job = load_job_config(job_file)
    assert SparkJobRunner(job, context=spark_context, progress=None).run().records_in == 10
    with open(path, "r+") as handle:  # truncated and written again: same inode, 15 lines
        handle.truncate(0)
        handle.write(_lines([f"new-{i % 5}" for i in range(15)]))
    with pytest.raises(InputPositionError) as changed:
        SparkJobRunner(job, context=spark_context, progress=None).run()
    assert (changed.value.position, changed.value.end) == (10, 15) and "another file" in changed.value.message
    assert main(["seek", str(job_file), "--input", "events", "--to-start", "--yes"]) == 0
    again = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert again.records_in == 15 and again.lag == 0
    counts = final_counts(job)
    assert {key: counts[key] for key in counts if key.startswith("new")} == {f"new-{i}": 3 for i in range(5)}


def test_unterminated_tail_is_shown_with_the_lag_then_read(tmp_path: Path, spark_context) -> None:  # noqa: ANN001
    job_file = write_counting_job(tmp_path, "tail", partitions=1)
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "0.jsonl"
    tail = b'{"key":"late","val'
    path.write_bytes(_lines(["a", "b", "a"]).encode() + tail)
    job = load_job_config(job_file)
    lines: list[str] = []
    summary = SparkJobRunner(job, context=spark_context, progress=lines.append).run()
    assert summary.records_in == 3 and summary.lag == 0 and summary.pending_bytes == len(tail)
    assert lines and lines[-1].endswith(f"lag 0 (+{len(tail)} bytes unterminated)")
    assert final_counts(job) == {"a": 2, "b": 1}

    with open(path, "ab") as handle:
        handle.write(b'ue":1}\n')
    summary = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert summary.records_in == 1 and summary.pending_bytes == 0
    assert final_counts(job) == {"a": 2, "b": 1, "late": 1}
