"""What ``localstate validate`` costs on a job with many stores (issue #37).

    python -m bench validate [--json] [--stores N] [--repeat R]

Workload: a generated job folder with ``--stores`` stores (default 10,000; each ``engine = "kv"``,
``backend = "memory"``, string keys and int values, one line of engine options), one jsonl input, one
jsonl output and a small task module next to ``job.toml``.

- *parse TOML* (the baseline): reading and parsing the same ``job.toml`` alone
  (``core.tomlfile.read_toml_file``), what no validation can avoid.
- *check_job*: ``localstate validate``'s core, :func:`localstate.tools.validation.check_job`, in full:
  policy, every store's engine, serdes and options, inputs, outputs, the task class. Each repeat starts
  from a cold plugin discovery (``invalidate_discovery``), as a fresh ``localstate validate`` process
  does.
- *one uncached plugin scan*: what every store paid before discovery was cached: one
  ``Registry.available("backends")`` after ``invalidate_discovery`` (scan the entry points, read the
  distributions' metadata, apply the policy); times ``--stores`` it is the old per-store overhead.

Best of ``--repeat`` runs (default 3) for each figure.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.report import Report, peak_rss_mb
from localstate.core.policy import PluginPolicy, invalidate_discovery
from localstate.core.registry import Registry
from localstate.core.tomlfile import read_toml_file
from localstate.tools.validation import check_job

__all__ = ["main", "write_job"]

TASK = '''from localstate import StreamTask


class Noop(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass
'''


def write_job(folder: Path, stores: int) -> Path:
    """A valid job with ``stores`` kv stores in ``folder``; returns the job file."""
    (folder / "in").mkdir(parents=True, exist_ok=True)
    (folder / "bench_validate_task.py").write_text(TASK)
    lines = ['[job]', 'name = "bench-validate"', 'partitions = 2', 'task = "bench_validate_task:Noop"', '',
             '[inputs.events]', 'system = "jsonl"', 'path = "in"', '',
             '[outputs.results]', 'system = "jsonl"', 'path = "out"', '']
    for index in range(stores):
        lines += [f'[stores.s{index:06d}]', 'engine = "kv"', 'backend = "memory"', 'key_serde = "string"',
                  'value_serde = "int"', 'restore_batch_size = 5000', '']
    job = folder / "job.toml"
    job.write_text("\n".join(lines))
    return job


def _best(repeat: int, run) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench validate")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--stores", type=int, default=10_000, help="stores in the generated job (default 10000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is reported")
    args = parser.parse_args(argv)
    n = args.stores
    report = Report("validate", params={"stores": n, "repeat": args.repeat, "engine": "kv/memory"})
    folder = Path(tempfile.mkdtemp(prefix="bench-validate-"))
    try:
        job = write_job(folder, n)
        parse = _best(args.repeat, lambda: read_toml_file(job, "job config"))
        report.add("parse TOML (baseline)", stores=n, seconds=parse, ms_per_store=parse / n * 1000)

        def validate() -> None:
            invalidate_discovery()  # as cold as a new `localstate validate` process
            check = check_job(job)
            if check.problems:
                raise SystemExit(f"the generated job does not validate: {check.problems[:3]}")

        seconds = _best(args.repeat, validate)
        report.add("check_job", stores=n, seconds=seconds, ms_per_store=seconds / n * 1000)

        def scan() -> None:
            invalidate_discovery()
            Registry(PluginPolicy()).available("backends")

        scan()  # warm the file system caches, as the old per-store scans all but the first ran warm
        one_scan = _best(max(args.repeat, 5), scan)
        report.add("one uncached plugin scan", seconds=one_scan, ms_per_store=one_scan * 1000)
        report.ratio("check_job / parse TOML", seconds / parse)
        report.ratio("check_job seconds per 10k stores", seconds / n * 10_000, "<= 2")
        report.ratio("old per-store scans / check_job (N x one scan)", one_scan * n / seconds)
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB; before the discovery cache each store paid about "
                            "one uncached plugin scan (issue #37: 3.4 ms per store, 139 s for 40k stores)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.emit(args.json)
    return 0
