"""Errors raised by a task's code, without Spark: the TaskTestDriver path, load_task_class and the CLI.

Every error names the exception type, its message and the user's file and line, and carries the
Python traceback (the user's frames first)."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import textwrap
import traceback
import uuid
from pathlib import Path

import pytest

import localstate.runtime.partition.instance as runtime_module
from localstate.runtime.spark.failures import python_traceback, spark_failure
from localstate.core.task import StreamTask, load_task_class
from localstate.testing.driver import TaskTestDriver
from localstate.core.tracebacks import is_user_file
from localstate.errors import ConfigError, ExecutorError, FencedError, InvalidValueError, TaskError

THIS = Path(__file__).resolve()
COUNTS = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(THIS.read_text().splitlines(), 1) if line.endswith(f"# MARK: {marker}"))


def _ratio(value):
    return 100 // value  # MARK: ratio


class Divides(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("out", envelope.key, _ratio(envelope.value))


class BadInit(StreamTask):
    def init(self, context):
        self.limit = int(context.job.split("-")[0])  # MARK: init

    def process(self, envelope, collector, coordinator):
        pass


class BadConstructor(StreamTask):
    def __init__(self):
        raise LookupError("no model")  # MARK: ctor

    def process(self, envelope, collector, coordinator):
        pass


class BadWindow(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

    def window(self, collector, coordinator):
        raise ArithmeticError("window math")  # MARK: window


class BadClose(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

    def close(self):
        raise RuntimeError("close failed")  # MARK: close


def _forever(n):
    return _forever(n + 1)  # MARK: recursion


class Recurses(StreamTask):
    def process(self, envelope, collector, coordinator):
        _forever(0)


class Overflows(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("out", envelope.key, 2.0 ** envelope.value)  # MARK: overflow


class Exits(StreamTask):
    def process(self, envelope, collector, coordinator):
        sys.exit(3)  # MARK: exit


class Interrupted(StreamTask):
    def process(self, envelope, collector, coordinator):
        raise KeyboardInterrupt


class PutsNone(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, None)  # MARK: put-none


def assert_names(error, type_name: str, message: str, marker: str) -> None:
    text = str(error)
    assert f"{type_name}: {message}" in text, text
    assert f"{THIS}:{line_of(marker)}" in text, text
    assert error.location.startswith(f"{THIS}:{line_of(marker)} in ")
    assert error.traceback_summary.startswith("in your code (most recent call last):")
    frames = re.findall(r'File "([^"]+)", line (\d+)', error.traceback_summary)
    assert frames and frames[-1] == (str(THIS), str(line_of(marker)))
    assert "full traceback:" in error.traceback and "Traceback (most recent call last):" in error.traceback


def test_process_error_names_type_message_and_user_line(tmp_path):
    with TaskTestDriver(Divides, state_dir=tmp_path) as driver:
        driver.send("in", "a", 5)
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 0)
    error = info.value
    assert_names(error, "ZeroDivisionError", "integer division or modulo by zero", "ratio")
    assert "task process() raised" in str(error)
    assert error.context == {"stream": "in", "partition": 0, "offset": 1}
    assert isinstance(error.__cause__, ZeroDivisionError)
    # Both of the user's frames, outermost first; localstate's own frames only in the full traceback.
    summary_files = re.findall(r'File "([^"]+)"', error.traceback_summary)
    assert summary_files == [str(THIS), str(THIS)]
    assert runtime_module.__file__ in error.traceback


@pytest.mark.parametrize("task, type_name, message, marker, call", [
    (BadInit, "ValueError", "invalid literal for int()", "init", "init()"),
    (BadConstructor, "LookupError", "no model", "ctor", "constructor BadConstructor()"),
])
def test_open_errors_name_the_user_line(tmp_path, task, type_name, message, marker, call):
    with pytest.raises(TaskError) as info:
        TaskTestDriver(task, state_dir=tmp_path)
    assert_names(info.value, type_name, message, marker)
    assert f"task {call} raised" in str(info.value) and info.value.context == {"partition": 0}
    # The failed open released the partition: a fixed task opens it.
    with TaskTestDriver(Divides, state_dir=tmp_path) as driver:
        driver.send("in", "a", 1)


def test_window_and_close_errors_name_the_user_line(tmp_path):
    with TaskTestDriver(BadWindow, state_dir=tmp_path / "w", window_interval=10) as driver:
        with pytest.raises(TaskError) as info:
            driver.advance(11)
        assert_names(info.value, "ArithmeticError", "window math", "window")
    driver = TaskTestDriver(BadClose, state_dir=tmp_path / "c")
    with pytest.raises(TaskError) as info:
        driver.close()
    assert_names(info.value, "RuntimeError", "close failed", "close")
    assert "task close() raised" in str(info.value)


def test_recursion_and_overflow_are_task_errors(tmp_path):
    with TaskTestDriver(Recurses, state_dir=tmp_path / "r") as driver:
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 1)
    assert_names(info.value, "RecursionError", "maximum recursion depth exceeded", "recursion")
    # Hundreds of identical frames are folded: the summary stays short.
    assert len(info.value.traceback_summary.splitlines()) < 40
    with TaskTestDriver(Overflows, state_dir=tmp_path / "o") as driver:
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 5000)
    assert_names(info.value, "OverflowError", "(34, 'Numerical result out of range')", "overflow")


def test_sys_exit_in_process_is_a_task_error_and_keyboard_interrupt_propagates(tmp_path):
    with TaskTestDriver(Exits, state_dir=tmp_path / "e") as driver:
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 1)
    assert_names(info.value, "SystemExit", "3", "exit")
    with TaskTestDriver(Interrupted, state_dir=tmp_path / "i") as driver:
        with pytest.raises(KeyboardInterrupt):
            driver.send("in", "a", 1)


def test_store_misuse_keeps_its_type_and_gains_the_user_line(tmp_path):
    with TaskTestDriver(PutsNone, stores=COUNTS, state_dir=tmp_path) as driver:
        with pytest.raises(InvalidValueError) as info:
            driver.send("in", "a", 1)
    error = info.value
    assert error.context["at"].startswith(f"{THIS}:{line_of('put-none')} in process")
    assert error.context["stream"] == "in" and error.context["offset"] == 0
    assert f"{THIS}:{line_of('put-none')}" in str(error)


def test_traceback_survives_pickling(tmp_path):
    with TaskTestDriver(Divides, state_dir=tmp_path) as driver:
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 0)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is TaskError and str(copy) == str(info.value)
    assert (copy.traceback, copy.traceback_summary, copy.location) == \
        (info.value.traceback, info.value.traceback_summary, info.value.location)


def test_user_frames_are_files_outside_localstate_stdlib_and_pyspark(tmp_path):
    import json

    import localstate.runtime.spark.runner as runner

    assert is_user_file(str(THIS)) and is_user_file(str(tmp_path / "task.py"))
    assert not is_user_file(runtime_module.__file__) and not is_user_file(runner.__file__)
    assert not is_user_file(json.__file__) and not is_user_file("<frozen importlib._bootstrap>")
    assert not is_user_file("/opt/spark/python/lib/pyspark.zip/pyspark/worker.py")
    assert not is_user_file("/usr/lib/python3/dist-packages/numpy/core/fromnumeric.py")


class ReshapesBadly(StreamTask):
    def process(self, envelope, collector, coordinator):
        import numpy

        numpy.reshape(numpy.arange(3), (2, 2))  # MARK: numpy


def test_error_inside_an_installed_package_points_at_the_users_call(tmp_path):
    with TaskTestDriver(ReshapesBadly, state_dir=tmp_path) as driver:
        with pytest.raises(TaskError) as info:
            driver.send("in", "a", 1)
    assert_names(info.value, "ValueError", "cannot reshape array of size 3 into shape (2,2)", "numpy")
    assert "numpy" in info.value.traceback.split("full traceback:")[1]  # numpy's frames: in the full one only


# -- load_task_class ------------------------------------------------------------------------------
def _module(tmp_path: Path, source: str) -> str:
    name = f"task_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    return name


def test_module_calling_sys_exit_at_import_is_a_config_error(tmp_path):
    name = _module(tmp_path, """\
        import sys

        sys.exit(7)
        """)
    with pytest.raises(ConfigError) as info:
        load_task_class(f"{name}:Task")
    text = str(info.value)
    assert f"module {name!r} called sys.exit(7)" in text and "job.task" in text
    assert f"{tmp_path / name}.py:3" in text
    assert info.value.problems[0].path == "job.task"


def test_module_raising_at_import_names_its_line(tmp_path):
    name = _module(tmp_path, """\
        import os

        THRESHOLD = int(os.environ["NO_SUCH_VARIABLE_FOR_LOCALSTATE"])
        """)
    with pytest.raises(ConfigError) as info:
        load_task_class(f"{name}:Task")
    assert "KeyError: 'NO_SUCH_VARIABLE_FOR_LOCALSTATE'" in str(info.value)
    assert f"{tmp_path / name}.py:3" in str(info.value)
    assert info.value.traceback_summary.startswith("in your code")


def test_keyboard_interrupt_at_import_propagates(tmp_path):
    name = _module(tmp_path, "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_task_class(f"{name}:Task")


def test_missing_class_and_non_task_class(tmp_path):
    name = _module(tmp_path, "class NotATask:\n    pass\n")
    with pytest.raises(ConfigError, match="AttributeError"):
        load_task_class(f"{name}:Missing")
    with pytest.raises(ConfigError, match="not a StreamTask subclass"):
        load_task_class(f"{name}:NotATask")


# -- the CLI --------------------------------------------------------------------------------------
def _job(tmp_path: Path, task: str) -> Path:
    (tmp_path / "job.toml").write_text(f"""\
