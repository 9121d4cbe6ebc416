"""Restore speed against the speed of decoding: how close a store rebuild from the file changelog
gets to a plain-Python read + decode + CRC check of the same segment files.

    python -m bench restore [--json] [--records N] [--keys K] [--value-size B] [--repeat R]

- *baseline*: every segment file read whole and walked in one tight loop: unpack the header, check
  the crc (``zlib.crc32``), slice key and value into bytes objects. The least work any restore must do
  in Python. Measured in the same run, interleaved with the restores (the machine is shared).
- *read_columns()*: ``FileChangelogPartition.read_columns()`` consumed (the restore decoder: the same
  checks, plus gap/corruption detection). Its runs are framed (``RecordColumns.framed``: each record's
  span in the bytes read, no objects yet; whoever needs key and value lists makes them on first use).
- *restore into KV (backend)*: ``runtime.partition.recovery.recover_store`` of a fresh KV store up to the end of the
  changelog: decode + coalesce (last per key) + the backend's bulk load + the final commit. Only that
  call is timed (opening and closing the store are not part of a restore).
- *restore, record path*: the same through ``engine.restore(read())``, one ChangelogRecord per record
  (the path engines without the column capability take; the old path of the KV store).

Keys are written in random order (a realistic changelog: keys arrive in event order, not sorted).
Each figure is the best of ``--repeat`` runs; the rounds are interleaved so load spikes hit all alike.
The ratios come in wall-clock time (the target's) and in CPU seconds of this process (all its threads,
RocksDB's included): on a loaded machine the latter shows what an idle one would.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Callable

from bench.report import Report, peak_rss_mb
from localstate.changelog.file import FileChangelogPartition, FileChangelogSystem
from localstate.changelog.framing import HEADER, HEADER_SIZE
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import BytesSerde
from localstate.engines.kv import KeyValueEngineFactory

__all__ = ["main"]

BACKENDS = ("rocksdb", "lmdb", "memory")


def baseline_decode(directory: Path) -> int:
    """Read + decode + crc of every segment file in one tight loop; returns the records seen."""
    unpack, crc32, hs = HEADER.unpack_from, zlib.crc32, HEADER_SIZE
    count = 0
    for base in list_segments(directory):
        with open(directory / segment_name(base), "rb", buffering=0) as f:
            buf = f.read()
        i, n = 0, len(buf)
        with memoryview(buf) as view:
            while i < n:
                crc, _off, _ts, klen, vlen = unpack(buf, i)
                kend = i + hs + klen
                end = kend + vlen if vlen > 0 else kend
                if crc32(view[i + 4:end]) != crc:
                    raise ValueError(f"crc mismatch at byte {i} of segment {base}")
                _key = buf[kend - klen:kend]
                _value = buf[kend:end] if vlen >= 0 else None
                count += 1
                i = end
    return count


def _write_changelog(part: FileChangelogPartition, records: int, keys: int, value_size: int) -> None:
    order = list(range(keys))
    random.Random(19).shuffle(order)
    value = os.urandom(value_size)
    batch = 10_000
    for start in range(0, records, batch):
        part.append_many((b"key-%012d" % order[i % keys], value) for i in range(start, min(records, start + batch)))
        part.flush()


def _engine(directory: Path, backend: str, changelog: FileChangelogPartition):  # noqa: ANN202
    directory.mkdir(parents=True, exist_ok=True)
    factory = KeyValueEngineFactory()
    options = factory.validate_options("bench", {"backend": backend, "map_size": "1GB"})
    context = StoreContext(job="bench", store="bench", partition=0, directory=directory, options=options,
                           key_serde=BytesSerde(), value_serde=BytesSerde(), changelog=changelog)
    return factory.create(context)


class RecordPath:
    """A KV engine seen without its column capability: recovery feeds it ChangelogRecords."""

    def __init__(self, engine) -> None:  # noqa: ANN001
        self._engine = engine
        self.context = engine.context

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "restore_columns":
            raise AttributeError(name)
        return getattr(self._engine, name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench restore")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default: one per record)")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    n, keys = args.records, args.keys or args.records
    report = Report("restore", params={"records": n, "keys": keys, "key_bytes": 16, "value_bytes": args.value_size,
                                       "repeat": args.repeat, "key_order": "random"})
    root = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    try:
        system = FileChangelogSystem({"segment_bytes": "64MB", "fsync": False}, root / "changelog")
        part = system.partition("restore", 0)
        _write_changelog(part, n, keys, args.value_size)
        end = part.flushed_end()
        directory = system.partition_dir("restore", 0)
        reader = system.reader("restore", 0)
        runs = 0

        def restore(backend: str, record_path: bool = False) -> tuple[float, float]:
            """Wall and CPU seconds of one ``recover_store`` into a fresh store (opening the store,
            the spot check and closing it are outside the timed part)."""
            nonlocal runs
            runs += 1
            engine = _engine(root / f"store-{runs}", backend, part)
            try:
                target = RecordPath(engine) if record_path else engine
                cpu = time.process_time()
                started = time.perf_counter()
                recovery = recover_store(target, part, end, label="bench")
                timed = time.perf_counter() - started, time.process_time() - cpu
                assert recovery.replayed == n and recovery.trimmed == 0
                # Spot-check the restored state: the last value of a key is readable.
                assert engine.get(b"key-%012d" % (keys - 1)) is not None
            finally:
                engine.close()
                shutil.rmtree(root / f"store-{runs}", ignore_errors=True)
            return timed

        cases: dict[str, Callable[[], object]] = {
            "baseline: read+decode+crc (plain Python)": lambda: baseline_decode(directory),
            "read_columns()": lambda: deque(reader.read_columns(), maxlen=0),
            "read() (records)": lambda: deque(reader.read(), maxlen=0),
            **{f"restore into KV ({b})": (lambda b=b: restore(b)) for b in BACKENDS},
            "restore into KV (rocksdb), record path": lambda: restore("rocksdb", record_path=True),
        }
        assert baseline_decode(directory) == n  # also warms the page cache
        best = {name: (float("inf"), float("inf")) for name in cases}
        for _ in range(args.repeat):
            for name, fn in cases.items():
                cpu = time.process_time()
                started = time.perf_counter()
                timed = fn()
                if not isinstance(timed, tuple):  # a restore times itself (see restore())
                    timed = time.perf_counter() - started, time.process_time() - cpu
                best[name] = min(best[name], timed)
        base = best["baseline: read+decode+crc (plain Python)"][0]
        for name, (seconds, cpu) in best.items():
            report.add(name, records_per_s=n / seconds, seconds=seconds, cpu_seconds=cpu)
        for b in BACKENDS:
            report.ratio(f"restore {b} / baseline decode", base / best[f"restore into KV ({b})"][0], ">= 0.7")
        # CPU seconds (all threads of this process): what the same ratio would be on an idle machine
        # when the wall clock is stretched by other processes' load.
        base_cpu = best["baseline: read+decode+crc (plain Python)"][1]
        for b in BACKENDS:
            report.ratio(f"restore {b} / baseline decode, cpu seconds", base_cpu / best[f"restore into KV ({b})"][1])
        report.ratio("read_columns() / baseline decode", base / best["read_columns()"][0])
        report.ratio("read() / baseline decode", base / best["read() (records)"][0])
        report.ratio("restore rocksdb, record path / baseline decode",
                     base / best["restore into KV (rocksdb), record path"][0])
        report.ratio("restore rocksdb: column path / record path",
                     best["restore into KV (rocksdb), record path"][0] / best["restore into KV (rocksdb)"][0])
        reader.close()
        part.close()
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB; segment files in the page cache; best of "
                            f"{args.repeat} interleaved rounds; load average at the end "
                            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.emit(args.json)
    return 0
