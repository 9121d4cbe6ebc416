from localstate.runtime.spark.kafka_source import register
from localstate.spark import foreach_batch

register(spark)
events = (spark.readStream.format("localstate-kafka")         # topic partition p is Spark partition p
          .option("bootstrap_servers", "kafka-1:9092").option("topic", "page-views")   # 4 partitions, keyed by user
          .load()
          .selectExpr("CAST(key AS STRING) AS user", "CAST(value AS STRING) AS page", "timestamp AS ts"))
query = (events.writeStream                                    # job.toml: partitions = 4
         .foreachBatch(foreach_batch("job.toml", key="user", order_by="ts", sink=write, partitioned=True))
         .option("checkpointLocation", "checkpoint")
         .start())