[job]
name = "cli-errors"
partitions = 1
task = "{task}"
state_dir = "state"

[inputs.events]
system = "generator"
kind = "page_views"
events = 3

[outputs.out]
system = "file"
path = "out"
""")
    return tmp_path / "job.toml"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localstate.tools.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ})


@pytest.mark.parametrize("command", ["validate", "run"])
def test_cli_task_module_exiting_at_import_exits_1_with_a_typed_message(tmp_path, command):
    (tmp_path / "exits_at_import.py").write_text("import sys\n\nsys.exit(7)\n")
    result = _cli(command, str(_job(tmp_path, "exits_at_import:Task")), cwd=tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.startswith(f"localstate {command}: error: ")
    assert "called sys.exit(7)" in result.stderr and "exits_at_import" in result.stderr
    assert f"{tmp_path / 'exits_at_import.py'}:3" in result.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_cli_prints_user_frames_and_the_full_traceback_with_v(tmp_path, command):
    (tmp_path / "broken_import.py").write_text("def helper():\n    return {}['key']\n\n\nhelper()\n")
    job = str(_job(tmp_path, "broken_import:Task"))
    quiet = _cli(command, job, cwd=tmp_path)
    assert quiet.returncode == 1
    assert "in your code (most recent call last):" in quiet.stderr
    assert f'File "{tmp_path / "broken_import.py"}", line 2, in helper' in quiet.stderr
    assert "full traceback:" not in quiet.stderr and "run with -v" in quiet.stderr
    verbose = _cli("-v", command, job, cwd=tmp_path)
    assert verbose.returncode == 1 and "full traceback:" in verbose.stderr
    assert "importlib" in verbose.stderr.split("full traceback:")[1]


# -- the Spark fallback's parser, on a real Python traceback in the shape Spark reports it ----------
def _raises_fenced():
    raise FencedError("partition 0 is held by a newer instance", partition=0, hint="stop this one")  # MARK: fenced


def test_fallback_keeps_a_localstate_error_type_and_drops_java():
    try:
        _raises_fenced()
    except FencedError:
        python = traceback.format_exc()
    text = ("An error occurred while calling o87.collectAndServe.\n: org.apache.spark.SparkException: Job aborted "
            "due to stage failure: Task 0 in stage 3.0 failed 4 times, most recent failure: Lost task 0.3 in stage "
            "3.0 (TID 12) (host executor driver): org.apache.spark.api.python.PythonException: " + python +
            "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException("
            "PythonRunner.scala:572)\n\tat scala.collection.Iterator.foreach(Iterator.scala:943)\n")
    assert python_traceback(text).strip() == python.strip()
    error = spark_failure(RuntimeError(text), 5)
    assert type(error) is FencedError
    assert str(error).startswith("Spark batch 5 failed after 4 attempt(s): partition 0 is held by a newer instance")
    assert "what to do: stop this one" in str(error)
    assert f"{THIS}:{line_of('fenced')}" in error.location
    for java in ("org.apache", ".scala:", "\tat "):
        assert java not in str(error) and java not in error.traceback


def test_fallback_without_python_traceback_names_the_reason():
    text = ("An error occurred while calling o90.collectAndServe.\n: org.apache.spark.SparkException: Job aborted "
            "due to stage failure: Task 1 in stage 7.0 failed 4 times, most recent failure: Lost task 1.3 in stage "
            "7.0 (TID 30) (host executor driver): org.apache.spark.SparkException: Python worker exited "
            "unexpectedly (crashed)\n\tat org.apache.spark.api.python.BasePythonRunner(PythonRunner.scala:612)\n")
    error = spark_failure(RuntimeError(text), 2)
    assert isinstance(error, ExecutorError)
    assert str(error).startswith("Spark batch 2 failed after 4 attempt(s): Python worker exited unexpectedly (crashed)")
    assert "org.apache" not in str(error)


def test_fallback_when_spark_itself_failed_has_no_java():
    text = ("An error occurred while calling o23.collectAndServe.\n: java.lang.IllegalStateException: Cannot call "
            "methods on a stopped SparkContext.\n\tat org.apache.spark.SparkContext.assertNotStopped("
            "SparkContext.scala:122)\n")
    error = spark_failure(RuntimeError(text), 0)
    assert isinstance(error, ExecutorError)
    assert "Cannot call methods on a stopped SparkContext." in str(error)
    assert "java.lang" not in str(error) and "org.apache" not in str(error) and ".scala:" not in str(error)
