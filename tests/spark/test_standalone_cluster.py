"""Scale-out smoke test: a Spark standalone master and worker on 127.0.0.1 (from the pip pyspark
distribution's spark-class), running the windowed-counts example with `localstate run --master`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.core.spark.devcluster import free_port, wait_for_port

from .test_spark_runtime import EXAMPLES, actual_hourly, expected_hourly

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_run_on_standalone_cluster(tmp_path):
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    if not spark_class.exists():
        pytest.skip("this pyspark distribution ships no bin/spark-class")
    port, web = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_WORKER_DIR": str(tmp_path / "work")}
    master = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(web)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        wait_for_port(port, 60)
        worker = subprocess.Popen([str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                   "--cores", "2", "--memory", "1g", "--webui-port", str(free_port()),
                                   f"spark://127.0.0.1:{port}"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.copytree(EXAMPLES / "windowed_counts", tmp_path / "job")
        job_file = tmp_path / "job" / "job.toml"
        done = subprocess.run([sys.executable, "-c", "import sys; from localstate.core.cli import main; "
                               "sys.exit(main())", "run", str(job_file), "--master", f"spark://127.0.0.1:{port}",
                               "--batch-size", "10000"], env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "lag 0" in done.stdout
        job = load_job_config(job_file)
        assert actual_hourly(job) == expected_hourly(job)
    finally:
        for process in (worker, master):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
