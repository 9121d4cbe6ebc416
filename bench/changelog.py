"""File changelog benchmark: append+flush throughput, read() vs raw sequential file read, compaction.

    python -m bench changelog [--json] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.report import Report, peak_rss_mb, timed
from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.format import list_segments, segment_name

__all__ = ["main"]


def _records(n: int, keys: int, value_size: int) -> list[tuple[bytes, bytes]]:
    value = os.urandom(value_size)
    return [(b"key-%012d" % (i % keys), value) for i in range(n)]


def _raw_read(directory: Path) -> int:
    total = 0
    for base in list_segments(directory):
        with open(directory / segment_name(base), "rb", buffering=0) as f:
            while chunk := f.read(16 << 20):
                total += len(chunk)
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench changelog")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="200k records instead of 1M")
    parser.add_argument("--value-size", type=int, default=100)
    args = parser.parse_args(argv)
    n = 200_000 if args.quick else 1_000_000
    batch = 10_000
    report = Report("changelog", params={"records": n, "key_bytes": 16, "value_bytes": args.value_size,
                                         "flush_every": batch, "fsync": True})
    root = Path(tempfile.mkdtemp(prefix="bench-changelog-"))
    try:
        # (a) append + flush, 1M distinct keys
        system = FileChangelogSystem({"segment_bytes": "64MB", "fsync": True}, root)
        records = _records(n, n, args.value_size)
        part = system.partition("restore", 0)
        with timed() as t:
            for i in range(0, n, batch):
                part.append_many(records[i:i + batch])
                part.flush()
        directory = system.partition_dir("restore", 0)
        size = sum((directory / segment_name(b)).stat().st_size for b in list_segments(directory))
        report.add("append_many+flush", records_per_s=n / t["seconds"], mb_per_s=size / t["seconds"] / 1e6,
                   seconds=t["seconds"])
        single = system.partition("single", 0)
        m = n // 4
        with timed() as t:
            for i, (key, value) in enumerate(records[:m]):
                single.append(key, value)
                if i % batch == batch - 1:
                    single.flush()
            single.flush()
        report.add("append+flush", records_per_s=m / t["seconds"],
                   mb_per_s=m * (28 + 16 + args.value_size) / t["seconds"] / 1e6, seconds=t["seconds"])
        single.close()
        del records

        # (b) restore: read() of a 1M-key changelog vs raw sequential read of the same files
        _raw_read(directory)  # warm the page cache for both
        with timed() as raw:
            raw_bytes = _raw_read(directory)
        report.add("raw f.read() 16MB chunks", mb_per_s=raw_bytes / raw["seconds"] / 1e6, seconds=raw["seconds"])
        reader = system.reader("restore", 0)
        with timed() as rd:
            collections.deque(reader.read(), maxlen=0)
        report.add("read()", records_per_s=n / rd["seconds"], mb_per_s=raw_bytes / rd["seconds"] / 1e6,
                   seconds=rd["seconds"])
        with timed() as rs:
            restored: dict[bytes, bytes] = {}
            for r in reader.read():
                if r.value is None:
                    restored.pop(r.key, None)
                else:
                    restored[r.key] = r.value
        assert len(restored) == n
        del restored
        report.add("restore into dict via read()", records_per_s=n / rs["seconds"],
                   mb_per_s=raw_bytes / rs["seconds"] / 1e6, seconds=rs["seconds"])
        report.ratio("read() / raw sequential read (throughput)", raw["seconds"] / rd["seconds"], ">= 0.5")
        report.ratio("restore-into-dict / raw sequential read", raw["seconds"] / rs["seconds"])
        part.close()

        # (c) compaction: n records over n/5 keys, upto = end, sealed segments of 8MB
        csys = FileChangelogSystem({"segment_bytes": "8MB", "fsync": True}, root / "c")
        cpart = csys.partition("compact", 0)
        crecords = _records(n, max(1, n // 5), args.value_size)
        for i in range(0, n, batch):
            cpart.append_many(crecords[i:i + batch])
            cpart.flush()
        del crecords
        start = time.process_time()
        stats = csys.compact("compact", 0, cpart.end_offset())
        cpu = time.process_time() - start
        report.add("compaction", mb_per_s=stats.bytes_before / stats.seconds / 1e6,
                   mb_per_cpu_s=stats.bytes_before / cpu / 1e6, seconds=stats.seconds,
                   records_before=stats.records_before, records_after=stats.records_after)
        report.ratio("compaction MB/s per core", stats.bytes_before / cpu / 1e6, ">= 50")
        cpart.close()
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB; page cache warm for both raw and read()")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.emit(args.json)
    return 0
