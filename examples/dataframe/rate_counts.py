"""A Structured Streaming query whose stateful step is a localstate task.

    python examples/dataframe/rate_counts.py [--seconds 20] [--rows-per-second 100] [--out out]

Spark's rate source makes rows ``(timestamp, value)``; each row gets a user (``user-<value % 7>``);
``foreach_batch`` runs the job's task (counting.py, configured in job.toml) on every micro-batch,
keyed by user, in ``value`` order, and writes the task's outputs to JSON files, one folder per batch
(``out/batch=<id>``, overwritten when Spark executes a batch again, so the sink is idempotent).
State lives in ``state/`` (RocksDB + file changelogs), the query's checkpoint in ``checkpoint/``.
Stop it and start it again: it continues where it stopped, exactly once.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from localstate.core.spark.context import spark_context
from localstate.spark import foreach_batch, release

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="run this long, then stop after a batch")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches of this run")
    parser.add_argument("--rows-per-second", type=int, default=100)
    parser.add_argument("--out", default=str(HERE / "out"))
    parser.add_argument("--checkpoint", default=str(HERE / "checkpoint"))
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession(spark_context("local[2]", "localstate-rate-counts"))
    rows = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second)
            .option("numPartitions", 2).load()
            .withColumn("user", F.concat(F.lit("user-"), (F.col("value") % 7).cast("string"))))

    written: list[int] = []
    enough = threading.Event()

    def write(outputs, batch_id: int) -> None:
        outputs.write.mode("overwrite").json(f"{args.out}/batch={batch_id}")
        print(f"batch {batch_id}: {outputs.count()} output row(s)", flush=True)
        written.append(batch_id)
        if args.batches is not None and len(written) >= args.batches:
            enough.set()

    query = (rows.writeStream
             .foreachBatch(foreach_batch(HERE / "job.toml", key="user", order_by="value", sink=write))
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="2 seconds")
             .start())
    # Stop right after a batch's sink returned: the next trigger is up to 2 s away. (A stop in the
    # middle of a batch loses nothing either: the next run executes that batch again.)
    deadline = time.monotonic() + args.seconds
    while not enough.wait(0.5) and query.isActive and time.monotonic() < deadline:
        pass
    failure = query.exception()
    query.stop()
    release(HERE / "job.toml")  # the Python workers close the partitions they kept open between batches
    spark.stop()
    if failure is not None:
        raise SystemExit(f"the query failed: {failure}")


if __name__ == "__main__":
    main()
