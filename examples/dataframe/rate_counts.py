"""A Structured Streaming query whose stateful step is a localstate task.

    python examples/dataframe/rate_counts.py [--seconds 20] [--rows-per-second 100] [--trigger '2 seconds'] [--out out]

Spark's rate source makes rows ``(timestamp, value)``; each row gets a user (``user-<value % 7>``);
``foreach_batch`` runs the job's task (counting.py, configured in job.toml) on every micro-batch,
keyed by user, in ``value`` order, and writes the task's outputs to JSON files, one folder per batch
(``out/batch=<id>``, overwritten when Spark executes a batch again, so the sink is idempotent).
State lives in ``state/`` (RocksDB + file changelogs), the query's checkpoint in ``checkpoint/``.
Stop it and start it again: it continues where it stopped, exactly once. ``run(spark, ...)`` runs it
on a SparkSession you already have (the test does, twice on one session).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from localstate.spark import foreach_batch, release

HERE = Path(__file__).resolve().parent


def run(spark, *, seconds: float = 20.0, batches: int | None = None, rows_per_second: int = 100,
        out: str = str(HERE / "out"), checkpoint: str = str(HERE / "checkpoint"),
        trigger: str = "2 seconds") -> list[int]:
    """Run the query on ``spark`` until ``batches`` batches were written or ``seconds`` passed, stop
    it, and make the Python workers close the partitions they kept open; returns the batch ids the
    sink wrote. Raises the query's exception if it failed."""
    from pyspark.sql import functions as F

    rows = (spark.readStream.format("rate").option("rowsPerSecond", rows_per_second)
            .option("numPartitions", 2).load()
            .withColumn("user", F.concat(F.lit("user-"), (F.col("value") % 7).cast("string"))))

    written: list[int] = []
    enough = threading.Event()

    def write(outputs, batch_id: int) -> None:
        outputs.write.mode("overwrite").json(f"{out}/batch={batch_id}")
        print(f"batch {batch_id}: {outputs.count()} output row(s)", flush=True)
        written.append(batch_id)
        if batches is not None and len(written) >= batches:
            enough.set()

    query = (rows.writeStream
             .foreachBatch(foreach_batch(HERE / "job.toml", key="user", order_by="value", sink=write))
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=trigger)
             .start())
    # Stop right after a batch's sink returned: the next trigger is up to one interval away. (A stop
    # in the middle of a batch loses nothing either: the next run executes that batch again.)
    deadline = time.monotonic() + seconds
    while not enough.wait(0.1) and query.isActive and time.monotonic() < deadline:
        pass
    failure = query.exception()
    query.stop()
    release(HERE / "job.toml")  # the Python workers close the partitions they kept open between batches
    if failure is not None:
        raise failure
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="run this long, then stop after a batch")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches of this run")
    parser.add_argument("--rows-per-second", type=int, default=100)
    parser.add_argument("--trigger", default="2 seconds", help="the micro-batch interval")
    parser.add_argument("--out", default=str(HERE / "out"))
    parser.add_argument("--checkpoint", default=str(HERE / "checkpoint"))
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    # What the DataFrame step needs of a session (docs/spark-users.md, "The session"): Python workers
    # that can import localstate (this interpreter: PySpark reads PYSPARK_PYTHON when the session
    # starts) and task retries (local[N,F]: F attempts per task; plain local[N] never retries, so a
    # killed Python worker would end the query).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2,4]").appName("localstate-rate-counts")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        run(spark, seconds=args.seconds, batches=args.batches, rows_per_second=args.rows_per_second,
            out=args.out, checkpoint=args.checkpoint, trigger=args.trigger)
    except Exception as failure:
        raise SystemExit(f"the query failed: {failure}") from None
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
