# Seed the clicks job's counts from a table before its stream starts (needs a SparkSession `spark`).
import localstate.spark

seed = spark.read.parquet("warehouse/clicks_by_user")            # columns: user, clicks
localstate.spark.bootstrap(seed.selectExpr("user AS key", "clicks AS value"), "/abs/path/job.toml",
                           store="counts")
# the same, through the data source
(seed.selectExpr("user AS key", "clicks AS value")
     .write.format("localstate").option("job", "/abs/path/job.toml").option("store", "counts")
     .mode("append").save())
