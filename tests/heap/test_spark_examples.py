"""The heap Spark examples end to end on local Spark (``examples/heap/trending_pages`` and
``examples/heap/bounded_sort``), each checked exactly against an independent plain-Python
computation over the input files that the example's ``make_input.py`` wrote."""

from __future__ import annotations

import json
import runpy
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.core.stream import open_output
from localstate.streams.jsonl import read_jsonl
from localstate.core.stream import resolve_path

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "heap"


def prepare(tmp_path: Path, name: str) -> tuple[JobConfig, dict[str, Any]]:
    """Copy the example's job folder (without any local run's files) and write its input."""
    shutil.copytree(EXAMPLES / name, tmp_path / "job",
                    ignore=shutil.ignore_patterns(".work", "data", "state", "out", "__pycache__"))
    make_input = runpy.run_path(str(tmp_path / "job" / "make_input.py"))
    make_input["write_input"](tmp_path / "job" / "job.toml")
    module = runpy.run_path(str(tmp_path / "job" / f"{name}.py"))
    return load_job_config(tmp_path / "job" / "job.toml"), module


def input_rows(job: JobConfig, stream: str, partition: int) -> list[dict[str, Any]]:
    return read_jsonl(resolve_path(job, job.inputs[stream].options["path"]), partition)


def output_rows(job: JobConfig, stream: str, partition: int) -> list[tuple[Any, Any]]:
    output = open_output(job, stream)
    try:
        return list(output.read(partition))
    finally:
        output.close()


def ranked(counts: Counter, n: int) -> list[list[Any]]:
    """Top ``n`` by count, ties by page ascending (the heap's documented order)."""
    return [[page, views] for page, views in sorted(counts.items(), key=lambda pv: (-pv[1], pv[0]))[:n]]


def test_trending_pages_example(tmp_path: Path, spark_context: Any) -> None:
    job, module = prepare(tmp_path, "trending_pages")
    window, top = module["WINDOW"], module["TOP"]
    summary = SparkJobRunner(job, context=spark_context, batch_size=1500, progress=None).run()
    assert summary.lag == 0 and len(summary.batches) >= 3  # the stores are reopened between batches

    everything: dict[int, Counter] = {}
    closed_everywhere: set[int] | None = None
    emitted = []
    for partition in range(job.partitions):
        views: dict[int, Counter] = {}
        for row in input_rows(job, "page_views", partition):
            start = int(row["ts"] // window) * window
            views.setdefault(start, Counter())[row["key"]] += 1
            everything.setdefault(start, Counter())[row["key"]] += 1
        closed = sorted(views)[:-1]  # the partition's last window is still open
        expected = [(start, {"window": start, "pages": len(views[start]), "top": ranked(views[start], top)})
                    for start in closed]
        actual = output_rows(job, "trending", partition)
        assert actual == expected, f"partition {partition}"
        emitted += [value for _, value in actual]
        closed_everywhere = set(closed) if closed_everywhere is None else closed_everywhere & set(closed)

    # Pages are partitioned by page, so merging the partitions' lists gives the exact global top N.
    merged = module["merge_partitions"](emitted)
    assert closed_everywhere and len(closed_everywhere) >= 5
    for start in closed_everywhere:
        assert merged[start] == ranked(everything[start], top)
    assert len({merged[start][0][0] for start in closed_everywhere}) > 1, "the leader should change"

    # A second run finds its input consumed and changes nothing.
    assert SparkJobRunner(job, context=spark_context, progress=None).run().records_in == 0
    assert [value for p in range(job.partitions) for _, value in output_rows(job, "trending", p)] == emitted


def test_bounded_sort_example_with_worker_kill(tmp_path: Path, spark_context: Any) -> None:
    job, _ = prepare(tmp_path, "bounded_sort")
    lateness = 2000  # max_lateness = "2s" with timestamp_unit = "ms"
    assert job.stores["buffer"].options["max_lateness"] == "2s"
    marker = tmp_path / "killed-once"
    fault = {"partition": 0, "batch": 1, "after": 600, "marker": str(marker)}
    summary = SparkJobRunner(job, context=spark_context, batch_size=1000, fault=fault, progress=None).run()
    assert marker.exists(), "the worker of partition 0 should have been SIGKILLed in batch 1"
    assert summary.lag == 0 and len(summary.batches) >= 4

    for partition in range(job.partitions):
        lines = [row["value"] for row in input_rows(job, "logs", partition) if "watermark" not in row["value"]]
        # Independent: a line is late when it is older than the newest kept line minus the lateness;
        # every kept line is released (the input ends with a watermark past all of them), sorted by
        # timestamp and, for equal timestamps, by arrival.
        newest, kept, late = float("-inf"), [], []
        for arrival, line in enumerate(lines):
            if line["at"] < newest - lateness:
                late.append(line)
            else:
                kept.append((line["at"], arrival, line))
                newest = max(newest, line["at"])
        expected = [line for *_, line in sorted(kept, key=lambda k: k[:2])]

        merged = [value for _, value in output_rows(job, "merged", partition)]
        side = [value for _, value in output_rows(job, "late-lines", partition)]
        stamps = [line["at"] for line in merged]
        assert stamps == sorted(stamps), f"partition {partition}: output not totally ordered"
        assert merged == expected and side == late
        # Nothing lost, nothing duplicated (despite the kill and the retried task).
        as_text = Counter(json.dumps(line, sort_keys=True) for line in lines)
        assert Counter(json.dumps(line, sort_keys=True) for line in merged + side) == as_text
        assert late and len(merged) > len(late) and stamps != [line["at"] for line in lines]
