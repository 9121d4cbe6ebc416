"""Scale-out smoke test: `localstate run --master spark://...` runs the windowed-counts example on
the session's standalone cluster (master and two workers on 127.0.0.1, from the pip pyspark
distribution's spark-class) and its outputs are exact."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from localstate.core.config import load_job_config
from tests.spark.test_spark_runtime import EXAMPLES, actual_hourly, expected_hourly

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.slow]

#: Events per partition: two batches of 4000 on the cluster, the first hour of every user closed
#: (the example's 20000 add nothing here).
EVENTS = 8000


def test_run_on_standalone_cluster(tmp_path, live_cluster):
    shutil.copytree(EXAMPLES / "windowed_counts", tmp_path / "job")
    job_file = tmp_path / "job" / "job.toml"
    source = job_file.read_text()
    assert "events = 20000" in source
    job_file.write_text(source.replace("events = 20000", f"events = {EVENTS}"))
    done = subprocess.run([sys.executable, "-c", "import sys; from localstate.core.cli import main; "
                           "sys.exit(main())", "run", str(job_file), "--master", live_cluster.url,
                           "--batch-size", str(EVENTS // 2)], env=live_cluster.env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "lag 0" in done.stdout
    job = load_job_config(job_file)
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
