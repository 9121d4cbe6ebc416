"""Typed errors out of Spark end with their hint (issue #43, item 6): every path that turns a Spark or
Py4J failure into a localstate error (``foreach_batch`` in a streaming query, ``run_batch``, the
native runner, the state reader) gives the error's own message, context and hint, and nothing of
what Spark appends (SQLSTATEs, the streaming query's offsets and logical plan, Java frames), which
stays reachable as ``error.spark_message``. Each case is a real Spark failure on the shared local
context."""

from __future__ import annotations

import re

import json
import sys
from pathlib import Path

import pytest

from counting_job import write_counting_job
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.errors import ChangelogCorruptError, ChangelogError, LocalStateError, SchemaError, SerdeError
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.streams.jsonl import write_jsonl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # own_session_driver's task, as the Python workers import it

pytestmark = pytest.mark.spark

SPARK_TEXT = ("SQLSTATE", "=== Streaming Query ===", "Logical Plan", "Current Committed Offsets", "org.apache",
              "\tat ", "py4j", "Py4JJavaError", "JVM stacktrace")


def assert_clean(error: LocalStateError | None, cls: type[LocalStateError]) -> None:
    """``error`` is a ``cls`` whose text ends with its hint, holds none of Spark's text, and keeps
    Spark's text in ``spark_message``."""
    assert isinstance(error, cls), repr(error)
    text = str(error)
    assert error.hint and text.endswith(f"\n  what to do: {error.hint}"), text
    assert text.count("what to do:") == 1, text
    for marker in SPARK_TEXT:
        assert marker not in text, f"{marker!r} in {text!r}"
    assert error.spark_message and "Traceback (most recent call last)" in error.spark_message


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def dataframe_job(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[job]
name = "{name}"
partitions = 2
task = "own_session_driver:PutsText"
state_dir = "{tmp_path / name}"
pythonpath = ["{HERE}"]

[stores.counts]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"
""")
    return path


def damage_changelog(job_file: Path, store: str = "counts") -> None:
    """Flip the first byte (its crc) of the first record of each partition's first changelog segment
    that holds two or more records: a ChangelogCorruptError for every reader, never a torn tail."""
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    try:
        damaged = 0
        for partition in range(job.partitions):
            segments = sorted(system.partition_dir(job.stores[store].changelog, partition).glob("*.log"))
            for segment in segments:
                data = bytearray(segment.read_bytes())
                if len(data) > 80:
                    data[0] ^= 0xFF
                    segment.write_bytes(bytes(data))
                    damaged += 1
                    break
        assert damaged
    finally:
        system.close()


def failed_query(spark, rows: list[dict], job: Path, key: str, directory: Path) -> BaseException:
    from localstate.spark import foreach_batch

    (directory / "input").mkdir(parents=True)
    (directory / "input" / "rows.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    stream = spark.readStream.schema("user string, text string").json(str(directory / "input"))
    query = (stream.writeStream.foreachBatch(foreach_batch(str(job), key=key, sink=lambda out, batch: out.count()))
             .option("checkpointLocation", str(directory / "checkpoint")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as caught:
        query.awaitTermination()
    return caught.value


def test_foreach_batch_errors_end_with_their_hint(spark, tmp_path):
    import localstate.spark

    missing = failed_query(spark, [{"user": "ada"}], dataframe_job(tmp_path, "fb-missing"), "usr", tmp_path / "q1")
    assert type(missing).__name__ == "StreamingQueryException"
    error = localstate.spark.unwrap_error(missing)
    assert_clean(error, SchemaError)
    assert "key column 'usr' is not in the DataFrame" in str(error)
    assert "=== Streaming Query ===" in error.spark_message  # Spark's text, still reachable

    refused = failed_query(spark, [{"user": "cy", "text": "not a number"}], dataframe_job(tmp_path, "fb-serde"),
                           "user", tmp_path / "q2")
    error = localstate.spark.unwrap_error(refused)
    assert_clean(error, SerdeError)
    assert "store=counts" in str(error) and "own_session_driver.py" in str(error)  # context kept


def test_run_batch_and_state_reader_errors_end_with_their_hint(spark, tmp_path):
    import localstate.spark
    from localstate.spark import read_state, release, run_batch

    job = dataframe_job(tmp_path, "rb-damaged")
    rows = spark.createDataFrame([(f"u{i % 5}", None) for i in range(40)], "user string, text string")
    assert run_batch(rows, str(job), key="user", batch_id=0).count() == 0
    release(str(job))  # the memory stores are gone: the next open restores from the changelog
    damage_changelog(job)

    # run_batch: the restore fails in every attempt (a retryable error), then Spark gives up.
    with pytest.raises(ChangelogCorruptError) as caught:
        run_batch(rows, str(job), key="user", batch_id=1).count()
    assert_clean(caught.value, ChangelogCorruptError)
    assert str(caught.value).startswith("Spark batch 1 failed")

    # The state reader: the failure comes out of a Spark action, unwrap_error types it.
    frame = read_state(spark, str(job), store="counts")
    with pytest.raises(Exception) as failed:
        frame.collect()
    assert_clean(localstate.spark.unwrap_error(failed.value), ChangelogError)


def test_native_runner_errors_end_with_their_hint(spark_context, tmp_path):
    job_file = write_counting_job(tmp_path, "native-damaged", store={"backend": "memory"},
                                  events={"on_misrouted": "allow"})  # keys written to any partition
    data = tmp_path / "data"
    for partition in range(2):
        write_jsonl(data, partition, [{"key": f"k{partition}-{i % 4}", "value": 0, "ts": 0.0} for i in range(20)])
    job = load_job_config(job_file)
    SparkJobRunner(job, context=spark_context, progress=None).run()
    damage_changelog(job_file)
    for partition in range(2):
        write_jsonl(data, partition, [{"key": f"k{partition}-0", "value": 0, "ts": 0.0}])
    with pytest.raises(ChangelogCorruptError) as caught:
        SparkJobRunner(job, context=spark_context, progress=None).run()
    assert_clean(caught.value, ChangelogCorruptError)
    # "after N attempt(s)" where Spark's text says how often the task was tried
    assert re.match(r"Spark batch 0 failed( after \d+ attempt\(s\))?: changelog record failed", str(caught.value))
    assert caught.value.traceback and "org.apache" not in caught.value.traceback


def test_rebuilt_errors_parse_every_shape_of_spark_text():
    """The parser on Spark's text shapes: SQLSTATEs on their own line, appended to the hint's line,
    repeated; a streaming query's description; Java frames; a multi-line message (a ConfigError's
    problems) and an error without a hint."""
    from localstate.runtime.spark.failures import python_error

    def spark_text(exception: str, trailer: str) -> RuntimeError:
        return RuntimeError("[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
                            "in foreach batch sink. Reason: An exception was thrown from the Python worker.\n"
                            "Traceback (most recent call last):\n"
                            '  File "/app/query.py", line 3, in handle\n    sink(run_batch(df))\n'
                            f"{exception}{trailer}")

    trailers = ["\n SQLSTATE: 39000 SQLSTATE: XXKST\n=== Streaming Query ===\nIdentifier: [id = 1]\n"
                "Current Committed Offsets: {}\n\nLogical Plan:\n~WriteToMicroBatchDataSourceV1 ForeachBatchSink\n",
                " SQLSTATE: 39000 SQLSTATE: XXKST\n=== Streaming Query ===\nLogical Plan:\nx\n",
                "\nSQLSTATE: 39000\n", "\n\tat org.apache.spark.sql.Foo(Foo.scala:1)\n",
                "\nJVM stacktrace:\norg.apache.spark.SparkException: x\n", ""]
    exceptions = [
        ("localstate.errors.SchemaError: key column 'usr' is not in the DataFrame [column=usr]\n"
         "  what to do: name one of its columns: user string", "name one of its columns: user string"),
        ("localstate.errors.ConfigError: 2 problems in job.toml:\n  - a: bad\n  - b: worse\n"
         "  what to do: fix each listed entry", "fix each listed entry"),
        ("localstate.errors.FencedError: partition 0 is held", None),
    ]
    for exception, hint in exceptions:
        for trailer in trailers:
            error = python_error(spark_text(exception, trailer))
            assert error is not None and error.hint == hint, (exception, trailer, error)
            text = str(error)
            assert text.endswith(f"what to do: {hint}" if hint else "partition 0 is held"), (trailer, text)
            assert "SQLSTATE" not in text and "Streaming Query" not in text and "org.apache" not in text
            assert "Logical Plan" not in error.traceback_summary and "SQLSTATE" not in error.traceback_summary
            assert error.spark_message.endswith(exception + trailer)
