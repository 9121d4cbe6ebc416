"""``localstate status JOB``: is the job running, what did its last batch do, how far behind is it.

Read-only, like ``inspect``: it reads the job's ``progress/live.json`` and ``progress.jsonl``
(:mod:`localstate.runtime.driver.progress`), its checkpoints and its inputs' ends, and creates, locks or
changes nothing (a job that never ran still has no state directory afterwards). The progress files are
read as hostile input (:mod:`localstate.runtime.driver.operating`): whatever they hold, ``status`` answers,
with what it could not use under ``problems``.

Exit codes: 0 the job is live (a run's heartbeat is recent and its pid alive), 3 it is not (never ran,
stopped, or died) or the files cannot tell (``liveness`` ``unknown``: a damaged or implausible
``live.json``), 1 a localstate error. ``--json`` prints one object for scripts and probes."""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from localstate.core.commit_stats import BOUNDS_MS, CommitStats, Histogram
from localstate.tools.cli import command, load_job
from localstate.errors import LocalStateError

__all__ = ["job_status"]

NOT_LIVE = 3


def job_status(job: Any, *, stale: float | None = None) -> dict[str, Any]:
    """Everything ``status`` shows, as a JSON-able dict (no NaN or infinity, whatever the files hold)."""
    # CLI start-up: --help loads no driver module (progress loads prometheus_client, the views the storage backends)
    from localstate.runtime.driver.operating import LIVE, UNKNOWN, json_safe, judge_live, progress_time
    from localstate.runtime.driver.progress import HEARTBEAT_STALE, progress_directory, read_last_progress, read_live
    from localstate.runtime.driver.views import input_partitions, job_dir, load_checkpoints

    live_file = read_live(job)
    liveness, why = judge_live(live_file, stale=HEARTBEAT_STALE if stale is None else stale)
    last = read_last_progress(job)
    state = job_dir(job)
    out: dict[str, Any] = {
        "job": job.name, "state_dir": str(state), "has_state": state.is_dir(), "live": liveness == LIVE,
        "liveness": liveness, "why": why, "run": live_file.value, "progress_dir": str(progress_directory(job)),
        "last_progress": last.value, "last_batch_age_s": None, "lag": None, "pending_bytes": None,
        "input_partitions": [], "problems": [*live_file.problems, *last.problems],
        "commits": commit_summary(last.value),
    }
    if liveness == UNKNOWN and why in out["problems"]:
        out["problems"].remove(why)  # said once, as the reason
    ended = progress_time(last.value) if last.value is not None else None
    if ended is not None:
        out["last_batch_age_s"] = round(time.time() - ended, 3)
    if not out["has_state"]:
        return json_safe(out)
    try:
        checkpoints = load_checkpoints(job)
        infos = input_partitions(job, checkpoints)
    except LocalStateError as exc:
        out["problems"].append(exc.message)
        return json_safe(out)
    lag = pending = 0
    for info in infos:
        out["input_partitions"].append({"input": info.input, "partition": info.partition, "position": info.position,
                                        "end": info.end, "lag": info.lag, "pending_bytes": info.pending_bytes,
                                        "problem": info.problem})
        lag += info.lag or 0
        pending += info.pending_bytes
        if info.problem:
            out["problems"].append(_headed(f"input {info.input!r} partition {info.partition}", info.problem))
    out["lag"], out["pending_bytes"] = lag, pending
    return json_safe(out)


def commit_summary(progress: Any) -> dict[str, Any] | None:
    """A continuous run's commits in its last progress report (its ``commits``, read as hostile: None
    if absent or unsound): how many, and of their durations and their oldest records' waits
    (:class:`~localstate.core.commit_stats.CommitStats`) the mean and the p50 and p99, each the upper
    bound of the bucket it falls in (milliseconds; None above the last bound or with nothing counted)."""
    stats = CommitStats.from_progress(progress.get("commits")) if isinstance(progress, dict) else None
    if stats is None:
        return None
    return {"count": stats.commits, "commit_ms": _figures(stats.commit), "latency_ms": _figures(stats.latency)}


def _figures(histogram: Histogram) -> dict[str, Any]:
    mean = histogram.mean()
    return {"count": histogram.count, "mean": None if mean is None else round(mean, 3),
            "p50": histogram.quantile(0.5), "p99": histogram.quantile(0.99)}


