"""The Spark runtime end to end on local Spark: examples, worker SIGKILL, bad-input policies."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.spark.runner import SparkJobRunner, normalize_master
from localstate.core.stream import open_output
from localstate.streams.generator import generate
from localstate.errors import InputError
from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"


def expected_hourly(job, name: str = "page_views") -> Counter:
    """Independent: closed (user, hour) counts straight from the generator's records."""
    options = job.inputs[name].options
    expected: Counter = Counter()
    for partition in range(job.partitions):
        rows = list(generate("page_views", options.get("seed", 7), job.partitions, partition,
                             options.get("users", 10_000), float(options.get("rate", 100.0)),
                             float(options.get("start_ts", 1_700_000_000.0)), 0, options["events"]))
        last_hour = int(rows[-1][2]["ts"] // 3600)
        for _, user, value in rows:
            hour = int(value["ts"] // 3600)
            if hour < last_hour:
                expected[(user, hour)] += 1
    return expected


def actual_hourly(job) -> Counter:
    output = open_output(job, "hourly-counts")
    actual: Counter = Counter()
    for partition in range(job.partitions):
        for user, value in output.read(partition):
            key = (user, value["hour"])
            assert key not in actual, f"window {key} emitted twice"
            actual[key] = value["count"]
    return actual


def windowed_counts_job(directory: Path, events: int) -> Path:
    """The windowed-counts example copied to ``directory/job`` with ``events`` events per partition
    (instead of its 20000); returns its job file."""
    shutil.copytree(EXAMPLES / "windowed_counts", directory / "job")
    job_file = directory / "job" / "job.toml"
    source = job_file.read_text()
    assert "events = 20000" in source
    job_file.write_text(source.replace("events = 20000", f"events = {events}"))
    return job_file


def cli_command(*args: str) -> list[str]:
    """The argv of ``localstate ARGS`` run by this interpreter (no console script needed)."""
    return [sys.executable, "-c", "import sys; from localstate.tools.cli import main; sys.exit(main())", *args]


def test_normalize_master_adds_retries():
    assert normalize_master("local[*]") == "local[*,4]"
    assert normalize_master("local[2]") == "local[2,4]"
    assert normalize_master("local") == "local[1,4]"
    assert normalize_master("local[2,3]") == "local[2,3]"
    assert normalize_master("spark://h:7077") == "spark://h:7077"


def test_windowed_counts_example_exact(tmp_path, spark_context):
    shutil.copytree(EXAMPLES / "windowed_counts", tmp_path / "job")
    job = load_job_config(tmp_path / "job" / "job.toml")
    summary = SparkJobRunner(job, context=spark_context, batch_size=7000, progress=None).run()
    assert summary.records_in == 2 * 20000 and summary.lag == 0
    assert len(summary.batches) == 3
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
    # Running again finds nothing to do and changes nothing.
    assert SparkJobRunner(job, context=spark_context, progress=None).run().records_in == 0
    assert actual_hourly(job) == expected


def test_demo_pipeline_with_worker_sigkill_is_exact(tmp_path, spark_context):
    from localstate.demo import run_demo

    lines: list[str] = []
    assert run_demo(events=30_000, partitions=2, kill=True, directory=str(tmp_path), batch_size=4000,
                    context=spark_context, out=lines.append) == 0, "\n".join(lines)
    assert (tmp_path / "killed-once").exists()
    assert any("verification: OK" in line for line in lines)
    assert any("1 failed task attempt(s) retried" in line for line in lines), "\n".join(lines)


def _bad_input_job(tmp_path: Path, on_error: str) -> Path:
    data = tmp_path / "data"
    keys = [f"k{i % 7}" for i in range(60)]
    write_keyed_events(data, keys)
    # partition 1, offset 3: not JSON; offset 5: no key
    lines = (data / "1.jsonl").read_text().splitlines(keepends=True)
    lines.insert(3, "{this is not json\n")
    lines.insert(5, json.dumps({"value": 1}) + "\n")
    (data / "1.jsonl").write_text("".join(lines))
    events = {"on_error": on_error, **({"dead_letter": "dead"} if on_error == "dead_letter" else {})}
    return write_counting_job(tmp_path, "bad-input", events=events,
                              outputs={"dead": {"system": "jsonl", "path": "out/dead"}})


def test_bad_input_fail_names_stream_partition_offset(tmp_path, spark_context):
    job = load_job_config(_bad_input_job(tmp_path, "fail"))
    with pytest.raises(InputError) as caught:
        SparkJobRunner(job, context=spark_context, progress=None).run()
    assert caught.value.context["stream"] == "events"
    assert caught.value.context["partition"] == 1 and caught.value.context["offset"] == 3
    assert "on_error" in caught.value.hint
    # nothing was committed for partition 1
    assert job.state_dir.joinpath("bad-input", "checkpoints", "1.json").exists() is False or \
        json.loads(job.state_dir.joinpath("bad-input", "checkpoints", "1.json").read_text())["inputs"] == {}


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_bad_input_skip_and_dead_letter(tmp_path, spark_context, policy):
    job = load_job_config(_bad_input_job(tmp_path, policy))
    summary = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert summary.records_in == 62
    assert sum(b.skipped for b in summary.batches) == (2 if policy == "skip" else 0)
    assert sum(b.dead_lettered for b in summary.batches) == (2 if policy == "dead_letter" else 0)
    assert final_counts(job) == dict(Counter(f"k{i % 7}" for i in range(60)))
    dead = [v for p in range(2) for _, v in open_output(job, "dead").read(p)]
    if policy == "dead_letter":
        assert [(d["partition"], d["offset"]) for d in dead] == [(1, 3), (1, 5)]
        assert dead[0]["raw"] == "{this is not json" and dead[1]["error"] == "missing key"
    else:
        assert dead == []


def test_uncommitted_batch_is_rolled_back(tmp_path, spark_context):
    """A batch whose tasks finished (stores flushed, outputs written) but whose checkpoints the
    driver never saved (it died) leaves no trace: changelogs are trimmed, outputs truncated."""
    from localstate.runtime.spark.runner import run_partition

    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    runner = SparkJobRunner(job, context=spark_context, batch_size=10, progress=None)
    runner.run(batches=1)                                   # one committed batch
    plans, _ = runner.plan(1)
    for plan in plans:                                      # a batch the driver never commits
        result = run_partition(job, plan)
        assert result["in"] == 10 and result["out"] > 0
    written = {p: len(list(open_output(job, "counts-out").read(p))) for p in range(2)}
    assert all(n >= 18 for n in written.values())
    summary = SparkJobRunner(job, context=spark_context, progress=None).run()
    assert summary.records_in == 62 - 20 and sum(b.trimmed for b in summary.batches) > 0
    output = open_output(job, "counts-out")
    for partition in range(2):
        seen: dict = {}
        for key, count in output.read(partition):
            assert count == seen.get(key, 0) + 1, f"{key}: {count} after {seen.get(key)}"
            seen[key] = count
    assert final_counts(job) == dict(Counter(f"k{i % 7}" for i in range(60)))
