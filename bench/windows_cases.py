"""The cases of ``bench windows``, each run in a fresh process: ``python -m bench.windows_cases CASE
'<json params>'`` prints one JSON object (seconds, cpu_seconds, windows emitted, their counted sum).

The workload is the shared counting workload (../shared/peers/workload.py: event i has key
user-<(i*7919) mod K>) with event time ``start + i / rate``: in order, so no record is late and
every window closes when the watermark passes its end."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.kv_cases import _Clock, _workload

__all__ = ["CASES", "timestamps"]


def timestamps(p: dict[str, Any]) -> list[float]:
    start, rate = p["start"], p["rate"]
    return [start + i / rate for i in range(p["events"])]


def runtime(tmp: Path, p: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """A per-record StreamTask with a :class:`~localstate.windows.WindowedAggregation` (tumbling
    count, ``emit = "final"``), or with ``batch`` a BatchTask calling ``add_batch`` on Arrow batches
    of up to 4096 rows, through a TaskInstance's feed loop: kv store on ``backend``, timers
    in their logged store, file changelog, a commit and checkpoint every ``commit_every`` records
    (the batch boundary where due timers fire)."""
    from localstate.core.config import parse_job_config
    from localstate.runtime.layout import open_changelog_system
    from localstate.core.stream import InputRecord
    from localstate.core.task import BatchTask, StreamTask
    from localstate.runtime.partition.instance import TaskInstance
    from localstate.runtime.partition.sink import MemorySink
    from localstate.windows import Tumbling, WindowedAggregation, count

    size = p["window"]

    class TumblingCount(StreamTask):
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, Tumbling(size), count(), store="counts", output="windows")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)

    class TumblingCountBatch(BatchTask):
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, Tumbling(size), count(), store="counts", output="windows")

        def process_batch(self, batch: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add_batch(batch.column("key"), batch.column("value"), batch.column("timestamp"), collector)

    if p.get("batch"):
        import numpy  # noqa: F401  (add_batch's; imported before the clock, as pyarrow below)

        from localstate.core.task import record_batch
        record_batch(["events"], [0], ["k"], [None], [0.0])  # pyarrow's first inference imports more: not measured
    job = parse_job_config({
        "job": {"name": "bench", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp / "state"),
                "commit_interval": 10 ** 9},
        "time": {"timers": True, "timer_key_serde": "string"},
        "stores": {"counts": {"engine": "kv", "backend": p["backend"], "key_serde": "string", "value_serde": "int",
                              "cache_size": p.get("cache_size", 100_000)}},
        "changelogs": {"file": {}}}, base_dir=tmp)
    changelogs = open_changelog_system(job)
    sink = MemorySink()
    instance = TaskInstance(job, 0, changelogs, sink, task_factory=TumblingCountBatch if p.get("batch") else TumblingCount)
    instance.open()
    every = p["commit_every"]
    records = [("events", InputRecord(i, k, None, ts)) for i, (k, ts) in enumerate(zip(keys, timestamps(p)))]
    with _Clock() as clock:
        for start in range(0, len(records), every):
            instance.feed(records[start:start + every])
            instance.commit()
    out = sink.messages("windows")
    instance.close(commit=False)
    changelogs.close()
    return {**clock.figures(), "windows": len(out), "counted": sum(m.value["value"] for m in out)}


def plain_python(tmp: Path, p: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The same tumbling count in a dict, windows emitted as the watermark passes their end, checked
    every ``commit_every`` records (no store, no changelog, no timers): the floor of the work."""
    size, every = p["window"], p["commit_every"]
    open_windows: dict[tuple[str, int], int] = {}
    emitted = counted = 0
    with _Clock() as clock:
        stamps = timestamps(p)
        watermark = float("-inf")
        for i, (key, ts) in enumerate(zip(keys, stamps), 1):
            index = int(ts // size)
            open_windows[(key, index)] = open_windows.get((key, index), 0) + 1
            watermark = max(watermark, ts)
            if i % every == 0 or i == len(keys):
                for window in [w for w in open_windows if (w[1] + 1) * size <= watermark]:
                    emitted += 1
                    counted += open_windows.pop(window)
    return {**clock.figures(), "windows": emitted, "counted": counted}


CASES = {"runtime": runtime, "plain_python": plain_python}


def main(argv: list[str]) -> int:
    case, params = argv[0], json.loads(argv[1])
    keys = _workload().keys(params["events"], params["keys"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-windows-"))
    try:
        result = CASES[case](tmp, params, keys)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.update(events=len(keys), ops_per_s=len(keys) / result["seconds"],
                  cpu_ops_per_s=len(keys) / max(result["cpu_seconds"], 1e-9))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
