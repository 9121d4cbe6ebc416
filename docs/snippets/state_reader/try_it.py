"""docs/state-reader.md, "Try it end to end": run from the repository root, after
``localstate run examples/windowed_counts/job.toml``."""

import os
import sys
from pathlib import Path
from pyspark.sql import SparkSession
import localstate.spark

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)    # workers need localstate installed
spark = SparkSession.builder.master("local[2,4]").getOrCreate()
localstate.spark.register(spark)
job = str(Path("examples/windowed_counts/job.toml").resolve())

counts = spark.read.format("localstate").option("job", job).option("store", "counts").load()
print(counts.rdd.getNumPartitions())                       # 2: one Spark partition per job partition
counts.orderBy("value", ascending=False).show(5)

spark.read.format("localstate").option("job", job).option("view", "checkpoints").load().show(truncate=False)
spark.read.format("localstate").option("job", job).option("view", "changelog").load().show(truncate=False)
(spark.read.format("localstate").option("job", job).option("view", "changelog")
      .option("store", "counts").option("readChangeFeed", "true").load()
      .where("tombstone").show(5))                        # the deletes of closed hours
spark.stop()
