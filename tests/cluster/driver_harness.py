"""The driver of the cluster tests, in a process of its own (one SparkContext per process): it
runs a job on the standalone cluster step by step, as the test asks on stdin, one JSON command a
line, and answers each with one ``RESULT <json>`` line on stdout:

* ``{"run": n}``: run up to ``n`` batches (``SparkJobRunner.run(batches=n)``), answer with the
  summary (records, lag, tasks, warm tasks, failed attempts and their reasons, restored and trimmed
  records);
* ``{"executors": k, "timeout": s}``: wait until ``k`` executors are alive, answer with their ids;
* ``{"stop": true}``: stop Spark and exit.
A failed run answers ``{"error": type, "message": text}``.
"""

from __future__ import annotations

import json
import sys
import time

from localstate.core.config import load_job_config
from localstate.runtime.spark.cluster import Placement
from localstate.runtime.spark.runner import SparkJobRunner


def _answer(payload: dict) -> None:
    print("RESULT " + json.dumps(payload), flush=True)


def main(job_file: str, batch_size: int) -> None:
    job = load_job_config(job_file)
    runner = SparkJobRunner(job, batch_size=batch_size, progress=lambda line: print(line, flush=True))
    placement = Placement(runner.context)
    for line in sys.stdin:
        command = json.loads(line)
        if "run" in command:
            try:
                summary = runner.run(batches=int(command["run"]))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                _answer({"error": type(exc).__name__, "message": str(exc)})
                continue
            _answer({"batches": len(summary.batches), "records_in": summary.records_in, "lag": summary.lag,
                     "tasks": sum(b.tasks for b in summary.batches),
                     "stateful": sum(b.stateful for b in summary.batches),
                     "warm": sum(b.warm for b in summary.batches), "warm_fraction": summary.warm_fraction,
                     "failed_attempts": sum(b.failed_attempts for b in summary.batches),
                     "reasons": [r for b in summary.batches for r in b.failed_attempt_reasons],
                     "replayed": sum(b.replayed for b in summary.batches),
                     "trimmed": sum(b.trimmed for b in summary.batches),
                     "homes": {str(p): list(h) for p, h in (runner.placement.homes.items()
                                                            if runner.placement else [])}})
        elif "executors" in command:
            deadline = time.monotonic() + float(command.get("timeout", 120))
            while len(placement.live_executors()) < int(command["executors"]) and time.monotonic() < deadline:
                time.sleep(0.5)
            _answer({"executors": placement.live_executors()})
        elif command.get("stop"):
            runner.context.stop()
            _answer({"stopped": True})
            return


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
