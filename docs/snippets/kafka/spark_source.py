from localstate.runtime.spark.kafka_source import register

register(spark)                       # once per SparkSession
views = (spark.read.format("localstate-kafka")
         .option("bootstrap_servers", "kafka-1:9092").option("topic", "page-views")
         .option("startingOffsets", "earliest").load())    # or spark.readStream
(counts.selectExpr("user AS key", "CAST(views AS STRING) AS value")
 .write.format("localstate-kafka").option("bootstrap_servers", "kafka-1:9092")
 .option("topic", "view-counts").mode("append").save())
