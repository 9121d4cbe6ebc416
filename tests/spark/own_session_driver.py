"""A Spark user's own session, without localstate's helper (tests/spark/test_own_session.py runs this
as a subprocess): ``SparkSession.builder.master("local[2]")`` (no task retries), the DataFrame step
run twice, then two streaming queries that fail inside a batch: a missing key column and a value
the store's serde refuses. Prints one JSON line per result; the WARNING goes to stderr.

    python own_session_driver.py WORKDIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from localstate.core.task import StreamTask

JOB = """
[job]
name = "own-session"
partitions = 2
task = "own_session_driver:PutsText"
state_dir = "state"

[stores.counts]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"
"""


class PutsText(StreamTask):
    """Counts rows per user in ``counts`` (an int store); a row whose ``text`` column is set puts that
    text instead, which the int serde refuses (a SerdeError raised through the task's code)."""

    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        text = envelope.value.get("text")
        self.counts.put(envelope.key, text if text else (self.counts.get(envelope.key) or 0) + 1)


def failure_of(spark, rows: list[dict], job: str, key: str, directory: Path) -> BaseException | None:
    """Run a streaming query over ``rows`` (one JSON file: one micro-batch) through foreach_batch until
    the input is processed; the exception the query ended with (None if it did not fail)."""
    from localstate.spark import foreach_batch

    (directory / "input").mkdir(parents=True)
    (directory / "input" / "rows.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    stream = spark.readStream.schema("user string, text string").json(str(directory / "input"))
    query = (stream.writeStream.foreachBatch(foreach_batch(job, key=key, sink=lambda out, batch: out.count()))
             .option("checkpointLocation", str(directory / "checkpoint")).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - the StreamingQueryException under test
        return exc
    return query.exception()


def main(workdir: str) -> None:
    from pyspark.sql import SparkSession

    import localstate.spark
    from localstate.spark import run_batch

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    root = Path(workdir)
    (root / "job.toml").write_text(JOB)
    job = str(root / "job.toml")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the Python workers: this interpreter
    spark = SparkSession.builder.master("local[2]").appName("own-session").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.createDataFrame([("ada", None), ("bob", None), ("ada", None)], "user string, text string")
    for batch in (0, 1):
        out = run_batch(rows, job, key="user", batch_id=batch)
        print(json.dumps({"batch": batch, "outputs": out.count()}), flush=True)
    missing = failure_of(spark, [{"user": "ada"}], job, "usr", root / "missing-key")
    # A job of its own: the query's batch 0 would go backwards on the one that applied batches 0 and 1.
    (root / "serde.toml").write_text(JOB.replace('"state"', '"state-serde"'))
    refused = failure_of(spark, [{"user": "cy", "text": "not a number"}], str(root / "serde.toml"), "user",
                         root / "serde")
    for name, failure in (("missing key", missing), ("serde", refused)):
        error = localstate.spark.unwrap_error(failure)
        print(json.dumps({"case": name, "raised": type(failure).__name__,
                          "error": None if error is None else type(error).__name__,
                          "message": None if error is None else str(error)}), flush=True)
    spark.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(sys.argv[1])
