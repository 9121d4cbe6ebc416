"""Run a localstate task over a Spark DataFrame: :func:`run_batch` for one batch (a batch DataFrame, or
a micro-batch with its id), :func:`foreach_batch` for ``writeStream.foreachBatch``. See
docs/spark-users.md and :mod:`localstate.core.spark.dataframe`."""

from localstate.core.spark.dataframe import OUTPUT_SCHEMA, DataFrameBatch, foreach_batch, run_batch

__all__ = ["run_batch", "foreach_batch", "DataFrameBatch", "OUTPUT_SCHEMA"]
