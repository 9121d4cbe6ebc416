"""docs/spark-users.md's code blocks are docs/snippets/spark_users/first_day.py, included with
``--8<--``: this runs that file in a copy of its folder, with its own ``local[2,4]`` session (a
subprocess: the tests' shared SparkContext stays out of it), and checks what it prints."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets" / "spark_users"
pytestmark = pytest.mark.spark


def test_the_page_includes_the_snippets() -> None:
    page = (ROOT / "docs" / "spark-users.md").read_text(encoding="utf-8")
    for section in ("session", "progress", "errors", "reader"):
        assert f'--8<-- "spark_users/first_day.py:{section}"' in page, section


def test_first_day_runs(tmp_path: Path) -> None:
    folder = tmp_path / "spark_users"
    shutil.copytree(SNIPPETS, folder, ignore=shutil.ignore_patterns("state", "checkpoint", "in", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "first_day.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"batch 0: applied by \[0, 1\], replayed by \[\], .*4 rows in, 4 out", out), out
    assert re.search(r"batch 0: applied by \[\], replayed by \[0, 1\], .*0 rows in, 0 out", out), out
    assert "SchemaError: key column 'user' is not in the DataFrame" in out
    assert "SQLSTATE" not in out and "=== Streaming Query ===" not in out  # the Python error alone
    # quiet_logs: the failed query's error is raised, not printed first as a JVM stack trace
    assert "\tat org.apache" not in done.stderr and "MicroBatchExecution" not in done.stderr, done.stderr[-4000:]
    assert "[Stage " not in done.stderr  # no progress bar
    assert "never retries" not in done.stderr  # local[2,4]
    for user, count in (("ada", 2), ("bob", 1), ("cy", 1)):
        assert re.search(rf"\|\s*\d\|\s*{user}\|\s*{count}\|", out), out
    assert re.search(r"\|\s*\d\|\s*ada\|\s*2\.0\|\s*NULL\|", out), out
