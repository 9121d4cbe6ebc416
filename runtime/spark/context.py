"""The Spark context localstate runs on: quiet log4j settings, task retries on for local masters,
Python workers running this interpreter, and :data:`LOCAL_DEFAULTS` on local masters."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from pyspark import SparkConf, SparkContext

from localstate.runtime.spark.config import is_local_master

__all__ = ["spark_context", "spark_conf", "normalize_master", "LOCAL_DEFAULTS",
           "QUICK_JIT_OPTIONS", "STATUS_RETENTION", "REPEATING_LOGGERS", "quiet_logs"]

LOCAL_DEFAULTS: Mapping[str, str] = {
    # The executor hands each task to its Python worker over a Unix domain socket (Spark >= 4.1;
    # older Sparks ignore the key) instead of TCP loopback, where small writes wait for delayed ACKs.
    "spark.python.unix.domain.socket.enabled": "true",
}
"""Spark settings a local-master context with worker affinity gets unless the job's ``[spark] conf``
sets them (figures: bench/HISTORY.md)."""

STATUS_RETENTION: Mapping[str, str] = {
    # Spark's status store keeps the last 1,000 jobs and stages and 100,000 tasks by default, for a UI
    # that localstate turns off. A standing job starts several jobs a second, so the defaults fill the
    # driver's heap for its first minutes; the runtime reads a batch's failed attempts right after it.
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
    "spark.ui.retainedDeadExecutors": "20",
    "spark.sql.ui.retainedExecutions": "100",
}
"""Spark status-store retention every context gets unless the job's ``[spark] conf`` sets it."""

QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1"
"""JVM options of a local driver whose JVM only schedules (``localstate run`` with worker affinity: the
tasks read their input and do all the work in Python): the quick JIT tier (C1) only, so the optimizing
compiler's threads do not take CPU from the Python workers. Not for the DataFrame path, where the JVM
reads, shuffles and converts the rows."""


REPEATING_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",          # Spark 4.0
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",  # Spark 4.1 and later
)
"""Spark loggers whose ERROR lines (each with a JVM stack trace) repeat a failure the caller gets
anyway, as a typed error: a failed task attempt (retried, then reported by the driver with the
Python traceback), a streaming query that ended with an error (``awaitTermination`` raises it)."""


def _log4j_settings(debug: bool) -> str:
    """The log4j2 settings of a context localstate creates: Spark at WARN, one line per event and no
    JVM stack trace (localstate reports the failure itself, typed, with the Python traceback), and
    :data:`REPEATING_LOGGERS` silent. ``debug`` (``-vv``): INFO, with every stack trace."""
    lines = [
        f"rootLogger.level = {'info' if debug else 'warn'}",
        "rootLogger.appenderRef.stdout.ref = console",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n" + ("%ex" if debug else ""),
        f"appender.console.layout.alwaysWriteExceptions = {'true' if debug else 'false'}",
        f"logger.spark.name = org.apache.spark\nlogger.spark.level = {'info' if debug else 'warn'}",
        # Hadoop's client libraries warn about what a local run does not use (native libraries, ...).
        f"logger.hadoop.name = org.apache.hadoop\nlogger.hadoop.level = {'info' if debug else 'error'}",
    ]
    if not debug:
        lines += [f"logger.repeat{i}.name = {name}\nlogger.repeat{i}.level = off"
                  for i, name in enumerate(REPEATING_LOGGERS)]
    return "\n".join(lines) + "\n"


def quiet_logs(spark: Any) -> None:
    """Make an existing session's logs what a context localstate creates has (:func:`_log4j_settings`): Spark
    at WARN, :data:`REPEATING_LOGGERS` silent (a streaming query's failure is raised by
    ``awaitTermination()``, not printed first as a JVM stack trace), and Python's ``py4j`` logger at
    WARNING. ``spark``: a SparkSession or SparkContext; for a session of your own, call it once,
    right after creating it (``localstate.spark.quiet_logs(spark)``)."""
    context = getattr(spark, "sparkContext", spark)
    context.setLogLevel("WARN")
    jvm = context._jvm
    configurator, off = jvm.org.apache.logging.log4j.core.config.Configurator, jvm.org.apache.logging.log4j.Level.OFF
    for name in REPEATING_LOGGERS:
        configurator.setLevel(name, off)
    logging.getLogger("py4j").setLevel(logging.WARNING)


