"""Worker of ``bench/durable.py``: ONE measurement in a fresh process, printed as one JSON object.
Usage (normally called by bench/durable.py): ``python -m bench.durable_cases CASE '{...}'``."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from bench.kv_cases import _Clock, _workload
from bench.report import peak_rss_mb
from localstate.core.task import StreamTask

__all__ = ["main", "CASES"]


def _system(tmp: Path, p: dict[str, Any]) -> Any:
    if p["changelog"] == "file":
        from localstate.changelog.file import FileChangelogSystem
        return FileChangelogSystem({"path": str(tmp / "changelog"), "fsync": True}, tmp)
    from localstate.changelog.objectstore import ObjectStoreChangelogSystem
    return ObjectStoreChangelogSystem(p["options"], tmp)


def _kv(directory: Path, changelog: Any, p: dict[str, Any]) -> Any:
    """A kv RocksDB store with the engine's default options (hot set in its cache) logging to ``changelog``."""
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import IntSerde, StringSerde
    from localstate.engines.kv import KeyValueEngineFactory
    factory = KeyValueEngineFactory()
    options = factory.validate_options("bench", {"backend": "rocksdb", "cache_size": p.get("cache_size", 100_000)})
    directory.mkdir(parents=True)
    return factory.create(StoreContext("bench", "bench", 0, directory, options, StringSerde(), IntSerde(), changelog))


class CountingTask(StreamTask):
    """The counting job's task: one get + put per event on the kv store ``counts``, no outputs."""

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        counts = self.counts
        counts.put(envelope.key, (counts.get(envelope.key) or 0) + 1)


def counting_job(tmp: Path, p: dict[str, Any]) -> Any:
    """The counting job as a job file would declare it: one partition, a kv RocksDB store ``counts``
    (``cache_size`` entries cached) logging to the file changelog (fsync on) or to ``objectstore``
    with ``p["options"]``, a commit every ``commit_every`` events, ``pipelined_commits`` as given."""
    from localstate.core.config import parse_job_config
    changelogs = ({"file": {"path": str(tmp / "changelog"), "fsync": True}} if p["changelog"] == "file"
                  else {"objectstore": p["options"]})
    job: dict[str, Any] = {"name": "counting", "partitions": 1, "task": "bench.durable_cases:CountingTask",
                           "commit_every": p["commit_every"], "changelog": p["changelog"],
                           "state_dir": str(tmp / "state")}
    if "pipelined_commits" in p:
        job["pipelined_commits"] = p["pipelined_commits"]
    return parse_job_config({"job": job, "changelogs": changelogs,
                             "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string",
                                                   "value_serde": "int",
                                                   "cache_size": p.get("cache_size", 100_000)}}}, base_dir=tmp)


