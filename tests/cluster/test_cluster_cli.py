"""Scale-out smoke test: `localstate run --master spark://...` runs the windowed-counts example on
the session's standalone cluster (master and two workers on 127.0.0.1, from the pip pyspark
distribution's spark-class) and its outputs are exact."""

from __future__ import annotations

import subprocess

import pytest

from localstate.core.config import load_job_config
from tests.spark.test_spark_runtime import actual_hourly, cli_command, expected_hourly, windowed_counts_job

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

#: Events per partition: two batches of 4000 on the cluster, the first hour of every user closed
#: (the example's 20000 add nothing here).
EVENTS = 8000


def test_run_on_standalone_cluster(tmp_path, live_cluster):
    job_file = windowed_counts_job(tmp_path, EVENTS)
    done = subprocess.run(cli_command("run", str(job_file), "--until-drained", "--master", live_cluster.url,
                                      "--batch-size", str(EVENTS // 2)), env=live_cluster.env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "lag 0" in done.stdout
    job = load_job_config(job_file)
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
