import localstate.spark

localstate.spark.register(spark)
state = (spark.read.format("localstate")
         .option("job", "/abs/path/job.toml")      # the job file given to foreach_batch / run_batch
         .option("store", "counts")
         .load())                                   # partition, key, value (decoded with the store's serdes)
state.createOrReplaceTempView("counts")
spark.sql("SELECT key, value FROM counts ORDER BY value DESC LIMIT 10").show()

# the checkpoints: per partition the batch id it applied last, the changelog offsets, ...
spark.read.format("localstate").option("job", "/abs/path/job.toml").option("view", "checkpoints").load().show()
# exactly the state after micro-batch 41 (refused if the job has applied another batch since)
localstate.spark.read_state(spark, "/abs/path/job.toml", store="counts", batchId=41)
