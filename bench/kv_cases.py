"""Worker of ``bench/kv.py``: runs ONE measurement in a fresh process (so peak RSS and timings of
different systems do not mix) and prints one JSON object. Usage (normally called by bench/kv.py):
``python -m bench.kv_cases CASE '{"events": ..., ...}'``."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.report import peak_rss_mb

__all__ = ["main", "CASES"]

def _find_peers() -> Path:
    """The shared peers directory: ``$LOCALSTATE_PEERS``, else the first ``shared/peers`` above the
    repository (``../shared/peers`` from the main checkout, ``../../shared/peers`` from a worktree)."""
    override = os.environ.get("LOCALSTATE_PEERS")
    if override:
        return Path(override)
    root = Path(__file__).resolve().parents[1]
    for parent in root.parents:
        if (parent / "shared" / "peers").is_dir():
            return parent / "shared" / "peers"
    return root.parent / "shared" / "peers"


PEERS = _find_peers()


def _workload() -> Any:
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import workload  # the shared counting workload: same key sequence as every peer script
    return workload


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 20)


def _changelog(tmp: Path, kind: str = "file") -> tuple[Any, str]:
    """The file changelog when it exists (fsync on), else the in-memory one; ``kind="none"``: the
    NullChangelogWriter of stores with ``changelog = false`` (to measure the engine alone)."""
    if kind == "none":
        from localstate.core.changelog import NullChangelogWriter
        return NullChangelogWriter(), "none"
    try:
        from localstate.changelog.file import FileChangelogSystem
    except ImportError:
        from localstate.changelog.memory import MemoryChangelogPartition
        return MemoryChangelogPartition("bench-kv", 0), "memory"
    system = FileChangelogSystem({"path": str(tmp / "changelog"), "fsync": True}, tmp)
    system.ensure_stream("bench-kv", 1)
    return system.partition("bench-kv", 0), "file(fsync)"


def _engine(tmp: Path, p: dict[str, Any]) -> tuple[Any, Any, str]:
    """A kv store with the engine's default options, except those named in ``p`` (backend,
    cache_size, write_batch_size, ``extra``; ``value_serde``: ``"int"`` (default) or ``"json"``;
    ``clock``: ``"task"`` hands the store a time source whose clock is a Python method, as a task
    partition's is, instead of the default wall clock)."""
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import IntSerde, JsonSerde, StringSerde
    from localstate.engines.kv import KeyValueEngineFactory
    factory = KeyValueEngineFactory()
    raw = {k: p[k] for k in ("backend", "cache_size", "write_batch_size") if k in p}
    options = factory.validate_options("bench", {**raw, **p.get("extra", {})})
    changelog, kind = _changelog(tmp, p.get("changelog", "file"))
    (tmp / "store").mkdir()
    vserde = JsonSerde() if p.get("value_serde") == "json" else IntSerde()
    extra = {"time": _TaskClock()} if p.get("clock") == "task" else {}
    ctx = StoreContext("bench", "bench", 0, tmp / "store", options, StringSerde(), vserde, changelog, **extra)
    return factory.create(ctx), changelog, kind


class _TaskClock:
    """A time source read through Python methods (what a runtime's per-partition source costs)."""

    def processing_time(self) -> float:
        return time.time()

    @property
    def watermark(self) -> float | None:
        return None


class _Clock:
    """Wall time and process CPU time (every thread, so RocksDB's background work counts) of a
    ``with`` block. CPU time is the steadier figure on a machine shared with other jobs."""

    def __enter__(self) -> "_Clock":
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu

    def figures(self) -> dict[str, float]:
        return {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds}


