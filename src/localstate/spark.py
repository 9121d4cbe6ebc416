"""localstate for Spark users, in one module: run a localstate task over a DataFrame (:func:`run_batch`,
:func:`foreach_batch` for ``writeStream.foreachBatch``; docs/spark-users.md), and read a job's committed
state, checkpoints and changelogs as DataFrames (:func:`register`, :func:`read_state`).

    from localstate.spark import foreach_batch
    query = stream.writeStream.foreachBatch(foreach_batch("job.toml", key="user", sink=write)).start()
    ...
    query.stop(); release("job.toml")   # the Python workers close the instances they kept open

    import localstate.spark
    localstate.spark.register(spark)                       # once per SparkSession
    counts = (spark.read.format("localstate")
              .option("job", "/abs/path/job.toml").option("store", "counts").load())

or, with localstate's typed errors raised before Spark plans anything::

    counts = localstate.spark.read_state(spark, "/abs/path/job.toml", store="counts")

A localstate error raised inside a streaming query (a batch's SchemaError, TaskError, SerdeError...)
reaches you wrapped in Spark's ``StreamingQueryException``; :func:`unwrap_error` gives it back::

    error = localstate.spark.unwrap_error(query.exception())

Quiet logs in a session of your own, as a ``localstate run`` has them (Spark at WARN, no JVM stack
trace printed before the error a failed query raises)::

    localstate.spark.quiet_logs(spark)

Options, views and the column types: docs/state-reader.md.
"""

from __future__ import annotations

from typing import Any

from localstate.runtime.spark.context import quiet_logs
from localstate.runtime.spark.dataframe import OUTPUT_SCHEMA, DataFrameBatch, foreach_batch, release, run_batch
from localstate.runtime.spark.state_source import SOURCE_NAME, ReadOptions, StateDataSource, load_view
from localstate.errors import LocalStateError
from localstate.runtime.spark.failures import python_error
from localstate.runtime.spark.state_writer import absolute

__all__ = ["run_batch", "foreach_batch", "release", "DataFrameBatch", "OUTPUT_SCHEMA", "register", "read_state",
           "read_savepoint", "bootstrap", "unwrap_error", "quiet_logs", "SOURCE_NAME"]


def register(spark: Any) -> None:
    """Register the ``localstate`` data source with ``spark`` (a SparkSession); idempotent."""
    spark.dataSource.register(StateDataSource)


def read_state(spark: Any, job: str, store: str | None = None, **options: Any) -> Any:
    """``spark.read.format("localstate")`` with ``job``, ``store`` and ``options`` (Spark's option
    names: ``view``, ``raw``, ``readChangeFeed``, ``startOffset``, ``endOffset``, ``checkpointDir``,
    ``batchId``, ``plugins``), registering the source first.

    Relative paths (``job``, ``checkpointDir``, ``plugins``) are resolved here, against this
    process's working directory. The options, the job, the store and its checkpoints are checked here first, so a mistake raises
    localstate's typed error (ConfigError, StateNotFoundError, ...) with its hint, not a Spark
    AnalysisException wrapping it."""
    given = {"job": str(job), **({"store": store} if store is not None else {}),
             **{name: _option_text(value) for name, value in options.items()}}
    return _checked_read(spark, given)


def _checked_read(spark: Any, given: dict[str, str]) -> Any:
    """The state source read with the reader options ``given``, checked here first (the options, the
    job or savepoint, the store), so that a mistake raises localstate's typed error, not Spark's."""
    parsed = ReadOptions.parse(given).absolute()
    load_view(parsed)
    register(spark)
    try:
        return spark.read.format(SOURCE_NAME).options(**parsed.as_options()).load()
    except Exception as exc:  # noqa: BLE001 - Spark wraps the Python error: raise the typed one
        raise _typed(exc) from None


def read_savepoint(spark: Any, savepoint: str, store: str | None = None, **options: Any) -> Any:
    """``spark.read.format("localstate").option("savepoint", ...)``: a savepoint read like a live job
    (the state view of ``store``, or ``view="checkpoints"``), checked whole here first, with the typed
    errors (SavepointCorruptError, ...) raised here (docs/state-as-data.md)."""
    given = {"savepoint": str(savepoint), **({"store": store} if store is not None else {}),
             **{name: _option_text(value) for name, value in options.items()}}
    return _checked_read(spark, given)


def bootstrap(df: Any, job: str, *, store: str | None = None, key: str = "key", value: str = "value",
              overwrite: bool = False, **options: Any) -> None:
    """Build ``job``'s initial state from ``df`` (``df.write.format("localstate")``): its ``key`` and
    ``value`` columns into ``store`` (or each row's ``store`` column), each row through the store's
    engine, routed by the job's partitioner; then the job starts from it (a new state epoch). A job
    that already has state is refused unless ``overwrite``. ``options``: ``staging``, ``savepoint``
    (write back into that savepoint's state), ``endpoint``, ``region`` (docs/state-as-data.md)."""
    given = {"job": str(job), "keyColumn": key, "valueColumn": value, **({"store": store} if store else {}),
             **{name: _option_text(option) for name, option in options.items()}}
    register(df.sparkSession)
    writer = df.write.format(SOURCE_NAME).options(**absolute(given)).mode("overwrite" if overwrite else "append")
    try:
        writer.save()
    except Exception as exc:  # noqa: BLE001 - Spark wraps the Python error: raise the typed one
        raise _typed(exc) from None


def unwrap_error(exc: BaseException | None) -> LocalStateError | None:
    """The localstate error behind ``exc``, or None if there is none.

    ``exc`` may be a localstate error itself (returned as it is), or an exception Spark raised
    around one: ``StreamingQueryException`` (``query.exception()``, or what ``awaitTermination()``
    raises) when a micro-batch's ``foreach_batch``/``run_batch`` failed, ``AnalysisException`` or a
    failed action's exception from the state reader. Spark carries the Python error only as text,
    so the error returned is rebuilt from it: its type (``SchemaError``, ``TaskError``,
    ``SerdeError``, ``BatchOrderError``, ... of :mod:`localstate.errors`), its message with its
    context and hint, and the Python traceback (``error.traceback``). None when ``exc`` is None or
    holds no error of :mod:`localstate.errors` (a worker that died, an error of Spark's own, a
    subclass your own code defines)."""
    if exc is None:
        return None
    if isinstance(exc, LocalStateError):
        return exc
    return python_error(exc)


def _option_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _typed(exc: Exception) -> Exception:
    error = unwrap_error(exc)
    return error if isinstance(error, LocalStateError) else exc
