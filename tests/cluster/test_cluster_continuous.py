"""Continuous mode on a standalone cluster (master and two workers on 127.0.0.1): `localstate run`
with ``[spark] mode = "continuous"`` runs the windowed-counts example's long-running tasks on the
workers until its input is drained, and the closed hours are exact."""

from __future__ import annotations

import subprocess

import pytest

from localstate.core.config import load_job_config
from tests.spark.test_spark_runtime import actual_hourly, cli_command, expected_hourly, windowed_counts_job

# slow: the local continuous tests (tests/spark/test_continuous.py) run the same task code in the default run
pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow]

EVENTS = 8000


def test_continuous_run_on_standalone_cluster(tmp_path, live_cluster):
    job_file = windowed_counts_job(tmp_path, EVENTS)
    text = job_file.read_text()
    assert text.count("[spark]\n") == 1
    job_file.write_text(text.replace("[spark]\n", '[spark]\nmode = "continuous"\nepoch = "1m"\n'))
    done = subprocess.run(cli_command("run", str(job_file), "--until-drained", "--master", live_cluster.url),
                          env=live_cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "continuous:" in done.stdout and "committed" in done.stdout
    job = load_job_config(job_file)
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
