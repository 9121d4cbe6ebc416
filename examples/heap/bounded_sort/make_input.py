"""Write the bounded-sort job's input: log lines of many machines, in the order a collector
received them, as JSON lines partitioned by service.

    python examples/heap/bounded_sort/make_input.py [--lines-per-host N] [--seed S]

Six services run on three machines each. Every machine logs a line about every 100 ms (``at``, epoch
milliseconds, increasing per machine); shipping delays are 0-1.5 s, and one line in twenty-five
takes 1.5-3.5 s, so some lines arrive after the 2 s watermark has passed them. Each partition's file
holds its services' lines sorted by arrival time (``ts``, epoch seconds) and ends with a control line
``{"watermark": T}`` (T = the newest ``at`` of the partition: everything has been shipped).
Paths and the partition count come from the ``job.toml`` next to this file. Refuses to write twice:
delete the example's ``.work/`` folder to start from scratch.
"""

from __future__ import annotations

import argparse
import random
import sys
from itertools import count
from pathlib import Path

from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.streams.jsonl import by_key_partition, write_jsonl
from localstate.core.stream import resolve_path

__all__ = ["collected_lines", "write_input", "main"]

SERVICES = ("auth", "cart", "catalog", "checkout", "search", "payments")
HOSTS_PER_SERVICE = 3
START_MS = 1_700_000_000_000


def collected_lines(lines_per_host: int, seed: int) -> list[dict]:
    """Every line as ``{"service", "host", "at", "msg", "arrives"}``, in arrival order."""
    rng = random.Random(seed)
    lines = []
    for service in SERVICES:
        for h in range(1, HOSTS_PER_SERVICE + 1):
            host = f"{service}-{h}"
            for n in range(lines_per_host):
                at = START_MS + n * 100 + rng.randrange(100)
                delay = rng.randrange(1500, 3500) if rng.random() < 0.04 else rng.randrange(1500)
                msg = f"GET /{service}/{rng.randrange(1000)} {rng.choice((200, 200, 200, 404, 500))} " \
                      f"{rng.randrange(1, 250)}ms"
                lines.append({"service": service, "host": host, "at": at, "msg": msg, "arrives": at + delay})
    lines.sort(key=lambda line: (line["arrives"], line["host"], line["at"]))
    return lines


def control_key(partition: int, partitions: int) -> str:
    """A key that the partitioner places in ``partition`` (control lines obey the partitioning too)."""
    return next(key for key in (f"collector-{i}" for i in count()) if partition_for(key, partitions) == partition)


def write_input(job_file: Path, lines_per_host: int = 450, seed: int = 3) -> Path:
    """Write the input of the job in ``job_file``; returns the input directory."""
    job = load_job_config(job_file)
    directory = resolve_path(job, job.inputs["logs"].options["path"])
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(f"{directory} already has input; `localstate reset JOB --yes` starts the job over on it, deleting .work/ starts from scratch")
    records = ({"key": line["service"], "value": line, "ts": line.pop("arrives") / 1000}
               for line in collected_lines(lines_per_host, seed))
    for partition, records in by_key_partition(records, job.partitions).items():
        write_jsonl(directory, partition, with_watermark(records, partition, job.partitions))
    return directory


def with_watermark(records: list[dict], partition: int, partitions: int) -> list[dict]:
    """``records`` of one partition, then a control line carrying the newest ``at`` among them (none
    for an empty partition)."""
    if not records:
        return records
    newest = max(record["value"]["at"] for record in records)
    return records + [{"key": control_key(partition, partitions), "value": {"watermark": newest},
                       "ts": records[-1]["ts"]}]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make_input.py", description=__doc__.split("\n")[0])
    parser.add_argument("--lines-per-host", type=int, default=450)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    directory = write_input(Path(__file__).resolve().parent / "job.toml", args.lines_per_host, args.seed)
    print(f"wrote {len(SERVICES) * HOSTS_PER_SERVICE * args.lines_per_host:,} log lines to {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
