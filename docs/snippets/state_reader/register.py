import localstate.spark
localstate.spark.register(spark)          # once per SparkSession

counts = (spark.read.format("localstate")
          .option("job", "/abs/path/to/job.toml")
          .option("store", "counts")
          .load())
counts.show()
# +---------+-------+-----+
# |partition|key    |value|
# +---------+-------+-----+
# |0        |user-00|2    |
# ...
