"""The join examples end to end on local Spark, each checked against an independent computation
over the generator's records."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.serdes import JsonSerde, StringSerde
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.core.stream import open_output
from localstate.streams.generator import generate

from .test_spark_runtime import EXAMPLES

pytestmark = pytest.mark.spark


def _run(tmp_path, spark_context, name: str, batch_size: int):
    shutil.copytree(EXAMPLES / name, tmp_path / "job", ignore=shutil.ignore_patterns(".work", "__pycache__"))
    job = load_job_config(tmp_path / "job" / "job.toml")
    summary = SparkJobRunner(job, context=spark_context, batch_size=batch_size, progress=None).run()
    assert summary.lag == 0 and len(summary.batches) > 1
    return job


def _records(job, stream: str, partition: int):
    o = job.inputs[stream].options
    return list(generate(o["kind"], o.get("seed", 7), job.partitions, partition, o.get("users", 10_000),
                         float(o.get("rate", 100.0)), float(o.get("start_ts", 1_700_000_000.0)), 0, o["events"]))


def _merged(job, partition: int):
    """Event-time merge of all inputs: (ts, input index by name, offset) like the runtime."""
    rows = []
    for index, stream in enumerate(sorted(job.inputs)):
        rows += [(value["ts"], index, offset, stream, key, value)
                 for offset, key, value in _records(job, stream, partition)]
    return sorted(rows, key=lambda r: r[:3])


def _outputs(job, name):
    output = open_output(job, name)
    rows = [kv for p in range(job.partitions) for kv in output.read(p)]
    output.close()
    return rows


def test_table_table_join_example(tmp_path, spark_context):
    job = _run(tmp_path, spark_context, "table_table_join", 1500)
    expected = {}
    for partition in range(job.partitions):
        profiles = {k: v for _, k, v in _records(job, "profiles", partition)}
        settings = {k: v for _, k, v in _records(job, "settings", partition)}
        for user in profiles.keys() & settings.keys():
            expected[user] = {"name": profiles[user]["name"], "zip": profiles[user]["zip"],
                              "theme": settings[user]["theme"], "emails": settings[user]["emails"]}
    actual = {}
    changelogs = open_changelog_system(job)
    for partition in range(job.partitions):
        reader = changelogs.reader("user-view", partition)
        for record in reader.read(0):
            actual[StringSerde().deserialize(record.key)] = JsonSerde().deserialize(record.value)
        reader.close()
    assert expected and actual == expected


def test_stream_table_join_example(tmp_path, spark_context):
    job = _run(tmp_path, spark_context, "stream_table_join", 3000)
    expected = []
    for partition in range(job.partitions):
        zips = {}
        for ts, _, _, stream, key, value in _merged(job, partition):
            if stream == "profiles":
                zips[key] = value["zip"]
            else:
                expected.append((key, value["page"], ts, zips.get(key)))
    actual = [(k, v["page"], v["ts"], v["zip"]) for k, v in _outputs(job, "enriched-views")]
    assert len(actual) == 2 * 15000
    assert Counter(actual) == Counter(expected)
    assert any(z is None for *_, z in expected) and any(z for *_, z in expected)


def test_stream_stream_join_example(tmp_path, spark_context):
    job = _run(tmp_path, spark_context, "stream_stream_join", 2000)
    attributed, unmatched, expired = set(), Counter(), set()
    for partition in range(job.partitions):
        waiting = {}
        for ts, _, _, stream, key, value in _merged(job, partition):
            for imp in [k for k, v in waiting.items() if v["ts"] < ts - 30.0]:   # expiry first
                expired.add(imp)
                del waiting[imp]
            if stream == "impressions":
                waiting[key] = value
            elif key in waiting and ts - waiting[key]["ts"] <= 30.0:
                attributed.add(key)
                del waiting[key]
            else:
                unmatched[key] += 1
    assert {k for k, _ in _outputs(job, "attributed")} == attributed
    assert len(_outputs(job, "attributed")) == len(attributed)
    assert Counter(k for k, _ in _outputs(job, "unmatched")) == unmatched
    assert {k for k, _ in _outputs(job, "expired")} == expired
    assert attributed and unmatched and expired