_log4j_files: dict[bool, Path] = {}
"""this process's log4j settings file, once made"""


def _log4j_file(debug: bool) -> Path:
    """The log4j settings file of this process's JVMs: made once per process with ``mkstemp`` (created
    exclusively, so never written through a symlink or into a file someone else planted in the shared
    temp directory), removed when the process exits."""
    if debug not in _log4j_files:
        fd, name = tempfile.mkstemp(prefix="localstate-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as handle:
            handle.write(_log4j_settings(debug))
        atexit.register(_remove, Path(name), os.getpid())
        _log4j_files[debug] = Path(name)
    return _log4j_files[debug]


def _remove(path: Path, creator: int) -> None:
    if os.getpid() != creator:
        return  # a forked child exiting: the file is its parent's
    try:
        path.unlink()
    except OSError:
        pass


def normalize_master(master: str, max_failures: int = 4) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` never retry a failed task; give them ``max_failures``."""
    if master == "local":
        return f"local[1,{max_failures}]"
    if master.startswith("local[") and master.endswith("]") and "," not in master:
        return f"{master[:-1]},{max_failures}]"
    return master


def spark_conf(master: str, app_name: str = "localstate", conf: Mapping[str, str] | None = None, *,
               quick_jit: bool = False, affinity: bool = True) -> Any:
    """The SparkConf :func:`spark_context` creates a context with: quiet logs, retries on local
    masters, reused Python workers running this interpreter, :data:`STATUS_RETENTION`,
    :data:`LOCAL_DEFAULTS` on local masters with ``affinity`` unless already set, then ``conf`` (the
    job's ``[spark] conf``), which wins over all of them. ``quick_jit``: a local driver JVM that only schedules gets :data:`QUICK_JIT_OPTIONS`."""
    debug = logging.getLogger("localstate").isEnabledFor(logging.DEBUG)  # -vv: the JVM's traces too
    log4j = _log4j_file(debug)
    spark_conf = (SparkConf().setMaster(normalize_master(master)).setAppName(app_name)
                  .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
                  .set("spark.python.worker.reuse", "true")
                  .set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"
                       + (f" {QUICK_JIT_OPTIONS}" if quick_jit and is_local_master(master) else ""))
                  .set("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"))
    for key, value in STATUS_RETENTION.items():
        spark_conf.setIfMissing(key, value)
    if affinity and is_local_master(master):
        for key, value in LOCAL_DEFAULTS.items():
            spark_conf.setIfMissing(key, value)
    for key, value in (conf or {}).items():
        spark_conf.set(key, str(value))
    return spark_conf


def spark_context(master: str = "local[*]", app_name: str = "localstate",
                  conf: Mapping[str, str] | None = None, *, quick_jit: bool = False, affinity: bool = True) -> Any:
    """Get or create the SparkContext (:func:`spark_conf`); a context that already exists is
    returned as it is. JVM options (``quick_jit``, ``spark.driver.extraJavaOptions``) take effect
    only when this starts the JVM: PySpark keeps one JVM per Python process, for every later context."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local_master(master):
        # One host: the driver binds to loopback (else Spark warns on every start of a machine whose
        # hostname resolves to loopback, and picks another interface). Read when the JVM starts.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:  # py4j's INFO and DEBUG lines (every command sent) are not for users
        py4j.setLevel(logging.WARNING)
    return SparkContext.getOrCreate(spark_conf(master, app_name, conf, quick_jit=quick_jit, affinity=affinity))
