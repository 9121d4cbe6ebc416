import localstate.spark
localstate.spark.register(spark)
counts = spark.read.format("localstate").option("job", "/abs/path/job.toml").option("store", "counts").load()
checkpoints = spark.read.format("localstate").option("job", "/abs/path/job.toml").option("view", "checkpoints").load()
