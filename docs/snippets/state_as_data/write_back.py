# Read a savepoint as a DataFrame, transform a store, write it back (needs a SparkSession `spark`).
import localstate.spark

counts = localstate.spark.read_savepoint(spark, "/abs/path/savepoints/day-1", store="counts")
doubled = counts.selectExpr("key", "value * 2 AS value")
# the job's state becomes the savepoint's, with counts replaced: input positions, the other stores,
# watermarks and timers as the savepoint holds them
localstate.spark.bootstrap(doubled, "/abs/path/job.toml", store="counts", overwrite=True,
                           savepoint="/abs/path/savepoints/day-1")
