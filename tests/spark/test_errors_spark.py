"""A failed batch reports the real Python exception: type, message, the user's file and line, and
the Python traceback; never a Java frame. Deterministic failures are not retried by Spark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.spark.failures import python_traceback, spark_failure
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.errors import ConfigError, ExecutorError, LocalStateError, TaskError

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
TASKS = HERE / "failing_tasks.py"
JAVA = ("org.apache", ".scala:", "py4j.protocol", "Py4JJavaError", "\tat ")


def line_of(marker: str) -> int:
    """The line of ``failing_tasks.py`` holding ``# MARK: <marker>``."""
    lines = TASKS.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# MARK: {marker}"))


def write_job(tmp_path: Path, task: str, *, partitions: int = 1, output: str = "file") -> Path:
    (tmp_path / "job.toml").write_text(f"""\
[job]
name = "failing"
partitions = {partitions}
task = "{task}"
state_dir = "state"
pythonpath = ["{HERE}"]

[inputs.events]
system = "generator"
kind = "page_views"
events = 5

[outputs.out]
system = "{output}"
path = "out"
""")
    return tmp_path / "job.toml"


def assert_no_java(text: str) -> None:
    for marker in JAVA:
        assert marker not in text, f"{marker!r} in:\n{text}"


def run_failing(tmp_path: Path, spark_context, task: str, **kwargs) -> LocalStateError:
    job = load_job_config(write_job(tmp_path, task, **kwargs))
    with pytest.raises(LocalStateError) as caught:
        SparkJobRunner(job, context=spark_context, progress=None).run()
    error = caught.value
    assert_no_java(str(error))
    assert error.traceback and error.traceback_summary
    assert_no_java(error.traceback)
    return error


CASES = [
    # task class, marker of the raising line, exception type, message, error class, where (in str)
    ("RaiseInProcess", "process", "ValueError", "invalid literal for int() with base 10: 'not a number'",
     TaskError, "process()"),
    ("RaiseInInit", "init", "KeyError", "'threshold'", TaskError, "init()"),
    ("RaiseInConstructor", "constructor", "RuntimeError", "the model file is missing", TaskError,
     "constructor RaiseInConstructor()"),
    ("Recurse", "recursion", "RecursionError", "maximum recursion depth exceeded", TaskError, "process()"),
    ("Overflow", "overflow", "OverflowError", "int too large to convert to float", TaskError, "process()"),
    # A localstate error raised through the task's code keeps its type and gains the task's location.
    ("MissingStore", "store", "ConfigError", "no-such-store", ConfigError, "at="),
]


@pytest.mark.parametrize("task, marker, type_name, message, error_class, where", CASES,
                         ids=[case[0] for case in CASES])
def test_spark_failure_names_type_message_and_user_line(tmp_path, spark_context, task, marker, type_name, message,
                                                         error_class, where):
    error = run_failing(tmp_path, spark_context, f"failing_tasks:{task}")
    assert type(error) is error_class
    text = str(error)
    location = f"{TASKS}:{line_of(marker)}"
    assert location in text and where in text and message in text
    if error_class is TaskError:
        assert f"raised {type_name}: " in text
    assert error.context["partition"] == 0
    # The summary starts with the user's frames, and its innermost frame is the raising line.
    summary = error.traceback_summary
    assert summary.startswith("in your code")
    frames = re.findall(r'File "([^"]+)", line (\d+)', summary)
    assert frames[-1] == (str(TASKS), str(line_of(marker)))
    assert all(path == str(TASKS) for path, _ in frames), summary
    after_frames = summary.split(f"line {line_of(marker)}, in ")[-1].splitlines()
    assert any(line.startswith(f"{type_name}: ") for line in after_frames), summary
    # The full traceback also has localstate's own frames, after the user's.
    assert "full traceback:" in error.traceback
    assert re.search(r'File ".*/(core|runtime)/(\w+/)?\w+\.py"', error.traceback.split("full traceback:")[1])


def test_task_bug_is_not_retried(tmp_path, spark_context):
    error = run_failing(tmp_path, spark_context, "failing_tasks:RaiseInProcess")
    assert error.context["stream"] == "events" and error.context["offset"] == 0
    attempts = (tmp_path / "state" / "attempts").read_text().splitlines()
    assert attempts == ["attempt"], "a deterministic task error was retried by Spark"