def hot_dict(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """A plain dict; best of 3 runs (one lasts ~0.1 s, too short to average out scheduling noise)."""
    best: dict[str, float] = {}
    for _ in range(3):
        d: dict[str, int] = {}
        with _Clock() as clock:
            for k in ks:
                d[k] = d.get(k, 0) + 1
        assert sum(d.values()) == len(ks)
        best = {k: min(v, best.get(k, v)) for k, v in clock.figures().items()}
    return best


def _counted_and_closed(kv: Any, changelog: Any, kind: str, clock: "_Clock", events: int) -> dict[str, Any]:
    """Check the counts add up to ``events`` (read from the backend, cache dropped), then close the
    engine and its changelog; returns the case's figures."""
    kv._cache.clear()
    total = sum(v for _, v in kv.all())
    assert total == events, (total, events)
    result = {**clock.figures(), "changelog": kind, "records": kv.local_offset(), "spills": kv.spills}
    kv.close()
    getattr(changelog, "close", lambda: None)()
    return result


def engine_counts(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """get + put per event, flush (commit) every ``commit_every`` events."""
    kv, changelog, kind = _engine(tmp, p)
    get, put, flush = kv.get, kv.put, kv.flush
    every = p["commit_every"]
    with _Clock() as clock:
        for i, k in enumerate(ks, 1):
            put(k, (get(k) or 0) + 1)
            if i % every == 0:
                flush()
        flush()
    if p.get("verify", True):
        kv._cache.clear()
        total = sum(v for _, v in kv.all())
        assert total == len(ks), (total, len(ks))
    result = {**clock.figures(), "changelog": kind, "records": kv.local_offset(), "spills": kv.spills}
    kv.close()
    return result


def engine_sliced(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """get + put per event and one flush per ``commit_every`` events, with exactly the loop of
    ../shared/peers/ideal_limit.py (a slice of events, then the commit), so its ideal rows and these
    kv rows differ only in what happens inside get/put/flush. Options: as ``engine``."""
    kv, changelog, kind = _engine(tmp, p)
    get, put, flush = kv.get, kv.put, kv.flush
    every = p["commit_every"]
    with _Clock() as clock:
        for start in range(0, len(ks), every):
            for k in ks[start:start + every]:
                put(k, (get(k) or 0) + 1)
            flush()
    return _counted_and_closed(kv, changelog, kind, clock, len(ks))


def batch_task(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """The counting workload as a BatchTask: each commit interval's events arrive as Arrow batches of
    ``batch_rows`` rows (built by ``core.task.record_batch``, before the clock starts: the per-record
    rows get their keys as Python objects ready-made, these rows their batches), the task's
    ``process_batch`` counts them, one flush per ``commit_every`` events. ``aggregate``: the task
    first counts its batch's keys in Arrow (``group_by``), then ``merge_many``s the distinct keys;
    else ``merge_many`` of every row's key with delta 1 (what ``tests/spark/count_task.py``'s
    CountByKeyBatch does, without the outputs)."""
    import pyarrow as pa

    from localstate.core.task import BatchTask, Collector, Coordinator, record_batch
    kv, changelog, kind = _engine(tmp, p)
    aggregate = p.get("aggregate", False)

    class CountBatch(BatchTask):
        def process_batch(self, batch: Any, collector: Any, coordinator: Any) -> None:
            if aggregate:
                counted = pa.Table.from_batches([batch]).group_by("key").aggregate([("key", "count")])
                kv.merge_many(counted.column("key").to_pylist(), counted.column("key_count").to_pylist())
            else:
                keys = batch.column("key").to_pylist()
                kv.merge_many(keys, [1] * len(keys))

    task, collector, coordinator = CountBatch(), Collector(), Coordinator()
    every, rows = p["commit_every"], p.get("batch_rows", 4096)
    streams = ["events"]
    # pyarrow's first type inference and group_by import more modules: not part of the measurement
    pa.Table.from_batches([record_batch(streams, [0], ["k"], [None], [None])]).group_by("key").aggregate(
        [("key", "count")])
    commits = []
    for start in range(0, len(ks), every):
        end = min(start + every, len(ks))
        spans = [(first, min(first + rows, end)) for first in range(start, end, rows)]
        commits.append([record_batch(streams, range(first, last), pa.array(ks[first:last], pa.string()),
                                     pa.nulls(last - first), pa.nulls(last - first, pa.float64()))
                        for first, last in spans])
    with _Clock() as clock:
        for batches in commits:
            for batch in batches:
                task.process_batch(batch, collector, coordinator)
            kv.flush()
    return _counted_and_closed(kv, changelog, kind, clock, len(ks))


def task_feed(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """The counting workload through the runtime: a TaskInstance (kv store ``counts``, file changelog,
    checkpoints) fed ``InputRecord``s by its one feed loop, a commit every ``commit_every`` records,
    with the per-record task (``batch`` false: ``process()`` per record, get + put, fed records) or the
    batch task (``batch`` true: fed column chunks of up to 4096 rows, as an input read as columns
    gives them; an Arrow batch and one ``merge_many`` each). No outputs."""
    import pyarrow as pa

    from localstate.core.config import parse_job_config
    from localstate.runtime.layout import open_changelog_system
    from localstate.core.stream import COLUMN_ROWS, InputColumns, InputRecord
    from localstate.core.task import BatchTask, StreamTask, record_batch
    from localstate.runtime.partition.instance import TaskInstance
    from localstate.runtime.partition.records import ColumnRows

    class Count(StreamTask):
        def init(self, context: Any) -> None:
            self.counts = context.store("counts")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            counts = self.counts
            counts.put(envelope.key, (counts.get(envelope.key) or 0) + 1)

    class CountBatch(BatchTask):
        def init(self, context: Any) -> None:
            self.counts = context.store("counts")

        def process_batch(self, batch: pa.RecordBatch, collector: Any, coordinator: Any) -> None:
            keys = batch.column("key").to_pylist()
            self.counts.merge_many(keys, [1] * len(keys))

    record_batch(["events"], [0], ["k"], [None], [None])  # pyarrow's first inference imports more: not measured
    job = parse_job_config({
        "job": {"name": "bench", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp / "state"),
                "commit_interval": 10 ** 9},
        "stores": {"counts": {"engine": "kv", "backend": p["backend"], "key_serde": "string", "value_serde": "int",
                              "cache_size": p.get("cache_size", 100_000)}},
        "changelogs": {"file": {}}}, base_dir=tmp)
    changelogs = open_changelog_system(job)
    instance = TaskInstance(job, 0, changelogs, task_factory=CountBatch if p.get("batch") else Count)
    instance.open()
    every = p["commit_every"]
    if p.get("batch"):
        # As the native path feeds a batch task from an input read as columns (ColumnarInput, e.g. a
        # JSON-lines file through Arrow's reader): chunks of up to COLUMN_ROWS rows as Arrow arrays, made
        # before the clock starts (the per-record rows get their InputRecords ready-made).
        chunks = [ColumnRows("events", InputColumns(range(first, last), pa.array(ks[first:last], pa.string()),
                                                    pa.nulls(last - first), pa.nulls(last - first, pa.float64()),
                                                    [], last))
                  for start in range(0, len(ks), every)
                  for first, last in ((f, min(f + COLUMN_ROWS, start + every, len(ks)))
                                      for f in range(start, min(start + every, len(ks)), COLUMN_ROWS))]
        per_commit = -(-every // COLUMN_ROWS)
        with _Clock() as clock:
            for index in range(0, len(chunks), per_commit):
                instance.feed(chunks[index:index + per_commit])
                instance.commit()
    else:
        records = [("events", InputRecord(i, k, None, None)) for i, k in enumerate(ks)]
        with _Clock() as clock:
            for start in range(0, len(records), every):
                instance.feed(records[start:start + every])
                instance.commit()
    kv = instance.stores["counts"].engine
    kv._cache.clear()
    total = sum(v for _, v in kv.all())
    assert total == len(ks), (total, len(ks))
    instance.close(commit=False)
    changelogs.close()
    return {**clock.figures(), "changelog": "file"}


def ideal_limit(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """../shared/peers/ideal_limit.py's plain-Python durable limit (``p["backend"]``: rocksdb,
    rocksdb_tuned or lmdb), run in this process on the same key list."""
    _workload()  # puts the peers directory on sys.path
    import ideal_limit as peer
    result = peer.ideal(ks, p["commit_every"], p["backend"], str(tmp))
    return {k: v for k, v in result.items() if k in ("seconds", "cpu_seconds", "fsync_seconds", "db_write_seconds",
                                                     "records")}


def storage_floor(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """The storage floor of the workload (../shared/peers/storage_floor.py, with the kv engine's own
    backend settings): each commit interval's changed records coalesced, encoded (the int serde's 8
    bytes) and sorted before the clock starts, then written with no per-event work, one commit per
    ``commit_every`` events. ``p["backend"]``: ``lmdb`` (one synced transaction per commit,
    ``putmulti``, opened as the engine opens it), ``rocksdb`` (one WriteBatch per commit, the engine's
    RocksDB options) or ``changelog`` (the changelog's bytes, framed as the file changelog frames
    them, appended and fsynced per commit)."""
    from collections import deque
    from itertools import starmap

    every = p["commit_every"]
    commits = []
    for start in range(0, len(ks), every):
        counts: dict[str, int] = {}
        for key in ks[start:start + every]:
            counts[key] = counts.get(key, 0) + 1
        commits.append(sorted((key.encode(), (count + (1 << 63)).to_bytes(8, "big")) for key, count in counts.items()))
    records = sum(map(len, commits))
    backend = p["backend"]
    if backend == "lmdb":
        import lmdb
        env = lmdb.open(str(tmp / "floor-lmdb"), map_size=1 << 34, max_dbs=2, sync=True, metasync=True,
                        readahead=False, lock=True)
        data = env.open_db(b"data")
        with _Clock() as clock:
            for items in commits:
                with env.begin(write=True, db=data) as txn:
                    txn.cursor().putmulti(items)
        env.close()
    elif backend == "rocksdb":
        import rocksdict

        from localstate.engines.backends.rocksdb import build_options
        from localstate.engines.kv import KeyValueEngineFactory
        db = rocksdict.Rdict(str(tmp / "floor-rocksdb"), options=build_options(
            KeyValueEngineFactory().validate_options("bench", {})))
        with _Clock() as clock:
            for items in commits:
                batch = rocksdict.WriteBatch(raw_mode=True)
                deque(starmap(batch.put, items), maxlen=0)
                db.write(batch)
        db.close()
    else:
        from localstate.changelog.framing import encode_into
        payloads = []
        for items in commits:
            buf = bytearray()
            encode_into(buf, items, 0, 0)
            payloads.append(bytes(buf))
        fd = os.open(tmp / "floor-changelog", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with _Clock() as clock:
            for payload in payloads:
                os.write(fd, payload)
                os.fsync(fd)
        os.close(fd)
    return {**clock.figures(), "records": records}


def raw_rocksdict_batch(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Raw rocksdict in raw mode: get per event, puts collected in a WriteBatch written every
    ``commit_every`` events (the physical limit of the rocksdb backend, without changelog)."""
    import rocksdict
    if p.get("kv_options"):
        # the same RocksDB tuning the kv engine uses by default (bloom filter, block cache, lz4)
        from localstate.engines.kv import KeyValueEngineFactory
        from localstate.engines.backends.rocksdb import build_options
        options = build_options(KeyValueEngineFactory().validate_options("bench", {}))
    else:
        options = rocksdict.Options(raw_mode=True)   # as ../shared/peers/raw_limits.py
    db = rocksdict.Rdict(str(tmp / "raw"), options=options)
    every = p["commit_every"]
    pending: dict[bytes, bytes] = {}   # read-your-writes within a batch, as the engine gives
    wb = rocksdict.WriteBatch(raw_mode=True)
    with _Clock() as clock:
        for i, k in enumerate(ks, 1):
            kb = k.encode()
            v = pending.get(kb)
            if v is None:
                v = db.get(kb)
            nv = (int.from_bytes(v, "big") + 1 if v is not None else 1).to_bytes(8, "big")
            pending[kb] = nv
            wb.put(kb, nv)
            if i % every == 0:
                db.write(wb)
                wb = rocksdict.WriteBatch(raw_mode=True)
                pending.clear()
        db.write(wb)
    db.close()
    return clock.figures()


def raw_lmdb(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Raw LMDB: one write transaction per ``commit_every`` events, get + put per event."""
    import lmdb
    env = lmdb.open(str(tmp / "raw-lmdb"), map_size=1 << 34, sync=True)
    every = p["commit_every"]
    with _Clock() as clock:
        txn = env.begin(write=True)
        for i, k in enumerate(ks, 1):
            kb = k.encode()
            v = txn.get(kb)
            txn.put(kb, (int.from_bytes(v, "big") + 1 if v is not None else 1).to_bytes(8, "big"))
            if i % every == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.commit()
    env.close()
    return clock.figures()


def restore(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Rebuild a store from changelog records with ``restore()`` (bulk, one batch per chunk) then
    ``flush()``; with ``replay`` instead put() every record through the API and flush."""
    from localstate.core.changelog import ChangelogRecord
    kv, changelog, kind = _engine(tmp, p)
    records = [ChangelogRecord(k.encode(), (i + 1).to_bytes(8, "big"), i) for i, k in enumerate(ks)]
    with _Clock() as clock:
        if p.get("replay"):
            put = kv.put
            for k, r in zip(ks, records):
                put(k, int.from_bytes(r.value, "big"))
        else:
            kv.restore(records)
        kv.flush()
    result = {**clock.figures(), "changelog": kind, "spills": kv.spills}
    kv.close()
    return result


CASES: dict[str, Callable[[Path, dict[str, Any], list[str]], dict[str, Any]]] = {
    "dict": hot_dict,
    "engine": engine_counts,
    "engine_sliced": engine_sliced,
    "batch_task": batch_task,
    "task_feed": task_feed,
    "ideal": ideal_limit,
    "rocksdict_batch": raw_rocksdict_batch,
    "floor": storage_floor,
    "lmdb_raw": raw_lmdb,
    "restore": restore,
}


def main(argv: list[str]) -> int:
    case, params = argv[0], json.loads(argv[1])
    workload = _workload()
    if params.get("dist") == "zipf":
        ks = workload.zipf_keys(params["events"], params["keys"], params.get("zipf_s", 1.1), params.get("seed", 42))
    elif params.get("passes"):
        # cold set: every key once per pass, in the shared scattered order (bounded key list)
        ks = workload.keys(params["keys"], params["keys"]) * params["passes"]
    else:
        ks = workload.keys(params["events"], params["keys"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-"))
    rss_setup = _rss_mb()
    try:
        result = CASES[case](tmp, params, ks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    events = len(ks)
    result.update(events=events, ops_per_s=events / result["seconds"],
                  cpu_ops_per_s=events / max(result["cpu_seconds"], 1e-9), peak_rss_mb=peak_rss_mb(),
                  rss_growth_mb=max(0.0, peak_rss_mb() - rss_setup))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
