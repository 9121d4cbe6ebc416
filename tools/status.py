"""``localstate status JOB``: is the job running, what did its last batch do, how far behind is it.

Read-only, like ``inspect``: it reads the job's ``progress/live.json`` and ``progress.jsonl``
(:mod:`localstate.runtime.driver.progress`), its checkpoints and its inputs' ends, and creates, locks or
changes nothing (a job that never ran still has no state directory afterwards).

Exit codes: 0 the job is live (a run's heartbeat is recent and its pid alive), 3 it is not (never ran,
stopped, or died), 1 a localstate error. ``--json`` prints one object for scripts and probes."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from localstate.tools.cli import command, load_job

__all__ = ["job_status"]

NOT_LIVE = 3


def job_status(job: Any, *, stale: float | None = None) -> dict[str, Any]:
    """Everything ``status`` shows, as a JSON-able dict."""
    from localstate.errors import LocalStateError
    from localstate.runtime.driver.progress import HEARTBEAT_STALE, is_live, progress_directory, read_last_progress, read_live
    from localstate.runtime.driver.views import input_partitions, job_dir, load_checkpoints

    live_file = read_live(job)
    live, why = is_live(live_file, stale=HEARTBEAT_STALE if stale is None else stale)
    last = read_last_progress(job)
    state = job_dir(job)
    out: dict[str, Any] = {
        "job": job.name, "state_dir": str(state), "has_state": state.is_dir(), "live": live, "why": why,
        "run": live_file, "progress_dir": str(progress_directory(job)), "last_progress": last,
        "last_batch_age_s": None, "lag": None, "pending_bytes": None, "input_partitions": [], "problems": [],
    }
    if last is not None and last.get("timestamp"):
        from datetime import datetime

        ended = datetime.fromisoformat(last["timestamp"].replace("Z", "+00:00")).timestamp()
        out["last_batch_age_s"] = round(time.time() - ended, 3)
    if not out["has_state"]:
        return out
    try:
        checkpoints = load_checkpoints(job)
        infos = input_partitions(job, checkpoints)
    except LocalStateError as exc:
        out["problems"].append(exc.message)
        return out
    lag = pending = 0
    for info in infos:
        out["input_partitions"].append({"input": info.input, "partition": info.partition, "position": info.position,
                                        "end": info.end, "lag": info.lag, "pending_bytes": info.pending_bytes,
                                        "problem": info.problem})
        lag += info.lag or 0
        pending += info.pending_bytes
        if info.problem:
            out["problems"].append(f"input {info.input!r} partition {info.partition}: {info.problem}")
    out["lag"], out["pending_bytes"] = lag, pending
    return out


def _print(status: dict[str, Any]) -> None:
    from localstate.runtime.driver.progress import describe_reason
    from localstate.runtime.driver.plan import lag_text

    print(f"job {status['job']!r}: {'LIVE' if status['live'] else 'not running'} ({status['why']})")
    if not status["has_state"]:
        print(f"no state in {status['state_dir']}: the job has not run with this state directory")
        return
    run = status["run"] or {}
    if run.get("started"):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"]))
        print(f"run {run.get('run_id') or '?'}: pid {run.get('pid')} on {run.get('host')}, started {started}")
    last = status["last_progress"]
    if last is None:
        print("no batch recorded yet")
    else:
        print(f"last batch {last['batch']} at {last['timestamp']} ({status['last_batch_age_s']:.0f}s ago): "
              f"in {last['rows_in']:,} out {last['rows_out']:,} in {last['duration_ms'] / 1000:.2f}s, "
              f"then {lag_text(last['lag'], last.get('pending_bytes', 0))}"
              + (f", {last['failed_attempts']} failed attempt(s) retried" if last.get("failed_attempts") else ""))
        for reason in last.get("failed_attempt_reasons") or []:
            print(f"  failed attempt: {describe_reason(reason)}")
    if status["lag"] is not None:
        print(f"now: {lag_text(status['lag'], status['pending_bytes'] or 0)}")
        for info in status["input_partitions"]:
            lag = "-" if info["lag"] is None else f"{info['lag']:,}"
            print(f"  {info['input']}[{info['partition']}]: position {info['position']}, end {info['end']}, lag {lag}"
                  + (f", {info['pending_bytes']:,} bytes unterminated" if info["pending_bytes"] else ""))
    for problem in status["problems"]:
        print(f"problem: {problem}")


@command("status", "is a job running, its last batch and its lag, read-only (exit 0 live, 3 not live)")
def status(args: argparse.Namespace) -> int:
    job = load_job(args)
    found = job_status(job, stale=args.stale)
    if args.json:
        print(json.dumps(found, sort_keys=True))
    else:
        _print(found)
    return 0 if found["live"] else NOT_LIVE


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--json", action="store_true", help="one JSON object (for scripts and liveness probes)")
    parser.add_argument("--stale", type=float, default=None, metavar="SECONDS",
                        help="a heartbeat older than this is not live (default 30)")


status.arguments = _status_arguments  # type: ignore[attr-defined]
