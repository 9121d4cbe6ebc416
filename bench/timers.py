"""Timer benchmark: register and fire N event-time timers through a task partition's timer service
(``context.timers``: the logged timer store, committed), next to N puts into a kv store of the same
partition and backend (committed) measured in the same run, for each backend and timer key serde.

    python -m bench timers [--json] [--quick] [--timers N] [--backend rocksdb|lmdb|all]
                           [--key-serde json|string|all]

A timer counts once for its registration, its firing (scan, delete, ``on_timer``) and its share of
the commits; a put once for itself and its share of the commit. Rounds alternate the two sides on
fresh keys; each side's best round counts. Each (backend, key serde) pair is measured in its own
partition, its puts alongside: a ratio compares figures of the same minutes.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.report import Report, timed

__all__ = ["main"]


def _task_class() -> type:
    from localstate.core.task import StreamTask

    class Fired(StreamTask):
        """Counts the firings (the cheapest on_timer a task can have)."""

        fired = 0

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def on_timer(self, key: Any, timestamp: float, collector: Any, coordinator: Any) -> None:
            self.fired += 1

    return Fired


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench timers")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="smaller run (200k timers)")
    parser.add_argument("--timers", type=int, default=None, help="timers (and puts) per measurement (default 1M)")
    parser.add_argument("--backend", default="all", choices=("rocksdb", "lmdb", "all"),
                        help="backend of both stores (all: each in turn)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each side is kept")
    parser.add_argument("--key-serde", default="all", choices=("json", "string", "all"),
                        help="the timer key serde, json being the default (the kv store's keys are strings)")
    args = parser.parse_args(argv)

    n = args.timers or (200_000 if args.quick else 1_000_000)
    backends = ("rocksdb", "lmdb") if args.backend == "all" else (args.backend,)
    serdes = ("json", "string") if args.key_serde == "all" else (args.key_serde,)
    report = Report("timers", params={"timers": n, "rounds": args.rounds, "backends": list(backends),
                                      "changelog": "file", "commit_every": COMMIT_EVERY,
                                      "timer_key_serdes": list(serdes)})
    rng = random.Random(5)
    keys = [f"user-{i}" for i in range(n)]
    stamps = [1.7e9 + rng.uniform(0, 86_400) for _ in range(n)]  # a day of event time, in random order
    for backend in backends:
        for serde in serdes:
            _measure(report, backend, serde, keys, stamps, args.rounds)
    report.emit(args.json)
    return 0


COMMIT_EVERY = 100_000


def _measure(report: Report, backend: str, serde: str, keys: list[str], stamps: list[float], rounds: int) -> None:
    """One (backend, key serde) pair: its rows and its ratio, from rounds alternating puts and timers."""
    from localstate.core.config import parse_job_config
    from localstate.runtime.layout import open_changelog_system
    from localstate.runtime.partition.instance import TaskInstance

    n, commit_every = len(keys), COMMIT_EVERY
    task = _task_class()
    with tempfile.TemporaryDirectory(prefix="bench-timers-") as tmp:
        job = parse_job_config({
            "job": {"name": "bench-timers", "task": "unused:Unused", "state_dir": tmp, "commit_interval": 10 ** 9},
            "time": {"timers": True, "timer_backend": backend, "timer_key_serde": serde},
            "stores": {"counts": {"engine": "kv", "backend": backend, "key_serde": "string",
                                  "value_serde": "int"}}}, base_dir=Path(tmp))
        changelogs = open_changelog_system(job)
        instance = TaskInstance(job, 0, changelogs, task_factory=task)
        instance.open()
        try:
            store, timers = instance.stores["counts"].engine, instance.time
            best = {"put": float("inf"), "register": float("inf"), "fire": float("inf")}
            # Rounds alternate the two sides, each on fresh keys, and the best of each is kept: on a
            # shared machine the load changes during a run, and both sides should see the same.
            for round_ in range(rounds):
                names = [f"r{round_}-{key}" for key in keys]
                with timed() as puts:
                    for start in range(0, n, commit_every):
                        put = store.put
                        for i in range(start, min(n, start + commit_every)):
                            put(names[i], i)
                        instance.commit()
                with timed() as registering:
                    for start in range(0, n, commit_every):
                        register = timers.register_event_time
                        for i in range(start, min(n, start + commit_every)):
                            register(names[i], stamps[i] + round_ * 86_400)
                        instance.commit()
                instance.task.fired = 0  # type: ignore[union-attr]
                with timed() as firing:
                    timers.advance_watermark(max(stamps) + round_ * 86_400)
                    fired = instance.fire_timers()
                    instance.commit()
                assert fired == n == instance.task.fired, (fired, n)  # type: ignore[union-attr]
                for phase, seconds in (("put", puts), ("register", registering), ("fire", firing)):
                    best[phase] = min(best[phase], seconds["seconds"])
            put_rate = n / best["put"]
            total = best["register"] + best["fire"]
            timer_rate = n / total
            where = f"{backend}, {serde} keys"
            report.add(f"kv put + commit ({backend}, beside {serde} keys)", ops_per_s=round(put_rate), seconds=round(best["put"], 3))
            report.add(f"timers register + commit ({where})", ops_per_s=round(n / best["register"]),
                       seconds=round(best["register"], 3))
            report.add(f"timers fire (scan, delete, on_timer) + commit ({where})", ops_per_s=round(n / best["fire"]),
                       seconds=round(best["fire"], 3))
            report.add(f"timers register + fire ({where})", ops_per_s=round(timer_rate), seconds=round(total, 3))
        finally:
            instance.close(commit=False)
            changelogs.close()
    report.ratio(f"timers register+fire / kv put ({where})", timer_rate / put_rate, target=">= 0.3")
