"""A Structured Streaming driver for the DataFrame entry point tests, run as a subprocess that the
test kills and starts again:

    python dataframe_stream_driver.py INPUT CHECKPOINT SINK STATE MARKERS

A file source (one JSON-lines file per micro-batch) goes through ``foreach_batch`` into a sink that
keeps every attempt of a batch (``SINK/batch=<id>/attempt-<uuid>``), so the test can check that a
re-executed batch produced the same rows. Faults, each once (a marker file in MARKERS):

* the Python worker feeding partition 1 in batch 1 is SIGKILLed mid-batch (Spark retries the task);
* in batch 2 the driver SIGKILLs itself after the sink wrote, before Spark's commit log has the batch
  (the restarted query executes batch 2 again);
* in batch 3 the driver SIGKILLs itself after saving partition 0's checkpoint and before partition
  1's (a partial commit: on restart partition 0 serves its outputs, partition 1 applies the batch).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dataframe_tasks import job_config  # noqa: E402
from localstate.core.checkpoint import CheckpointStore  # noqa: E402
from localstate.runtime.spark.context import spark_context  # noqa: E402
from localstate.spark import foreach_batch  # noqa: E402


def _once(markers: Path, name: str) -> bool:
    marker = markers / name
    if marker.exists():
        return False
    marker.write_text(f"pid {os.getpid()}\n")
    return True


def main(input_dir: str, checkpoint: str, sink: str, state: str, markers: str) -> None:
    from pyspark.sql import SparkSession

    markers_dir = Path(markers)
    spark = SparkSession(spark_context("local[2]", "dataframe-stream-test"))  # local[2,4]: tasks are retried
    job = job_config(Path(state))

    save = CheckpointStore.save

    def save_then_die(self, checkpoint, *, expect_generation=None):
        save(self, checkpoint, expect_generation=expect_generation)
        if checkpoint.batch == 3 and checkpoint.partition == 0 and _once(markers_dir, "driver-partial-commit"):
            os.kill(os.getpid(), signal.SIGKILL)

    CheckpointStore.save = save_then_die  # fault injection in this test driver only

    def write(outputs, batch_id: int) -> None:
        outputs.write.parquet(f"{sink}/batch={batch_id}/attempt-{uuid.uuid4().hex}")
        if batch_id == 2 and _once(markers_dir, "driver-after-sink"):
            os.kill(os.getpid(), signal.SIGKILL)

    events = (spark.readStream.schema("user string, page string, ts long").option("maxFilesPerTrigger", 1)
              .json(input_dir))
    fault = {"partition": 1, "batch": 1, "after": 7, "marker": str(markers_dir / "worker-killed")}
    query = (events.writeStream.foreachBatch(foreach_batch(job, key="user", order_by="ts", sink=write, fault=fault))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
