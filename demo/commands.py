"""``localstate demo`` (registered when the CLI loads its command modules)."""

from __future__ import annotations

import argparse

from localstate.tools.cli import command
from localstate.tools.cli import partition_count, positive_int
from localstate.demo import run_demo

__all__: list[str] = []


@command("demo", "generate page views, profiles, settings, ad impressions and clicks; run the demo pipeline on "
                 "local Spark, kill a worker midway, verify the results")
def demo(args: argparse.Namespace) -> int:
    return run_demo(events=args.events, partitions=args.partitions, kill=not args.no_kill, master=args.master,
                    directory=args.dir, batch_size=args.batch_size)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=positive_int, default=200_000, help="events to generate (all streams)")
    parser.add_argument("--partitions", type=partition_count, default=2,
                        help="job partitions (= Spark tasks per batch)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="records per partition per batch")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a Python worker midway")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--dir", default=None, help="work directory (default: a fresh temp directory, removed)")


demo.arguments = _demo_arguments  # type: ignore[attr-defined]
