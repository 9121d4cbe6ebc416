"""Key-value engine benchmark: ``python -m bench kv [--json] [--quick]``.

Hot set: the shared counting workload (../shared/peers/workload.py), 50k keys, 1M read-modify-write
increments, commit (flush) every 10k, changelog on. Compared in the same run with a plain dict,
raw LMDB / raw rocksdict, and Quix Streams' RocksDB state (measured by ../shared/peers/quix_state.py
with a Python that has quixstreams; never a dependency of this project).

The hot set also runs as a BatchTask (``batch_task`` rows): Arrow batches of 4096 events, counted
with ``merge_many``, or first aggregated in Arrow (``group_by``) and merged per distinct key; and
through the runtime (``runtime`` rows: a TaskInstance's feed loop, a per-record task against a batch
task, commit and checkpoint every 10k records).

The storage floor (``floor`` rows, ../shared/peers/storage_floor.py with the engine's own backend
settings): the same changed records, coalesced, encoded and sorted before the clock starts, written
with no per-event work, one commit per 10k events: an LMDB ``putmulti`` in one synced transaction, a
RocksDB WriteBatch, and the changelog's framed bytes appended and fsynced. Ratios set each kv row
against its backend's floor (wall clock, the targets), against the floor of both writes a commit
makes (backend + changelog), and in CPU time.

Cold set: K keys (default 500k, ``--cold-keys 5000000`` for the issue's target size), two passes
(create, then increment every key once more), 100k-entry cache, against raw rocksdict with one
WriteBatch per commit. Every measurement runs in a fresh process (bench/kv_cases.py), so each
row's peak RSS is its own. kv rows use the engine's default options (write_batch_size 10000, 16MB
memtables, ...) apart from the object cache size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from localstate.core.text import a
from bench.kv_cases import PEERS
from bench.report import Report

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]


def _case(case: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run one bench.kv_cases case in a fresh process; ``pure_python`` in ``params`` runs it with
    LOCALSTATE_PURE_PYTHON=1 (localstate's pure-Python code instead of its C extensions)."""
    env = {**os.environ, "LOCALSTATE_PURE_PYTHON": "1"} if params.get("pure_python") else None
    out = subprocess.run([sys.executable, "-m", "bench.kv_cases", case, json.dumps(params)], cwd=ROOT,
                         capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"bench case {case} {params} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _quix_python() -> str | None:
    if importlib.util.find_spec("quixstreams") is not None:
        return sys.executable
    venv = Path(os.environ.get("PEERS_VENV", "/tmp/localstate-peers"))
    candidate = venv / "bin" / "python"
    if candidate.exists():
        probe = subprocess.run([str(candidate), "-c", "import quixstreams"], capture_output=True, check=False)
        if probe.returncode == 0:
            return str(candidate)
    return None


def _quix(events: int, keys: int, commit_every: int) -> float | None:
    python = _quix_python()
    if python is None:
        return None
    out = subprocess.run([python, "quix_state.py", "--events", str(events), "--keys", str(keys),
                          "--commit-every", str(commit_every)], cwd=PEERS, capture_output=True, text=True,
                         check=False)
    match = re.search(r"([\d,]+) ops/s", out.stdout)
    return float(match.group(1).replace(",", "")) if out.returncode == 0 and match else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kv")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="200k hot events, 100k cold keys")
    parser.add_argument("--events", type=int, default=None, help="hot-set increments (default 1M)")
    parser.add_argument("--keys", type=int, default=50_000, help="hot-set keys")
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--cold-keys", type=int, default=None, help="cold-set keys (default 500k; issue: 5M)")
    parser.add_argument("--cache-size", type=int, default=100_000)
    parser.add_argument("--skip-spills", action="store_true",
                        help="skip the write_batch_size=500 row (a spill, hence a changelog fsync, every 500 keys)")
    parser.add_argument("--only", choices=("hot", "cold", "restore"), default=None,
                        help="run one part of the benchmark")
    args = parser.parse_args(argv)
    events = args.events or (200_000 if args.quick else 1_000_000)
    cold_keys = args.cold_keys or (100_000 if args.quick else 500_000)
    every = args.commit_every
    parts = {args.only} if args.only else {"hot", "cold", "restore"}

    report = Report("kv", params={"hot_events": events, "hot_keys": args.keys, "commit_every": every,
                                  "cold_keys": cold_keys, "cold_events": 2 * cold_keys,
                                  "cache_size": args.cache_size})
    figures: dict[str, float] = {}     # wall-clock ops/s: the figures the targets apply to
    cpu: dict[str, float] = {}         # ops per CPU second: steadier when other jobs share the machine
    changelogs: set[str] = set()

    def run(label: str, case: str, params: dict[str, Any]) -> None:
        result = _case(case, params)
        figures[label] = result["ops_per_s"]
        cpu[label] = result["cpu_ops_per_s"]
        if result.get("changelog", "none") != "none":
            changelogs.add(result["changelog"])
        report.add(label, **{k: (round(v, 3 if k.endswith("seconds") else 1) if isinstance(v, float) else v)
                            for k, v in result.items()})

    # kv rows use the engine's default options except cache_size (the hot set must fit in it)
    if "hot" in parts:
        hot = {"events": events, "keys": args.keys, "commit_every": every}
        run("hot: dict", "dict", hot)
        run("hot: raw lmdb, txn per commit", "lmdb_raw", hot)
        run("hot: raw rocksdict, WriteBatch per commit", "rocksdict_batch", hot)
        # The storage floor: the same changed records, coalesced, encoded and sorted before the clock
        # starts, written with no per-event work (the backend with the engine's settings; the changelog).
        for floor, label in (("lmdb", "lmdb putmulti, one synced txn"), ("rocksdb", "rocksdb WriteBatch (kv's options)"),
                             ("changelog", "changelog append + fsync")):
            run(f"hot: floor: {label} per commit", "floor", {**hot, "backend": floor})
        for backend in ("rocksdb", "lmdb", "memory"):
            run(f"hot: kv {backend}", "engine", {**hot, "backend": backend, "cache_size": args.cache_size})
        for backend in ("rocksdb", "lmdb"):
            run(f"hot: kv {backend} batch task", "batch_task",
                {**hot, "backend": backend, "cache_size": args.cache_size})
            run(f"hot: kv {backend} batch task, arrow group_by", "batch_task",
                {**hot, "backend": backend, "cache_size": args.cache_size, "aggregate": True})
        for backend in ("rocksdb", "lmdb"):
            for batch in (False, True):
                run(f"hot: runtime {backend}, {'batch task' if batch else 'per-record task'}", "task_feed",
                    {**hot, "backend": backend, "cache_size": args.cache_size, "batch": batch})
        run("hot: kv rocksdb, no changelog", "engine",
            {**hot, "backend": "rocksdb", "cache_size": args.cache_size, "changelog": "none"})
        if not args.skip_spills:
            run("hot: kv rocksdb write_batch_size=500", "engine",
                {**hot, "backend": "rocksdb", "cache_size": args.cache_size, "write_batch_size": 500})
        quix = _quix(events, args.keys, every)
        if quix is not None:
            figures["hot: quixstreams"] = quix
            report.add("hot: quixstreams rocksdb state", ops_per_s=quix, events=events)
        else:
            report.notes.append("Quix Streams was not measured (quixstreams not importable, no peers venv); "
                                "run `bash ../shared/peers/run_peers.sh --events N` and compare its ops/s")
        d = figures["hot: dict"]
        floors = {"lmdb": "hot: floor: lmdb putmulti, one synced txn per commit",
                  "rocksdb": "hot: floor: rocksdb WriteBatch (kv's options) per commit"}
        changelog_floor = "hot: floor: changelog append + fsync per commit"
        for backend in ("rocksdb", "lmdb"):
            # the targets: the kv commit path against the backend's floor (wall clock), then
            # against the floor of both writes a commit makes (backend + changelog), and in CPU time
            floor, both = figures[floors[backend]], 1 / (1 / figures[floors[backend]] + 1 / figures[changelog_floor])
            for variant, target in (("", ">= 0.6"), (" batch task", ">= 0.8")):
                label = f"hot: kv {backend}{variant}"
                report.ratio(f"hot {backend}{variant or ' per-record'} / storage floor", figures[label] / floor, target)
                report.ratio(f"hot {backend}{variant or ' per-record'} / floor of backend + changelog",
                             figures[label] / both)
                report.ratio(f"hot {backend}{variant or ' per-record'} / storage floor (cpu time)",
                             cpu[label] / cpu[floors[backend]])
            report.ratio(f"hot {backend}: batch task / per-record", figures[f"hot: kv {backend} batch task"]
                         / figures[f"hot: kv {backend}"], ">= 1")
            report.ratio(f"hot runtime {backend}: batch task / per-record task",
                         figures[f"hot: runtime {backend}, batch task"] / figures[f"hot: runtime {backend}, per-record task"],
                         ">= 1")
        for backend in ("rocksdb", "lmdb"):
            report.ratio(f"hot {backend} / dict", figures[f"hot: kv {backend}"] / d, ">= 0.30")
            if quix is not None:
                report.ratio(f"hot {backend} / quixstreams", figures[f"hot: kv {backend}"] / quix, ">= 10")
        for backend in ("rocksdb", "lmdb"):
            report.ratio(f"hot {backend} / dict (cpu time)", cpu[f"hot: kv {backend}"] / cpu["hot: dict"])
        for backend in ("rocksdb", "lmdb"):
            for variant in ("batch task", "batch task, arrow group_by"):
                label = f"hot: kv {backend} {variant}"
                report.ratio(f"hot {backend} {variant} / dict", figures[label] / d, ">= 0.30")
                report.ratio(f"hot {backend} {variant} / dict (cpu time)", cpu[label] / cpu["hot: dict"])
                if quix is not None:
                    report.ratio(f"hot {backend} {variant} / quixstreams", figures[label] / quix, ">= 10")
            for variant in ("per-record task", "batch task"):
                label = f"hot: runtime {backend}, {variant}"
                report.ratio(f"hot runtime {backend}, {variant} / dict", figures[label] / d,
                             ">= 0.30" if variant == "batch task" else None)
                if quix is not None:
                    report.ratio(f"hot runtime {backend}, {variant} / quixstreams", figures[label] / quix,
                                 ">= 10" if variant == "batch task" else None)
        report.ratio("hot memory / dict", figures["hot: kv memory"] / d)
        report.ratio("hot rocksdb without changelog / dict", figures["hot: kv rocksdb, no changelog"] / d)
        report.ratio("hot rocksdb / raw rocksdict WriteBatch", figures["hot: kv rocksdb"]
                     / figures["hot: raw rocksdict, WriteBatch per commit"])
        report.ratio("hot raw rocksdict WriteBatch / dict", figures["hot: raw rocksdict, WriteBatch per commit"] / d)
        report.ratio("hot raw lmdb / dict", figures["hot: raw lmdb, txn per commit"] / d)
        if "hot: kv rocksdb write_batch_size=500" in figures:
            report.ratio("hot rocksdb write_batch_size=500 / default",
                         figures["hot: kv rocksdb write_batch_size=500"] / figures["hot: kv rocksdb"])

    if "cold" in parts:
        cold = {"keys": cold_keys, "passes": 2, "commit_every": every}
        run("cold: raw rocksdict, WriteBatch per commit", "rocksdict_batch", cold)
        run("cold: raw rocksdict (kv's options), WriteBatch", "rocksdict_batch", {**cold, "kv_options": True})
        for backend in ("rocksdb", "lmdb"):
            run(f"cold: kv {backend}", "engine",
                {**cold, "backend": backend, "cache_size": args.cache_size, "verify": False})
        raw = figures["cold: raw rocksdict, WriteBatch per commit"]
        for backend in ("rocksdb", "lmdb"):
            report.ratio(f"cold {backend} / raw rocksdict WriteBatch", figures[f"cold: kv {backend}"] / raw, ">= 0.70")
        for backend in ("rocksdb", "lmdb"):
            report.ratio(f"cold {backend} / raw rocksdict WriteBatch (cpu time)",
                         cpu[f"cold: kv {backend}"] / cpu["cold: raw rocksdict, WriteBatch per commit"])
        report.ratio("cold rocksdb / raw rocksdict WriteBatch with kv's options",
                     figures["cold: kv rocksdb"] / figures["cold: raw rocksdict (kv's options), WriteBatch"])
        report.notes.append("raw rocksdict uses rocksdict's default Options as the peers script does; the "
                            "'(kv's options)' row uses the engine's defaults (16MB memtable with a whole-key "
                            "bloom filter, 10-bit bloom filters, 64MB block cache, lz4)")
        if not args.cold_keys:
            report.notes.append("cold set below the issue's 5M keys to keep the default run short; "
                                "use --cold-keys 5000000 (or --only cold --cold-keys 5000000) for the full size")

    if "restore" in parts:
        params = {"keys": cold_keys, "passes": 1, "commit_every": every, "cache_size": args.cache_size}
        for backend in ("rocksdb", "lmdb"):
            run(f"restore: kv {backend} restore()", "restore", {**params, "backend": backend})
            run(f"restore: kv {backend} put() replay", "restore", {**params, "backend": backend, "replay": True})
            report.ratio(f"restore {backend}: restore() / put() replay",
                         figures[f"restore: kv {backend} restore()"] / figures[f"restore: kv {backend} put() replay"],
                         "> 1")

    kinds = ", ".join(sorted(changelogs)) or "no"
    report.notes.append(f"kv rows log every change to the {kinds} changelog and flush it at every commit "
                        "(except the 'no changelog' row); dict, raw rows and Quix log nothing "
                        "(quix_state.py has no changelog topic)")
    if "memory" in changelogs:
        report.notes.append("localstate.changelog.file was not importable: the in-memory changelog was used")
    report.notes.append("kv rows use the default write_batch_size (10000): no spill, as each commit interval "
                        "changes at most 10000 keys; the write_batch_size=500 row spills every 500 keys, and "
                        "each spill must flush (fsync) the changelog first (contract rule 3)")
    report.notes.append("targets apply to wall-clock ops_per_s; cpu_ops_per_s counts process CPU time (all "
                        "threads; fsync waits excluded) and is the steadier figure when other jobs share the "
                        "machine; the dict row is the best of 3 runs")
    report.notes.append("rss_growth_mb = peak RSS minus RSS after building the key list, each row in its own "
                        f"process; kv rows use {a(args.cache_size)}-entry object cache, RocksDB 64MB block cache "
                        "and 16MB memtables")
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
