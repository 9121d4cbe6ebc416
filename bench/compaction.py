"""Restore cost with and without compaction: a store after many updates over few keys.

    python -m bench compaction [--json] [--quick] [--updates N] [--keys K]

Workload: ``--updates`` changelog records (default 10M; ``--quick``: 2M) over ``--keys`` keys (default
100k), 10-byte keys and 8-byte values, appended in batches of 100k and flushed (fsync) per batch, in the
file changelog with its default 64 MB segments. That is what a KV store's changelog holds after that many
updates when every commit touches each key at most once (commits coalesce repeated writes of a key).

- *restore, uncompacted*: ``runtime.partition.recovery.recover_store`` of a fresh RocksDB-backed KV engine from
  offset 0 to the end (read, crc check, engine.restore, flush), over the whole history.
- *compaction*: ``FileChangelogSystem.compact(upto=end)`` as ``localstate compact`` runs it: the idle
  active segment is sealed first, then every segment below ``upto`` is rewritten.
- *restore, compacted*: the same restore after compaction (live state only), and a check that both
  restores give the same number of keys and identical values.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.changelog import _kv_engine
from bench.report import Report, peak_rss_mb, timed
from localstate.changelog.file import FileChangelogSystem
from localstate.runtime.partition.recovery import recover_store

__all__ = ["main"]

BATCH = 100_000


def _write(system: FileChangelogSystem, updates: int, keys: int) -> int:
    """Append ``updates`` records cycling over ``keys`` keys (values: the update number)."""
    part = system.partition("counts", 0)
    names = [b"key-%06d" % k for k in range(keys)]
    try:
        for start in range(0, updates, BATCH):
            part.append_many((names[i % keys], i.to_bytes(8, "big")) for i in range(start, min(updates, start + BATCH)))
            part.flush()
        return part.flushed_end()
    finally:
        part.close()


def _restore(system: FileChangelogSystem, directory: Path, end: int) -> tuple[float, float, int, dict[bytes, bytes]]:
    """Wall and CPU seconds of a full restore into a fresh RocksDB KV engine, records replayed, and a
    sample of the restored state."""
    part = system.partition("counts", 0)
    engine = _kv_engine(directory, part)
    try:
        cpu = time.process_time()
        with timed() as t:
            recovery = recover_store(engine, part, end, label="bench")
        cpu = time.process_time() - cpu
        sample = {key: engine.get(key) for key in (b"key-000000", b"key-000001", b"key-%06d" % 4242)}
        count = sum(1 for _ in engine.all())
        sample[b"#keys"] = str(count).encode()
        return t["seconds"], cpu, recovery.replayed, sample
    finally:
        engine.close()
        part.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compaction")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2M updates instead of 10M")
    parser.add_argument("--updates", type=int, default=None, help="number of updates (overrides --quick)")
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args(argv)
    updates = args.updates or (2_000_000 if args.quick else 10_000_000)
    report = Report("compaction", params={"updates": updates, "keys": args.keys, "key_bytes": 10, "value_bytes": 8,
                                          "flush_every": BATCH, "segment_bytes": "64MB", "engine": "kv/rocksdb"})
    root = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    try:
        system = FileChangelogSystem({"fsync": True}, root)
        with timed() as t:
            end = _write(system, updates, args.keys)
        report.add("write changelog", records=updates, seconds=t["seconds"], records_per_s=updates / t["seconds"])

        seconds, cpu, replayed, before = _restore(system, root / "store-uncompacted", end)
        report.add("restore, uncompacted", records=replayed, seconds=seconds, cpu_seconds=cpu,
                   records_per_s=replayed / seconds)

        cpu = time.process_time()
        stats = system.compact("counts", 0, end, now=time.time())
        cpu = time.process_time() - cpu
        report.add("compaction", seconds=stats.seconds, cpu_seconds=cpu, records_before=stats.records_before,
                   records_after=stats.records_after, mb_before=stats.bytes_before / 1e6,
                   mb_after=stats.bytes_after / 1e6, mb_per_s=stats.bytes_before / stats.seconds / 1e6)

        seconds_c, cpu_c, replayed_c, after = _restore(system, root / "store-compacted", end)
        report.add("restore, compacted", records=replayed_c, seconds=seconds_c, cpu_seconds=cpu_c,
                   records_per_s=replayed_c / seconds_c)
        if after != before:
            raise SystemExit(f"restored state differs after compaction: {before} != {after}")
        report.ratio("restore time uncompacted / compacted", seconds / seconds_c)
        report.ratio("records replayed compacted / keys", replayed_c / args.keys, "== 1")
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB; both restores gave the same state "
                            f"({before[b'#keys'].decode()} keys, sampled values equal)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.emit(args.json)
    return 0
