"""Why a failed Spark task attempt failed, from the error text Spark's status store keeps for it (the
cluster masters' source of reasons; no Spark needed here), and how those reasons replace the
driver's placeholders for attempts whose cause it could not see."""

from __future__ import annotations

from localstate.runtime.spark.failures import attempt_error, failed_attempt_reasons, merge_attempt_reasons

PYTHON_FAILURE = """org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/pyspark/worker.py", line 1247, in main
    process()
  File "/opt/venv/lib/python3.11/site-packages/localstate/changelog/objectstore/storage.py", line 93, in put
    raise ChangelogError(f"cannot write object {self.where(key)}: {exc}", path=self.where(key),
localstate.errors.ChangelogError: cannot write object s3://bucket/p/changelogs/s/3/deltas/x.delta: When uploading part: AWS Error NETWORK_CONNECTION
  hint: check that the storage is reachable, writable and the credentials valid

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:940)
"""

EXECUTOR_LOST = ("ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: Remote RPC "
                 "client disassociated. Likely due to containers exceeding thresholds, or network issues.")

WORKER_DIED = """org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse(PythonRunner.scala:621)
Caused by: java.io.EOFException
"""


def test_the_python_exception_of_an_attempt_without_java_frames():
    kind, message = attempt_error(PYTHON_FAILURE)
    assert kind == "ChangelogError"
    assert message == ("cannot write object s3://bucket/p/changelogs/s/3/deltas/x.delta: When uploading part: "
                       "AWS Error NETWORK_CONNECTION")


def test_a_lost_executor_and_a_dead_worker():
    assert attempt_error(EXECUTOR_LOST) == ("ExecutorLostFailure", EXECUTOR_LOST[len("ExecutorLostFailure "):])
    assert attempt_error(WORKER_DIED) == ("WorkerExited", "Python worker exited unexpectedly (crashed)")
    assert attempt_error("") == ("Error", "")


def test_known_reasons_replace_the_placeholders_of_counted_attempts():
    results = [{"partition": 2, "attempt": 2}, {"partition": 0, "attempt": 0}]
    counted = failed_attempt_reasons(None, 7, results)  # a cluster master: no folder of reasons
    assert [(r["partition"], r["attempt"], r["type"]) for r in counted] == [(2, 0, "WorkerExited"),
                                                                             (2, 1, "WorkerExited")]
    known = [{"batch": 7, "partition": 2, "attempt": 1, "type": "ExecutorLostFailure", "message": "executor 1 exited",
              "host": "host-b"},
             {"batch": 7, "partition": 3, "attempt": 0, "type": "ChangelogError", "message": "cannot write",
              "host": "host-a"}]
    merged = merge_attempt_reasons(counted, known)
    assert [(r["partition"], r["attempt"], r["type"], r["host"]) for r in merged] == [
        (2, 0, "WorkerExited", None), (2, 1, "ExecutorLostFailure", "host-b"), (3, 0, "ChangelogError", "host-a")]
    assert merged[0]["message"] == "failed on an executor (Spark recorded no reason for it) (attempt 0 of partition 2)"


STREAMING_FAILURE = """[STREAM_FAILED] Query [id = 9eca, runId = 1007] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. \
Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/localstate/runtime/spark/dataframe.py", line 185, in dataframe_spec
    raise SchemaError(f"{role} column {name!r} is not in the DataFrame", column=name,
localstate.errors.SchemaError: key column 'user' is not in the DataFrame [column=user]
  what to do: name one of its columns: name string, ts bigint
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = 9eca, runId = 1007]
Current Committed Offsets: {}

Current State: ACTIVE
Thread State: RUNNABLE
"""


def test_a_streaming_querys_error_is_the_python_error_alone():
    """unwrap_error of a failed query (issue #48): the message ends with the hint, without Spark's
    SQLSTATE codes (one per wrapping exception) or the query's description."""
    from localstate.errors import SchemaError
    from localstate.spark import unwrap_error

    error = unwrap_error(Exception(STREAMING_FAILURE))
    assert isinstance(error, SchemaError)
    assert str(error) == ("key column 'user' is not in the DataFrame [column=user]\n"
                          "  what to do: name one of its columns: name string, ts bigint")
