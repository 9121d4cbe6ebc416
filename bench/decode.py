"""A batch task's input decoding: ``python -m bench decode [--json] [--rows N]``.

One jsonl partition of ``--rows`` lines of ``bench spark``'s shape (``{"key": "user-...", "value":
{"page": ...}, "ts": <int>}``, the counting workload's keys)
decoded into the columns of a batch task's Arrow batches, by each candidate, in this process:

* ``read() + record_batch``: the per-record reader (one InputRecord per line, the json serde's
  decoder), its columns gathered as the feed loop gathers them, then ``record_batch``;
* ``read_columns() + record_batch``: the columnar reader (a chunk of ordinary lines parsed whole by
  Arrow's JSON reader where that is exact, else by orjson per line, else by the serde's decoder per
  line), then ``record_batch`` per chunk (what the native path now feeds);
* ``read_columns() without orjson``: the same without orjson (chunks Arrow cannot read exactly go to
  the serde's decoder);
* ``pyarrow.json.read_json``: Arrow's own reader over the whole file (no per-line errors: one bad
  line fails the file, and nested values are unified into structs, so it is not exact; a reference).

Ratios against ``read() + record_batch`` measured in the same run (best of ``--repeat``).

The co-partitioning check (``on_misrouted``, issue 43): the same readers over a file whose keys all
belong to partition 0 of 4, with the job at 4 partitions (every key checked: one partition per
distinct key of a chunk, remembered) against 1 partition (nothing to check), rows ``... checked``,
and their ratios.

Then the native Spark path's work for one partition without Spark (``run_partition`` of one planned
batch over the whole file: open, read and decode, the task, flush, commit preparation, close) with
``localstate.demo:PageViewCounter`` (per record) and ``PageViewCounterBatch`` (a batch task, fed the
input's column chunks), in CPU seconds of this process (best of ``--repeat``): what the batch task
changes in an executor, apart from Spark's own costs and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.report import Report

__all__ = ["main"]


def _job(tmp: Path, rows: int, *, partitions: int = 1, data: str = "data", owned: bool = False) -> Any:
    """The decode job (``partitions``) over ``<data>/0.jsonl`` of ``rows`` lines, written once; with
    ``owned`` its keys are only those partition 0 of 4 owns."""
    from localstate.core.config import load_job_config
    from localstate.core.partitioner import partition_for

    keys = ["user-%08d" % k for k in range(50_000)]
    if owned:
        keys = [key for key in keys if partition_for(key, 4) == 0]
    if not (tmp / data).exists():
        (tmp / data).mkdir()
        with open(tmp / data / "0.jsonl", "w") as handle:
            for i in range(rows):
                handle.write(json.dumps({"key": keys[i * 7919 % len(keys)], "value": {"page": "/page/%04d" % (i % 1000)},
                                         "ts": 1_700_000_000 + i}, separators=(",", ":")) + "\n")
    (tmp / f"job-{data}-{partitions}.toml").write_text(
        f'[job]\nname = "decode"\npartitions = {partitions}\ntask = "m:T"\n'
        f'[inputs.events]\nsystem = "jsonl"\npath = "{data}"\n')
    return load_job_config(tmp / f"job-{data}-{partitions}.toml")


def _partition_work(report: Report, tmp: Path, rows: int, repeat: int) -> None:
    """Rows ``partition work: <task>``: CPU seconds of one native-path batch of every row, per task."""
    from localstate.core.config import load_job_config
    from localstate.runtime.spark.affinity.kept import release_kept
    from localstate.runtime.spark.runner import PartitionPlan, run_partition

    cpu: dict[str, float] = {}
    for index in range(repeat):
        for task in ("PageViewCounter", "PageViewCounterBatch"):
            root = tmp / f"{task}-{index}"
            root.mkdir()
            (root / "job.toml").write_text(f"""
[job]
name = "decode-{task}"
partitions = 1
task = "localstate.demo:{task}"
state_dir = "{root / 'state'}"

[inputs.events]
system = "jsonl"
path = "{tmp / 'data'}"

