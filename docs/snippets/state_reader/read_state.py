counts = localstate.spark.read_state(spark, job, store="counts")
feed = localstate.spark.read_state(spark, job, store="counts", view="changelog", readChangeFeed=True)