def _figures_text(figures: dict[str, Any]) -> str:
    def bound(ms: Any) -> str:
        return f"> {BOUNDS_MS[-1]:g} ms" if ms is None or ms == math.inf else f"<= {ms:g} ms"

    return f"mean {figures['mean']:.1f} ms (p50 {bound(figures['p50'])}, p99 {bound(figures['p99'])})"


_SAYS = {"live": "LIVE", "not_live": "not running", "unknown": "unknown (treat as not running)"}


def _headed(heading: str, message: str) -> str:
    """``heading: message``, unless the message already starts with that heading (an input's own
    errors name their input and partition)."""
    return message if message.startswith(heading) else f"{heading}: {message}"


def _print(status: dict[str, Any]) -> None:
    # CLI start-up: --help loads no driver module (progress loads prometheus_client)
    from localstate.runtime.driver.plan import lag_text
    from localstate.runtime.driver.progress import describe_reason

    print(f"job {status['job']!r}: {_SAYS[status['liveness']]} ({_printable(status['why'])})")
    if not status["has_state"]:
        print(f"no state in {status['state_dir']}: the job has not run with this state directory")
        return
    run = status["run"] or {}
    if run.get("started") is not None:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["started"]))
        print(f"run {run.get('run_id') or '?'}: pid {run.get('pid', '?')} on {run.get('host', '?')}, started {started}")
    last = status["last_progress"]
    if last is None:
        print("no batch recorded yet")
    else:
        age = status["last_batch_age_s"]
        print(f"last batch {last['batch']} at {last['timestamp']} ({age:.0f}s ago): "
              f"in {last['rows_in']:,} out {last['rows_out']:,} in {last['duration_ms'] / 1000:.2f}s, "
              f"then {lag_text(last['lag'], last.get('pending_bytes', 0))}"
              + (f", {last['failed_attempts']} failed attempt(s) retried" if last.get("failed_attempts") else ""))
        for reason in last.get("failed_attempt_reasons") or []:
            print(f"  failed attempt: {_printable(describe_reason(reason))}")
        for kind, what in (("late_records", "window store {!r} dropped {:,} late record(s)"),
                           ("misrouted", "input {!r} had {:,} misrouted record(s)")):
            counts = last.get(kind)
            for label, n in sorted(counts.items()) if isinstance(counts, dict) else ():
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    print(f"  {what.format(_printable(str(label)), n)} in it")
        commits = status.get("commits")
        if commits is not None and commits["count"]:
            print(f"  {commits['count']:,} commit(s): commit time {_figures_text(commits['commit_ms'])}"
                  + (f"; oldest record's wait {_figures_text(commits['latency_ms'])}"
                     if commits["latency_ms"]["count"] else ""))
    if status["lag"] is not None:
        print(f"now: {lag_text(status['lag'], status['pending_bytes'] or 0)}")
        for info in status["input_partitions"]:
            lag = "-" if info["lag"] is None else f"{info['lag']:,}"
            print(f"  {info['input']}[{info['partition']}]: position {info['position']}, end {info['end']}, lag {lag}"
                  + (f", {info['pending_bytes']:,} bytes unterminated" if info["pending_bytes"] else ""))
    for problem in status["problems"]:
        print(f"problem: {_printable(problem)}")


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on (escape sequences, other control characters) shown
    escaped: it may come from a damaged file."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _stale(text: str) -> float:
    """argparse type of ``--stale``: seconds, a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


@command("status", "is a job running, its last batch and its lag, read-only (exit 0 live, 3 not live)")
def status(args: argparse.Namespace) -> int:
    job = load_job(args)
    found = job_status(job, stale=args.stale)
    if args.json:
        print(json.dumps(found, sort_keys=True, allow_nan=False))
    else:
        _print(found)
    return 0 if found["live"] else NOT_LIVE


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--json", action="store_true", help="one JSON object (for scripts and liveness probes)")
    parser.add_argument("--stale", type=_stale, default=None, metavar="SECONDS",
                        help="a heartbeat older than this is not live (default 30)")


status.arguments = _status_arguments  # type: ignore[attr-defined]
