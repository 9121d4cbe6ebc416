"""The Spark context localstate runs on: quiet log4j settings, task retries on for local masters,
Python workers running this interpreter, and :data:`LOCAL_DEFAULTS` on local masters."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

__all__ = ["spark_context", "spark_conf", "normalize_master", "is_local_master", "LOCAL_DEFAULTS",
           "QUICK_JIT_OPTIONS"]

LOCAL_DEFAULTS: Mapping[str, str] = {
    # The executor hands each task to its Python worker over a Unix domain socket (Spark >= 4.1;
    # older Sparks ignore the key) instead of TCP loopback, where the executor's few small writes
    # met Nagle's algorithm and the worker's delayed ACK (~40 ms per task; Spark 4.3's PythonRunner
    # sets no TCP_NODELAY). A micro-batch's fixed cost falls 1.9-2.9x (`python -m bench scaling`,
    # rows "fixed cost", six runs: ~75-80 -> ~29-38 ms per batch). In 1M-event runs (ten batches of
    # ~0.5 s) the gain is within this VM's noise: 2 partitions / 1 partition per round, median 1.71
    # over 15 rounds against 1.57 over 17 over TCP. An earlier session saw the two tasks of a
    # local[2] batch run one after the other with it; no run since has (the 2-partition runs' read
    # phase is half the 1-partition one's; tests/spark/test_batch_overhead.py checks that two tasks
    # overlap). A job may set it to "false" in `[spark] conf`.
    "spark.python.unix.domain.socket.enabled": "true",
}
"""Spark settings a local-master context gets unless the job's ``[spark] conf`` sets them."""

QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1"
"""JVM options of a local driver whose JVM only schedules (``localstate run``: the tasks read their
input and do all the work in Python): compile with the quick JIT tier (C1) only. The optimizing tier's
compiler threads kept compiling Spark's per-job code (Java serialization, closure cleaning, class
loading) through the whole run: the JVM took 2.1-4.8 CPU seconds per million events of ``python -m
bench scaling``'s 2-partition job, from the two Python workers of a 2-core local[2] machine; with C1
only it took 0.65-1.3, and the 2-partition run was faster in 8 of 10 alternated pairs (the
1-partition run moved both ways within the noise). Not for the DataFrame path, where the JVM reads,
shuffles and converts the rows (docs/spark.md, "Scaling with partitions")."""

_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
# Failed task attempts are retried and, if they fail for good, reported by the driver with the
# Python traceback: the executor's own copy of each stack trace is noise.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = fatal
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = fatal
"""


def normalize_master(master: str, max_failures: int = 4) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` never retry a failed task; give them ``max_failures``."""
    if master == "local":
        return f"local[1,{max_failures}]"
    if master.startswith("local[") and master.endswith("]") and "," not in master:
        return f"{master[:-1]},{max_failures}]"
    return master


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[N,F]``, ``local[*]`` (one JVM, one host)."""
    return master == "local" or master.startswith("local[")


def spark_conf(master: str, app_name: str = "localstate", conf: Mapping[str, str] | None = None, *,
               quick_jit: bool = False) -> Any:
    """The SparkConf :func:`spark_context` creates a context with: quiet logs, retries on local
    masters, reused Python workers running this interpreter, :data:`LOCAL_DEFAULTS` on local masters
    unless already set, then ``conf`` (the job's ``[spark] conf``), which wins over all of them.
    ``quick_jit``: a local driver JVM that only schedules gets :data:`QUICK_JIT_OPTIONS`."""
    from pyspark import SparkConf

    log4j = Path(tempfile.gettempdir()) / "localstate-log4j2.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        log4j.write_text(_LOG4J)
    spark_conf = (SparkConf().setMaster(normalize_master(master)).setAppName(app_name)
                  .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
                  .set("spark.python.worker.reuse", "true")
                  .set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"
                       + (f" {QUICK_JIT_OPTIONS}" if quick_jit and is_local_master(master) else ""))
                  .set("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"))
    if is_local_master(master):
        for key, value in LOCAL_DEFAULTS.items():
            spark_conf.setIfMissing(key, value)
    for key, value in (conf or {}).items():
        spark_conf.set(key, str(value))
    return spark_conf


def spark_context(master: str = "local[*]", app_name: str = "localstate",
                  conf: Mapping[str, str] | None = None, *, quick_jit: bool = False) -> Any:
    """Get or create the SparkContext (:func:`spark_conf`); a context that already exists is
    returned as it is. JVM options (``quick_jit``, ``spark.driver.extraJavaOptions``) take effect
    only when this starts the JVM: PySpark keeps one JVM per Python process, for every later context."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import warnings

    warnings.filterwarnings("ignore", message=".*pandas.*", category=FutureWarning)
    from pyspark import SparkContext

    context = SparkContext.getOrCreate(spark_conf(master, app_name, conf, quick_jit=quick_jit))
    context.setLogLevel("ERROR")
    return context
