"""Worker of ``bench/kv.py``: runs ONE measurement in a fresh process (so peak RSS and timings of
different systems do not mix) and prints one JSON object. Usage (normally called by bench/kv.py):
``python -m bench kv_cases CASE '{"events": ..., ...}'``."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.report import peak_rss_mb

__all__ = ["main", "CASES"]

PEERS = Path(__file__).resolve().parents[1].parent / "shared" / "peers"


def _workload() -> Any:
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import workload  # the shared counting workload: same key sequence as every peer script
    return workload


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 20)


def _changelog(tmp: Path) -> tuple[Any, str]:
    """The file changelog when it exists (fsync on), else the in-memory one."""
    try:
        from localstate.changelog.file import FileChangelogSystem
    except ImportError:
        from localstate.changelog.memory import MemoryChangelogPartition
        return MemoryChangelogPartition("bench-kv", 0), "memory"
    system = FileChangelogSystem({"path": str(tmp / "changelog"), "fsync": True}, tmp)
    system.ensure_stream("bench-kv", 1)
    return system.partition("bench-kv", 0), "file(fsync)"


def _engine(tmp: Path, p: dict[str, Any]) -> tuple[Any, Any, str]:
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import IntSerde, StringSerde
    from localstate.engines.kv import KeyValueEngineFactory
    factory = KeyValueEngineFactory()
    options = factory.validate_options("bench", {"backend": p["backend"], "cache_size": p["cache_size"],
                                                 "write_batch_size": p["write_batch_size"],
                                                 **p.get("extra", {})})
    changelog, kind = _changelog(tmp)
    (tmp / "store").mkdir()
    ctx = StoreContext("bench", "bench", 0, tmp / "store", options, StringSerde(), IntSerde(), changelog)
    return factory.create(ctx), changelog, kind


def hot_dict(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    d: dict[str, int] = {}
    start = time.perf_counter()
    for k in ks:
        d[k] = d.get(k, 0) + 1
    seconds = time.perf_counter() - start
    assert sum(d.values()) == len(ks)
    return {"seconds": seconds}


def engine_counts(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """get + put per event, flush (commit) every ``commit_every`` events."""
    kv, changelog, kind = _engine(tmp, p)
    get, put, flush = kv.get, kv.put, kv.flush
    every = p["commit_every"]
    start = time.perf_counter()
    for i, k in enumerate(ks, 1):
        put(k, (get(k) or 0) + 1)
        if i % every == 0:
            flush()
    flush()
    seconds = time.perf_counter() - start
    if p.get("verify", True):
        kv._cache.clear()
        total = sum(v for _, v in kv.all())
        assert total == len(ks), (total, len(ks))
    result = {"seconds": seconds, "changelog": kind, "records": kv.local_offset(), "spills": kv.spills}
    kv.close()
    return result


def raw_rocksdict_batch(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Raw rocksdict in raw mode: get per event, puts collected in a WriteBatch written every
    ``commit_every`` events (the physical limit of the rocksdb backend, without changelog)."""
    import rocksdict
    if p.get("kv_options"):
        # the same RocksDB tuning the kv engine uses by default (bloom filter, block cache, lz4)
        from localstate.engines.kv import KeyValueEngineFactory
        from localstate.engines.kv.backends.rocksdb import build_options
        options = build_options(KeyValueEngineFactory().validate_options("bench", {}))
    else:
        options = rocksdict.Options(raw_mode=True)   # as ../shared/peers/raw_limits.py
    db = rocksdict.Rdict(str(tmp / "raw"), options=options)
    every = p["commit_every"]
    pending: dict[bytes, bytes] = {}   # read-your-writes within a batch, as the engine gives
    wb = rocksdict.WriteBatch(raw_mode=True)
    start = time.perf_counter()
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
    seconds = time.perf_counter() - start
    db.close()
    return {"seconds": seconds}


def raw_lmdb(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Raw LMDB: one write transaction per ``commit_every`` events, get + put per event."""
    import lmdb
    env = lmdb.open(str(tmp / "raw-lmdb"), map_size=1 << 34, sync=True)
    every = p["commit_every"]
    start = time.perf_counter()
    txn = env.begin(write=True)
    for i, k in enumerate(ks, 1):
        kb = k.encode()
        v = txn.get(kb)
        txn.put(kb, (int.from_bytes(v, "big") + 1 if v is not None else 1).to_bytes(8, "big"))
        if i % every == 0:
            txn.commit()
            txn = env.begin(write=True)
    txn.commit()
    seconds = time.perf_counter() - start
    env.close()
    return {"seconds": seconds}


def restore(tmp: Path, p: dict[str, Any], ks: list[str]) -> dict[str, Any]:
    """Rebuild a store from changelog records with ``restore()`` (bulk, one batch per chunk) then
    ``flush()``; with ``replay`` instead put() every record through the API and flush."""
    from localstate.core.changelog import ChangelogRecord
    kv, changelog, kind = _engine(tmp, p)
    records = [ChangelogRecord(k.encode(), (i + 1).to_bytes(8, "big"), i) for i, k in enumerate(ks)]
    start = time.perf_counter()
    if p.get("replay"):
        put = kv.put
        for k, r in zip(ks, records):
            put(k, int.from_bytes(r.value, "big"))
    else:
        kv.restore(records)
    kv.flush()
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "changelog": kind, "spills": kv.spills}
    kv.close()
    return result


CASES: dict[str, Callable[[Path, dict[str, Any], list[str]], dict[str, Any]]] = {
    "dict": hot_dict,
    "engine": engine_counts,
    "rocksdict_batch": raw_rocksdict_batch,
    "lmdb_raw": raw_lmdb,
    "restore": restore,
}


def main(argv: list[str]) -> int:
    case, params = argv[0], json.loads(argv[1])
    workload = _workload()
    if params.get("passes"):
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
    result.update(events=events, ops_per_s=events / result["seconds"], peak_rss_mb=peak_rss_mb(),
                  rss_growth_mb=max(0.0, peak_rss_mb() - rss_setup))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
