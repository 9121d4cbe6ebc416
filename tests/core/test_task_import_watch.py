"""A task module that blocks while being imported is named (issue #37): a WARNING after a few
seconds says which module and where it is running, Ctrl-C says what it interrupted, and `localstate
validate` gives up after --import-timeout with a TaskImportTimeout at job.task."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from localstate.core import task as task_module
from localstate.core.task import load_task_class
from localstate.errors import ConfigError, TaskImportTimeout

BLOCKER = textwrap.dedent("""
    import os

    # Blocks until something opens the FIFO for writing: a module that waits at import.
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate")) as gate:
        gate.read()

    from localstate import StreamTask


    class T(StreamTask):
        def process(self, envelope, collector, coordinator):
            pass
""")

# Runs the CLI with the watchdog's first warning after 0.1 s, and Python's own SIGINT handler even if
# the test runner ignores SIGINT (a child would inherit the ignoring).
CLI = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
       "import localstate.core.task as task; task.IMPORT_WARN_AFTER = 0.1\n"
       "from localstate.tools.cli import main\n"
       "sys.exit(main(sys.argv[1:]))\n")


@pytest.fixture
def blocked_job(tmp_path: Path) -> Path:
    """A job whose task module, ``blocker_task``, blocks at import on the FIFO ``gate`` next to it."""
    (tmp_path / "blocker_task.py").write_text(BLOCKER)
    os.mkfifo(tmp_path / "gate")
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "j"\ntask = "blocker_task:T"\n')
    return job


def _cli(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLI, *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_validate_gives_up_on_a_task_module_that_blocks_at_import(blocked_job):
    process = _cli("validate", "--import-timeout", "1.5", str(blocked_job), cwd=blocked_job.parent)
    try:
        out, err = process.communicate(timeout=120)  # a guard against a hang, not a timing check
    finally:
        process.kill()
    assert process.returncode == 1, (out, err)
    module_file = str(blocked_job.parent / "blocker_task.py")
    assert "still importing task module 'blocker_task'" in err and "WARNING" in err  # the watchdog
    assert "job.task: importing task module 'blocker_task'" in err
    assert module_file in err and "did not finish within 1.5s" in err
    assert f"{module_file}:5" in err  # the line the module is blocked on
    assert "--import-timeout" in err  # the hint


def test_ctrl_c_names_the_task_module_being_imported(blocked_job):
    process = _cli("validate", str(blocked_job), cwd=blocked_job.parent)
    try:
        # Wait until the watchdog says the import is under way (the first line on stderr), then Ctrl-C.
        first = process.stderr.readline()
        assert "still importing task module 'blocker_task'" in first, first
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, (out, first + err)
    module_file = blocked_job.parent / "blocker_task.py"
    assert f"localstate validate: interrupted while importing task module 'blocker_task' ({module_file})" in err


def test_ctrl_c_during_an_import_on_the_calling_thread_raises_task_import_interrupted(blocked_job):
    # What `localstate run` and the executors do: import on the calling thread, no timeout.
    script = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"sys.path.insert(0, {str(blocked_job.parent)!r})\n"
              "import localstate.core.task as task; task.IMPORT_WARN_AFTER = 0.1\n"
              "from localstate.errors import TaskImportInterrupted\n"
              "try:\n    task.load_task_class('blocker_task:T')\n"
              "except TaskImportInterrupted as exc:\n    print('caught:', exc, isinstance(exc, KeyboardInterrupt))\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        first = process.stderr.readline()
        assert "still importing task module 'blocker_task'" in first, first
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    module_file = blocked_job.parent / "blocker_task.py"
    assert f"caught: interrupted while importing task module 'blocker_task' ({module_file}) True" in out, err


def test_watchdog_warns_with_module_file_and_line_then_the_import_completes(tmp_path, monkeypatch, caplog):
    gate = threading.Event()
    monkeypatch.setitem(sys.modules, "slow_task_gate", types.SimpleNamespace(gate=gate))
    (tmp_path / "slow_task_mod.py").write_text(
        "import slow_task_gate\n"
        "from localstate import StreamTask\n"
        "slow_task_gate.gate.wait()\n"
        "class T(StreamTask):\n    def process(self, envelope, collector, coordinator):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(task_module, "IMPORT_WARN_AFTER", 0.05)
    monkeypatch.delitem(sys.modules, "slow_task_mod", raising=False)
    caplog.set_level(logging.WARNING, logger="localstate.core.task")
    loaded = {}
    worker = threading.Thread(target=lambda: loaded.setdefault("task", load_task_class("slow_task_mod:T")))
    worker.start()
    try:
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing check
        while not any("slow_task_mod" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        gate.set()
        worker.join(60)
    (record,) = [r for r in caplog.records if "slow_task_mod" in r.getMessage()][:1]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert f"still importing task module 'slow_task_mod' ({tmp_path / 'slow_task_mod.py'})" in message
    assert f"running {tmp_path / 'slow_task_mod.py'}:3" in message
    assert loaded["task"].__name__ == "T"
    sys.modules.pop("slow_task_mod", None)


def test_import_timeout_is_a_config_error_at_job_task(tmp_path, monkeypatch):
    gate = threading.Event()
    monkeypatch.setitem(sys.modules, "stuck_task_gate", types.SimpleNamespace(gate=gate))
    (tmp_path / "stuck_task_mod.py").write_text("import stuck_task_gate\nstuck_task_gate.gate.wait()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TaskImportTimeout) as info:
            load_task_class("stuck_task_mod:T", timeout=0.2)
    finally:
        gate.set()  # let the helper thread finish its import
    error = info.value
    assert isinstance(error, ConfigError) and [p.path for p in error.problems] == ["job.task"]
    assert error.module == "stuck_task_mod" and error.path == str(tmp_path / "stuck_task_mod.py")
    assert error.blocked_at == f"{tmp_path / 'stuck_task_mod.py'}:2"
    sys.modules.pop("stuck_task_mod", None)


def test_a_failing_import_on_the_helper_thread_is_reported_as_before(tmp_path, monkeypatch):
    (tmp_path / "broken_task_mod.py").write_text("raise RuntimeError('no database')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_task_class("broken_task_mod:T", timeout=30)
    assert not isinstance(info.value, TaskImportTimeout)
    assert "RuntimeError: no database" in str(info.value) and "broken_task_mod.py:1" in str(info.value)
