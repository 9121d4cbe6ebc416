"""A Spark user's own ``local[2]`` session (SparkSession.builder, not localstate's helper), in a
subprocess so that it does not meet the tests' shared SparkContext: the DataFrame step warns once per
SparkContext that the session never retries a failed task, and ``localstate.spark.unwrap_error``
returns the typed error behind a streaming query's exception for a missing key column and for a
value the store's serde refuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.runtime.spark.dataframe import task_attempts

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.spark


def test_own_local2_session_warns_once_and_errors_unwrap(tmp_path):
    shutil.copy(HERE / "own_session_driver.py", tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(tmp_path / "own_session_driver.py"), str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["outputs"] for r in results if "batch" in r] == [0, 0]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING") and "never retries" in line]
    assert len(warnings) == 1, done.stderr[-4000:]  # two batches, one SparkContext: one warning
    assert "local[2]" in warnings[0] and "'local[2,4]'" in warnings[0]
    cases = {r["case"]: r for r in results if "case" in r}
    assert cases["missing key"]["raised"] == "StreamingQueryException"
    assert cases["missing key"]["error"] == "SchemaError"
    assert "key column 'usr' is not in the DataFrame" in cases["missing key"]["message"]
    assert cases["serde"]["raised"] == "StreamingQueryException"
    assert cases["serde"]["error"] == "SerdeError", cases["serde"]  # its own type, not TaskError
    assert "store 'counts'" in cases["serde"]["message"]


@pytest.mark.parametrize(("master", "conf", "attempts"), [
    ("local", {}, 1), ("local[2]", {}, 1), ("local[*]", {"spark.task.maxFailures": "8"}, 1),
    ("local[2,4]", {}, 4), ("local[*, 3]", {}, 3), ("spark://host:7077", {}, 4),
    ("spark://host:7077", {"spark.task.maxFailures": "1"}, 1), ("yarn", {"spark.task.maxFailures": "2"}, 2)])
def test_task_attempts_of_a_master(master, conf, attempts):
    assert task_attempts(master, conf) == attempts


def test_unwrap_error_reads_the_python_error_out_of_spark_text():
    import localstate.spark
    from localstate.errors import ExecutorError, SerdeError, TaskError

    def spark_text(error_line: str) -> Exception:
        return RuntimeError("[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
                            "in foreach batch sink.\nTraceback (most recent call last):\n"
                            '  File "/app/query.py", line 3, in handle\n    sink(run_batch(df))\n'
                            f"{error_line}\n\tat org.apache.spark.sql.execution.Foo(Foo.scala:1)\n")

    serde = localstate.spark.unwrap_error(spark_text("localstate.errors.SerdeError: store 'counts': cannot encode"))
    assert type(serde) is SerdeError and "store 'counts'" in str(serde) and "org.apache" not in str(serde)
    died = localstate.spark.unwrap_error(spark_text("localstate.errors.ExecutorError: Spark batch 3 failed"))
    assert type(died) is ExecutorError
    assert localstate.spark.unwrap_error(spark_text("ValueError: not ours")) is None
    assert localstate.spark.unwrap_error(RuntimeError("no traceback")) is None
    assert localstate.spark.unwrap_error(None) is None
    own = TaskError("boom")
    assert localstate.spark.unwrap_error(own) is own
