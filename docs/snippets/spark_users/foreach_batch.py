from localstate.spark import foreach_batch

def write(outputs, batch_id):                       # outputs: a DataFrame of the task's messages
    outputs.write.mode("overwrite").parquet(f"out/batch={batch_id}")   # idempotent per batch id

query = (events.writeStream                          # any streaming DataFrame
         .foreachBatch(foreach_batch("job.toml", key="user", order_by="ts", sink=write))
         .option("checkpointLocation", "checkpoint")
         .start())
