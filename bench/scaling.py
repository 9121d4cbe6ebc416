"""Scaling of ``localstate run`` on Spark ``local[2]``: the page-view counting job over JSON lines
with 1 partition and with 2, measured in the same run, and where the time goes in each.

    python -m bench scaling [--json] [--events N] [--users K] [--repeat R] [--backend B]

Workload and timing are ``python -m bench spark``'s (same events, same job file, ten micro-batches,
SparkContext start and warm-up untimed); each partition count gets its own pre-partitioned copy of
the events. Rounds alternate 1 and 2 partitions (the machine is shared: a load spike should hit
both); each figure is the best round. Target: 2 partitions >= 1.8x one partition.

Rows ``time[Np]: <phase>``: the timed run's wall clock split into driver phases, Spark's overhead and
the task phases on each batch's critical path (``RunSummary.breakdown``), for the best round of each
partition count. ``cpu_busy_pct``: CPU seconds of this machine (all processes: /proc/stat) over the
run's wall clock and the cores; 2 partitions cannot reach 2x when other processes hold a core.

The JSON-lines decode rows compare the input's strict decoder (a Python call per float literal to
refuse 1e400) with the same C scanner parsing floats in C without that check, on float-heavy lines:
the upper bound of what a cheaper overflow check could win.
"""

from __future__ import annotations

import argparse
import json
import json.scanner
import os
import random
import tempfile
import time
from pathlib import Path

from bench.report import Report
from bench.spark import _PHASES, _localstate, _write_events

__all__ = ["main"]


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cpus from /proc/stat (0, 0 when unavailable)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _decode_case(report: Report, lines: int) -> None:
    """The JSON-lines decode on float-heavy lines: the strict scanner the input uses (a Python call
    per float literal, refusing 1e400) against the same C scanner with C float parsing (which would
    accept 1e400 as inf): the most a cheaper overflow check could win. Best of 5, CPU seconds."""
    from localstate.streams import jsonl

    rng = random.Random(7)
    texts = [json.dumps({"key": f"sensor-{rng.randrange(1000):04d}", "ts": 1_700_000_000 + i,
                         "value": {"t": rng.uniform(-40, 60), "h": rng.random(),
                                   "xyz": [rng.gauss(0, 1) for _ in range(6)]}})
             for i in range(lines)]
    unchecked = json.scanner.make_scanner(json.JSONDecoder(parse_constant=jsonl._DECODER.parse_constant))

    def run(scan) -> float:  # noqa: ANN001
        cpu = time.process_time()
        for text in texts:
            scan(text, 0)
        return time.process_time() - cpu

    best = {"strict (input's decoder)": float("inf"), "C floats, no overflow check": float("inf")}
    for _ in range(5):
        best["strict (input's decoder)"] = min(best["strict (input's decoder)"], run(jsonl._SCAN))
        best["C floats, no overflow check"] = min(best["C floats, no overflow check"], run(unchecked))
    for name, seconds in best.items():
        report.add(f"jsonl decode, float-heavy lines: {name}", lines_per_cpu_s=lines / seconds, cpu_seconds=seconds)
    report.ratio("jsonl decode: unchecked C floats / strict (upper bound of a faster check)",
                 best["strict (input's decoder)"] / best["C floats, no overflow check"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scaling")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--backend", default="rocksdb", choices=["rocksdb", "lmdb", "memory"])
    args = parser.parse_args(argv)
    report = Report("scaling", {"events": args.events, "users": args.users, "master": "local[2]",
                                "backend": args.backend, "repeat": args.repeat})
    correct = True
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        root = Path(tmp)
        data, expected = {}, None
        for partitions in (1, 2):
            data[partitions] = root / f"data-{partitions}"
            data[partitions].mkdir()
            expected = _write_events(data[partitions], args.events, args.users, args.seed, partitions)
        best: dict[int, tuple[float, object, float]] = {}
        for round_ in range(args.repeat):
            for partitions in (1, 2):
                busy0, total0 = _cpu_ticks()
                seconds, summary, ok = _localstate(root / f"run-{partitions}-{round_}", data[partitions], partitions,
                                                   args.backend, args.events, expected, args.users)
                busy1, total1 = _cpu_ticks()
                busy_pct = 100.0 * (busy1 - busy0) / max(1, total1 - total0)
                correct = correct and ok
                if partitions not in best or seconds < best[partitions][0]:
                    best[partitions] = (seconds, summary, busy_pct)
        for partitions in (1, 2):
            seconds, summary, busy_pct = best[partitions]
            report.add(f"localstate run, {partitions} partition(s)", events_per_s=args.events / seconds,
                       seconds=seconds, cpu_busy_pct=busy_pct, correct=correct)
        report.ratio("2 partitions / 1 partition (events/s)", best[1][0] / best[2][0], ">= 1.8")
        for partitions in (1, 2):
            seconds, summary, _ = best[partitions]
            phases = summary.breakdown()  # type: ignore[attr-defined]
            for key, label in _PHASES.items():
                report.add(f"time[{partitions}p]: {label}", phase_s=phases[key],
                           share_pct=100.0 * phases[key] / seconds)
            other = seconds - sum(phases[key] for key in _PHASES)
            report.add(f"time[{partitions}p]: other (driver loop, progress)", phase_s=other,
                       share_pct=100.0 * other / seconds)
        _decode_case(report, 100_000)
        report.notes.append(f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus "
                            "(cpu_busy_pct counts every process of the machine)")
    report.emit(args.json)
    return 0 if correct else 1
