"""Write the trending-pages job's input: deterministic page views as JSON lines, partitioned by page.

    python examples/heap/trending_pages/make_input.py [--views N] [--seed S]

Ten minutes of views over 300 pages: popularity is Zipf-like, and every minute another page goes viral.
Each line is ``{"key": page, "value": {"page", "user"}, "ts": epoch seconds}``, appended to
``<input path>/<partition>.jsonl`` where ``partition = partition_for(page, partitions)`` (the
Kafka-compatible partitioner), in event-time order. Paths and the partition count come from the
``job.toml`` next to this file. Refuses to write twice: delete the example's ``.work/`` folder to
start from scratch.
"""

from __future__ import annotations

import argparse
import random
import sys
from itertools import accumulate
from pathlib import Path

from localstate.core.config import load_job_config
from localstate.streams.jsonl import by_key_partition, write_jsonl
from localstate.core.stream import resolve_path

__all__ = ["page_views", "write_input", "main"]

PAGES = [f"/page/{i:03d}" for i in range(300)]
START_TS = 1_700_000_040.0  # on a minute boundary: windows line up with the minutes
MINUTES = 10
JOB_FILE = Path(__file__).resolve().parent / "job.toml"


def page_views(views: int, seed: int) -> list[tuple[float, str, str]]:
    """``(ts, page, user)`` in time order, evenly spread over ``MINUTES`` minutes."""
    rng = random.Random(seed)
    zipf = list(accumulate(1.0 / (rank + 1) for rank in range(len(PAGES))))
    out = []
    for i in range(views):
        ts = START_TS + i * MINUTES * 60.0 / views
        minute = i * MINUTES // views
        if rng.random() < 0.2:  # this minute's viral page: a fifth of the views, more than "/page/000"
            page = PAGES[(37 * minute + 101) % len(PAGES)]
        else:
            page = rng.choices(PAGES, cum_weights=zipf)[0]
        out.append((ts, page, f"user-{rng.randrange(5000):04d}"))
    return out


def write_input(job_file: Path, views: int = 12_000, seed: int = 5) -> Path:
    """Write the input of the job in ``job_file``; returns the input directory."""
    job = load_job_config(job_file)
    directory = resolve_path(job, job.inputs["page_views"].options["path"])
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(f"{directory} already has input; `localstate reset JOB --yes` starts the job over on it, deleting .work/ starts from scratch")
    records = ({"key": page, "value": {"page": page, "user": user}, "ts": ts}
               for ts, page, user in page_views(views, seed))
    for partition, records in by_key_partition(records, job.partitions).items():
        write_jsonl(directory, partition, records)
    return directory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make_input.py", description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, default=12_000)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"wrote {args.views:,} page views to {write_input(JOB_FILE, args.views, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