[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"
cache_size = 100000
write_batch_size = 1000000
""")
            job = load_job_config(root / "job.toml")
            started = time.process_time()
            result = run_partition(job, PartitionPlan(batch=0, partition=0, ranges={"events": (0, rows)}, limit=None))
            spent = time.process_time() - started
            release_kept()
            assert "error" not in result and result["in"] == rows, result
            cpu[task] = min(cpu.get(task, float("inf")), spent)
    for task, seconds in cpu.items():
        report.add(f"partition work: {task}", rows_per_cpu_s=round(rows / seconds, 1), cpu_seconds=round(seconds, 3))
    report.ratio("partition work: batch task / per-record task (cpu time)",
                 cpu["PageViewCounter"] / cpu["PageViewCounterBatch"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench decode")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import pyarrow.json as pj

    import localstate.streams.jsonl as jsonl
    from localstate.core.stream import open_input
    from localstate.core.routing import RoutingCheck
    from localstate.core.task import record_batch
    from localstate.runtime.partition.records import BATCH_ROWS

    report = Report("decode", params={"rows": args.rows, "repeat": args.repeat})
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        job = _job(tmp, args.rows)
        source = open_input(job, "events")
        rows = args.rows

        def per_record(source: Any = source, checked: bool = False) -> int:
            n = 0
            records = iter(source.read(0, 0, rows))
            if checked:
                records = RoutingCheck.of(source, 0).records(records)
            while True:
                chunk = [r for _, r in zip(range(BATCH_ROWS), records)]
                if not chunk:
                    return n
                offsets, keys, values, times, _e, _r = zip(*chunk)
                n += record_batch(["events"], list(offsets), list(keys), list(values), list(times)).num_rows

        def columns(source: Any = source, checked: bool = False) -> int:
            chunks = source.read_columns(0, 0, rows)
            if checked:
                chunks = RoutingCheck.of(source, 0).columns(chunks)
            return sum(record_batch(["events"], c.offsets, c.keys, c.values, c.timestamps).num_rows for c in chunks)

        one, four = (open_input(_job(tmp, rows, partitions=n, data="owned", owned=True), "events") for n in (1, 4))

        def columns_stdlib() -> int:
            saved, jsonl._ORJSON_LOADS = jsonl._ORJSON_LOADS, None
            try:
                return columns()
            finally:
                jsonl._ORJSON_LOADS = saved

        def arrow_json() -> int:
            return pj.read_json(tmp / "data" / "0.jsonl").num_rows

        candidates: list[tuple[str, Callable[[], int]]] = [
            ("read() + record_batch", per_record), ("read_columns() + record_batch", columns),
            ("read_columns() without orjson", columns_stdlib), ("pyarrow.json.read_json", arrow_json),
            ("read() + record_batch, 1 partition", lambda: per_record(one)),
            ("read() + record_batch, 4 partitions checked", lambda: per_record(four, True)),
            ("read_columns() + record_batch, 1 partition", lambda: columns(one)),
            ("read_columns() + record_batch, 4 partitions checked", lambda: columns(four, True))]
        if jsonl._ORJSON_LOADS is None:
            candidates = [c for c in candidates if c[0] != "read_columns() without orjson"]
            report.notes.append("orjson is not installed: read_columns() used the json serde's decoder")
        figures: dict[str, float] = {}
        for label, run in candidates:
            best = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                assert run() == rows, label
                best = min(best, time.perf_counter() - started)
            figures[label] = rows / best
            report.add(label, rows_per_s=round(rows / best, 1), seconds=round(best, 3))
        base = figures["read() + record_batch"]
        for label, value in figures.items():
            if label != "read() + record_batch" and "partition" not in label:
                report.ratio(f"{label} / read() + record_batch", value / base)
        for reader in ("read()", "read_columns()"):
            report.ratio(f"{reader} co-partitioning check: checked / unchecked (rows per s)",
                         figures[f"{reader} + record_batch, 4 partitions checked"]
                         / figures[f"{reader} + record_batch, 1 partition"])
        _partition_work(report, tmp, rows, args.repeat)
    report.notes.append("pyarrow.json.read_json is not exact (one bad line fails the whole read, nested "
                        "values become structs with every field, ints and floats of one field widen): a reference")
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