def test_failure_outside_the_task_code_is_an_executor_error(tmp_path, spark_context):
    error = run_failing(tmp_path, spark_context, "failing_tasks:UnencodableOutput", output="jsonl")
    assert isinstance(error, ExecutorError)
    assert "TypeError" in str(error) and "set" in str(error)
    # Not the task's code: the summary shows the innermost (localstate / json) frames instead.
    assert error.traceback_summary.startswith("not in your code")


def test_worker_killed_on_every_attempt_reports_without_java(tmp_path, spark_context):
    error = run_failing_plain(tmp_path, spark_context, "failing_tasks:KillsItsWorker")
    assert isinstance(error, ExecutorError)
    text = str(error)
    assert_no_java(text)
    assert "after 4 attempt(s)" in text and "worker" in text.lower()


def run_failing_plain(tmp_path: Path, spark_context, task: str) -> LocalStateError:
    job = load_job_config(write_job(tmp_path, task))
    with pytest.raises(LocalStateError) as caught:
        SparkJobRunner(job, context=spark_context, progress=None, keep_open=False).run()
    return caught.value


def _raise_chained(_: int) -> int:
    try:
        {}["missing"]
    except KeyError as exc:
        raise ValueError("bad record in a plain Spark job") from exc  # MARK-TEST: chained
    return 0


def test_py4j_fallback_extracts_the_python_traceback(spark_context):
    """What the driver does when a worker raised and Spark gave up: the Python exception, the user's
    frame, and no Java, from a real Py4JJavaError."""
    with pytest.raises(Exception) as caught:
        spark_context.parallelize([1], 1).map(_raise_chained).collect()
    raw = str(caught.value)
    # Depending on the session's error classes, the raw text does or does not carry Java frames
    # (what users saw before); either way the Python traceback is extracted without them.
    python = python_traceback(raw)
    assert python is not None and python.startswith("Traceback (most recent call last):")
    assert_no_java(python)
    error = spark_failure(caught.value, 3)
    assert isinstance(error, ExecutorError) and error.context["batch"] == 3
    text = str(error)
    assert_no_java(text)
    line = next(i for i, src in enumerate(Path(__file__).read_text().splitlines(), 1)
                if src.endswith("# MARK-TEST: chained"))
    assert "ValueError: bad record in a plain Spark job" in text and f"{__file__}:{line}" in text
    assert "SQLSTATE" not in text and "PYTHON_EXCEPTION" not in text
    assert_no_java(error.traceback)
    assert "KeyError: 'missing'" in error.traceback  # the cause, in the full traceback


# -- the CLI, in a subprocess ---------------------------------------------------------------------
def localstate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return subprocess.run([sys.executable, "-m", "localstate.tools.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


# One case through the CLI (a Spark start each): how the CLI prints is the same for every failure
# point; test_spark_failure_names_type_message_and_user_line covers init and the constructor.
@pytest.mark.parametrize("task, marker, type_name", [("RaiseInProcess", "process", "ValueError")])
def test_cli_run_prints_the_python_error_and_the_users_frames(tmp_path, task, marker, type_name):
    result = localstate("run", str(write_job(tmp_path, f"failing_tasks:{task}")), "--master", "local[1]",
                        cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert_no_java(result.stderr)
    assert "Traceback" not in result.stderr.split("full traceback")[0] or "in your code" in result.stderr
    error_line = next(line for line in result.stderr.splitlines() if line.startswith("localstate run: error:"))
    location = f"{TASKS}:{line_of(marker)}"
    assert type_name in error_line and location in error_line
    # The user's frame with its source line is printed without -v.
    assert "in your code (most recent call last):" in result.stderr
    assert f'File "{TASKS}", line {line_of(marker)}' in result.stderr


def test_cli_run_task_module_exiting_at_import(tmp_path):
    (tmp_path / "exits_at_import.py").write_text("import sys\n\nsys.exit(7)\n")
    result = localstate("run", str(write_job(tmp_path, "exits_at_import:Task")), cwd=tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "ConfigError" not in result.stderr  # the message, not a raw traceback
    assert "job.task" in result.stderr and "exits_at_import" in result.stderr and "sys.exit(7)" in result.stderr
    assert f"{tmp_path / 'exits_at_import.py'}:3" in result.stderr
