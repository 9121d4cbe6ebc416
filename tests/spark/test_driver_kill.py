"""SIGKILL the driver (`localstate run` in a subprocess) mid-run, run again: the job continues from
the last checkpoint and the outputs are exact (nothing lost, nothing counted twice)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.spark.runner import SparkJobRunner

from .test_spark_runtime import actual_hourly, cli_command, expected_hourly, windowed_counts_job

pytestmark = pytest.mark.spark

#: Events per partition: 18 batches of 500, so after the kill (3 batches committed, the fourth perhaps
#: too) the rerun still has most of them left: a batch takes tens of milliseconds on a warm worker,
#: and the 0.15 s delay must not let the killed run finish (the example's 20000 add nothing).
EVENTS = 9000
BATCH = 500


@pytest.mark.parametrize("delay", [0.0, 0.15])
def test_driver_sigkill_then_rerun_is_exact(tmp_path, spark_context, delay):
    job_file = windowed_counts_job(tmp_path, EVENTS)
    process = subprocess.Popen(cli_command("run", str(job_file), "--master", "local[2]", "--batch-size", str(BATCH)),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("batch 2:"):
                time.sleep(delay)  # 0: between batches; >0: usually inside batch 3
                os.kill(process.pid, signal.SIGKILL)
                break
    finally:
        process.kill()
        process.wait()
    assert any(line.startswith("batch 2:") for line in seen), "".join(seen)
    job = load_job_config(job_file)
    # The killed driver's JVM and Python workers die with it (they may take a moment).
    summary = SparkJobRunner(job, context=spark_context, batch_size=5000, progress=None).run()
    assert 0 < summary.records_in <= 2 * EVENTS - 2 * 3 * BATCH
    assert summary.lag == 0
    expected = expected_hourly(job)
    assert expected and actual_hourly(job) == expected