def counting(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """The shared counting workload through the runtime (``TaskInstance.feed`` with autocommit: a
    commit every ``commit_every`` events is ``TaskInstance.commit``, checkpoint included, as a job
    run in-process does), then ``close()`` (the last commit). Same code for every changelog."""
    from localstate.runtime.layout import open_changelog_system
    from localstate.runtime.partition.instance import TaskInstance
    from localstate.core.stream import InputRecord
    ks = _workload().keys(p["events"], p["keys"])
    job = counting_job(tmp, p)
    system = open_changelog_system(job)
    instance = TaskInstance(job, 0, system)
    instance.open()
    changelog = instance.stores["counts"].changelog
    records = [("events", InputRecord(i, k, None)) for i, k in enumerate(ks)]
    with _Clock() as clock:
        instance.feed(records, autocommit=True)
        instance.close()
    result = {**clock.figures(), "events": len(ks), "ops_per_s": len(ks) / clock.seconds,
              "commits": instance.commits, "pipelined": instance.pipelined,
              "commit_wait_seconds": instance.commit_wait_seconds, "checkpoint_seconds": instance.checkpoint_seconds}
    compactor_cpu = 0.0
    if hasattr(changelog, "put_wait_seconds"):
        result["snapshots"] = changelog.snapshots_written
        result["snapshot_seconds"] = changelog.snapshot_seconds
        result["put_wait_seconds"] = changelog.put_wait_seconds
        # The compactor subprocess's whole life (start-up and imports included), reaped at close().
        compactor_cpu = changelog.compactor_cpu_seconds
        result["compactor_cpu_seconds"] = compactor_cpu
    result["cpu_seconds_with_compactor"] = clock.cpu_seconds + compactor_cpu
    result["cpu_ops_per_s"] = len(ks) / max(clock.cpu_seconds + compactor_cpu, 1e-9)
    system.close()
    return result


def history(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Write a partition's history (``keys`` keys, each updated ``updates`` times, ``commits`` flushes,
    snapshots in the background as a running job takes them), then write to ``manifests`` the committed
    manifest and the manifest of the same history without snapshots (the full replay)."""
    system = _system(tmp, p)
    system.ensure_stream("bench", 1)
    log = system.partition("bench", 0)
    log.adopt(None)
    keys, updates, commits = p["keys"], p["updates"], p["commits"]
    total = keys * updates
    per_commit = total // commits
    names = [b"user-%08d" % i for i in range(keys)]
    full: list[dict[str, Any]] = []
    written = 0
    with _Clock() as clock:
        for commit in range(commits):
            batch = range(written, written + per_commit)
            log.append_many((names[i % keys], (i // keys + 1).to_bytes(8, "big")) for i in batch)
            written += per_commit
            log.flush()
            full.append(log.chain().deltas[-1].to_json())
            manifest = log.manifest()  # each commit names the chain, as prepare_commit does
    chain = log.chain()
    log.wait_for_snapshot()  # a snapshot still running when the host dies is simply never named
    replay = {**manifest, "snapshot": None, "deltas": full}
    log.close()
    Path(p["manifests"]).write_text(json.dumps({"committed": manifest, "full replay": replay}))
    return {**clock.figures(), "records": written,
            "snapshot_records": chain.snapshot.records if chain.snapshot else 0,
            "tail_records": sum(d.records for d in chain.deltas)}


def ready(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """A host with no local state: adopt ``manifest`` and restore an empty kv RocksDB store to its end
    (the runtime's recovery: ``engine.restore`` over the chain's records, then ``flush``)."""
    from localstate.runtime.partition.recovery import recover_store
    system = _system(tmp, p)
    log = system.partition("bench", 0)
    with _Clock() as clock:
        log.adopt(json.loads(Path(p["manifests"]).read_text())[p["manifest"]])
        kv = _kv(tmp / "store", log, p)
        recovery = recover_store(kv, log, log.end_offset(), label="bench")
    count = sum(1 for _ in kv.all())
    kv.close()
    return {**clock.figures(), "replayed": recovery.replayed, "keys": count}


def puts(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Latency of one whole-object write (``ObjectStore.put``, what a flush's PUT does) of ``bytes``
    bytes, ``count`` times in a row: median and 90th percentile in milliseconds."""
    import os
    import statistics
    import time
    system = _system(tmp, p)
    data = os.urandom(p["bytes"])
    seconds = []
    for i in range(p["count"]):
        started = time.perf_counter()
        system.store.put(f"bench-puts/{p['bytes']}-{i}", data)
        seconds.append(time.perf_counter() - started)
    seconds.sort()
    return {"bytes": p["bytes"], "puts": len(seconds), "median_ms": statistics.median(seconds) * 1000,
            "p90_ms": seconds[int(len(seconds) * 0.9)] * 1000}


CASES: dict[str, Callable[[Path, dict[str, Any]], dict[str, Any]]] = {
    "puts": puts,
    "counting": counting,
    "history": history,
    "ready": ready,
}


def main(argv: list[str]) -> int:
    case, params = argv[0], json.loads(argv[1])
    tmp = Path(tempfile.mkdtemp(prefix="bench-durable-"))
    try:
        result = CASES[case](tmp, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
