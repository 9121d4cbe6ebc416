"""`localstate validate` reports every problem of a job in one run, across the file's shape, stores,
inputs (system, options, missing directories), outputs and the task; `localstate run` refuses a
missing input directory instead of running an empty input."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localstate.core.config import load_job_config, parse_job_config
from localstate.tools.validation import check_job, require_input_paths
from localstate.errors import ConfigError
from toml_tables import toml_text  # tests/ is on sys.path (tests/conftest.py)

TASK = ("from localstate.core.task import StreamTask\n\n"
        "class T(StreamTask):\n    def process(self, envelope, collector, coordinator):\n        pass\n")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localstate", *args], capture_output=True, text=True, cwd=cwd)


def _write(tmp_path: Path, text: str) -> Path:
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent(text))
    return job_file


def test_store_input_system_missing_path_and_task_reported_at_once(tmp_path):
    job_file = _write(tmp_path, toml_text({
        "job": {"name": "j", "task": "no_such_tasks_module:Task"},
        "inputs.clicks": {"system": "jsnl", "path": "data/clicks"},
        "inputs.views": {"system": "jsonl", "path": "data/veiws"},
        "stores.counts": {"engine": "kv", "backend": "rocksbd"},
    }))
    result = _cli("validate", str(job_file), cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    for path in ("stores.counts.backend", "inputs.clicks.system", "inputs.views.path", "job.task"):
        assert f"  - {path}:" in result.stderr, path
    assert "4 problems" in result.stderr
    assert str(tmp_path / "data" / "veiws") in result.stderr       # the resolved path, for the operator
    assert "Traceback" not in result.stderr


def test_file_input_with_missing_stream_directory_and_output_problem_with_bad_store(tmp_path):
    (tmp_path / "logs").mkdir()                                       # the root exists, the stream does not
    (tmp_path / "t.py").write_text(TASK)
    (tmp_path / "notadir").write_text("x")
    job_file = _write(tmp_path, """
        [job]
        name = "j"
        task = "t:T"
        [inputs.events]
        system = "file"
        path = "logs"
        [inputs.more]
        system = "jsonl"
        path = "notadir"
        [outputs.o]
        system = "jsonl"
        path = "out"
        fsync = "sometimes"
        [stores.s]
        engine = "no-such-engine"
    """)
    result = _cli("validate", str(job_file), cwd=tmp_path)
    assert result.returncode == 1
    assert "inputs.events.path" in result.stderr and str(tmp_path / "logs" / "events") in result.stderr
    assert "inputs.more.path" in result.stderr and "is not a directory" in result.stderr
    assert "outputs.o.fsync" in result.stderr
    assert "stores.s.engine" in result.stderr
    assert "4 problems" in result.stderr


def test_check_job_keeps_going_after_job_table_problems(tmp_path):
    """A broken job name and partition count do not hide the streams' and the task's problems."""
    job_file = _write(tmp_path, """
        [job]
        name = "../up"
        partitions = -1
        task = "nope_module:X"
        commit_every = 0
        [inputs.a]
        system = "jsonl"
        path = "missing"
        [outputs.b]
        system = "nosuch"
    """)
    check = check_job(job_file)
    assert {p.path for p in check.problems} == {"job.name", "job.partitions", "job.commit_every", "inputs.a.path",
                                               "outputs.b.system", "job.task"}
    # the strict loader still refuses the file, as before
    with pytest.raises(ConfigError):
        load_job_config(job_file)


def test_parse_job_config_collect_mode_returns_best_effort_job():
    problems: list = []
    job = parse_job_config({"job": {"name": 3, "task": "m:T"}, "stores": {"s": {"engine": "kv", "backend": "x"}},
                            "inputs": {"i": {"system": "generator"}}}, collect=problems)
    assert {p.path for p in problems} == {"job.name", "stores.s.backend"}
    assert job.name == "unnamed" and "s" not in job.stores and "i" in job.inputs


def test_valid_job_passes_and_commit_interval_is_flagged_as_unused_on_spark(tmp_path):
    (tmp_path / "data" / "views").mkdir(parents=True)
    (tmp_path / "t.py").write_text(TASK)
    job_file = _write(tmp_path, """
        [job]
        name = "j"
        task = "t:T"
        commit_interval = "5s"
        [inputs.views]
        system = "jsonl"
        path = "data/views"
    """)
    result = _cli("validate", str(job_file), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout
    assert "job.commit_interval" in result.stderr and "Spark" in result.stderr


def test_run_refuses_missing_input_directory(tmp_path):
    (tmp_path / "t.py").write_text(TASK)
    job_file = _write(tmp_path, """
        [job]
        name = "j"
        task = "t:T"
        [inputs.views]
        system = "jsonl"
        path = "data/typo"
    """)
    with pytest.raises(ConfigError) as info:
        require_input_paths(load_job_config(job_file))
    assert [p.path for p in info.value.problems] == ["inputs.views.path"]
    assert str(tmp_path / "data" / "typo") in str(info.value)
    result = _cli("run", str(job_file), cwd=tmp_path)              # refused before Spark starts
    assert result.returncode == 1
    assert "inputs.views.path" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()                        # nothing was created


def test_malformed_task_is_reported_once(tmp_path):
    job_file = _write(tmp_path, """
        [job]
        name = "j"
        task = "no_colon_here"
        [stores.s]
        engine = "kv"
        backend = "nope"
    """)
    paths = [p.path for p in check_job(job_file).problems]
    assert sorted(paths) == ["job.task", "stores.s.backend"]
