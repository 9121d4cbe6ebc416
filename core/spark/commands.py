"""CLI commands of the Spark runtime (``localstate run``, ``localstate demo``)."""

from __future__ import annotations

import argparse

from localstate.core.cli import command
from localstate.core.config import load_job_config

__all__: list[str] = []


@command("run", "run a job on Spark in micro-batches until its inputs are consumed")
def run(args: argparse.Namespace) -> int:
    from localstate.core.spark.runner import SparkJobRunner

    job = load_job_config(args.job, plugins=args.plugins)
    runner = SparkJobRunner(job, master=args.master, batch_size=args.batch_size)
    print(f"job {job.name!r}: {job.partitions} partition(s) on {runner.master}, state in {job.state_dir}",
          flush=True)
    summary = runner.run(batches=args.batches)
    rate = summary.records_in / summary.seconds if summary.seconds else 0.0
    print(f"done: {len(summary.batches)} batch(es), {summary.records_in:,} records in, {summary.records_out:,} out, "
          f"{summary.seconds:.1f}s ({rate:,.0f} rec/s), lag {summary.lag:,}", flush=True)
    return 0


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--master", default=None, help="Spark master (default: [spark] master, else local[*]; "
                        "local masters get 4 task attempts)")
    parser.add_argument("--batches", type=int, default=None, help="stop after N micro-batches")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="records per partition per micro-batch (default: [spark] batch_size, else all)")


run.arguments = _run_arguments  # type: ignore[attr-defined]


@command("demo", "generate page views, profiles, settings, ad impressions and clicks; run the demo pipeline on "
                 "local Spark, kill a worker midway, verify the results")
def demo(args: argparse.Namespace) -> int:
    from localstate.core.spark.demo import run_demo

    return run_demo(events=args.events, partitions=args.partitions, kill=not args.no_kill, master=args.master,
                    directory=args.dir, batch_size=args.batch_size)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=200_000, help="events to generate (all streams)")
    parser.add_argument("--partitions", type=int, default=2, help="job partitions (= Spark tasks per batch)")
    parser.add_argument("--batch-size", type=int, default=None, help="records per partition per batch")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a Python worker midway")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--dir", default=None, help="work directory (default: a fresh temp directory, removed)")


demo.arguments = _demo_arguments  # type: ignore[attr-defined]
