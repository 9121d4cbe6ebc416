"""docs/spark-users.md's code, runnable: a session the DataFrame step can retry on, a batch with its
progress report, a streaming query's failure turned back into localstate's typed error, and the
state read as typed columns. Run it in a copy of this folder (it writes state/, checkpoint/, out/):

    python first_day.py
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "job.toml")

# --8<-- [start:session]
from pyspark.sql import SparkSession

import localstate.spark

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers that can import localstate
spark = (SparkSession.builder
         .master("local[2,4]")                           # 2 threads, up to 4 attempts per task
         .config("spark.ui.showConsoleProgress", "false")  # no progress bar between your lines
         .getOrCreate())
localstate.spark.quiet_logs(spark)  # Spark at WARN; a failed query's error raised, not printed as a JVM trace
# --8<-- [end:session]

# --8<-- [start:progress]
from localstate.spark import DataFrameBatch, run_batch


def report(batch: DataFrameBatch) -> None:
    phases = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in batch.task_seconds.items())
    print(f"batch {batch.batch_id}: applied by {batch.applied}, replayed by {batch.replayed}, "
          f"kept open in {batch.reused}; {batch.records} rows in, {batch.outputs} out, "
          f"{batch.seconds:.2f}s ({phases})")


rows = spark.createDataFrame([("ada", 1), ("bob", 2), ("ada", 3), ("cy", 4)], "user string, ts long")
run_batch(rows, JOB, key="user", order_by="ts", batch_id=0, progress=report).orderBy("partition", "seq").show()
run_batch(rows, JOB, key="user", order_by="ts", batch_id=0, progress=report)  # again: replayed, not applied
# --8<-- [end:progress]

# --8<-- [start:errors]
from localstate.errors import SchemaError
from localstate.spark import foreach_batch

(HERE / "in").mkdir(exist_ok=True)
(HERE / "in" / "1.json").write_text('{"name": "dee", "ts": 5}\n')
events = spark.readStream.schema("name string, ts long").json(str(HERE / "in"))
query = (events.writeStream
         .foreachBatch(foreach_batch(JOB, key="user", sink=lambda outputs, batch_id: outputs.count()))  # no "user"
         .option("checkpointLocation", str(HERE / "checkpoint"))
         .trigger(availableNow=True)
         .start())
try:
    query.awaitTermination()
except Exception as failure:                             # pyspark's StreamingQueryException
    error = localstate.spark.unwrap_error(failure)       # the SchemaError raised in the batch, or None
    assert isinstance(error, SchemaError)
    print(f"{type(error).__name__}: {error}")
# --8<-- [end:errors]

# --8<-- [start:reader]
counts = localstate.spark.read_state(spark, JOB, store="counts")   # partition, key, value (bigint)
top = localstate.spark.read_state(spark, JOB, store="top")         # partition, item, score, payload
counts.orderBy("key").show()
top.orderBy("score", ascending=False).show()
# --8<-- [end:reader]
spark.stop()
