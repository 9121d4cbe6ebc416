"""CLI commands of the Spark runtime (``localstate run``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Callable

from localstate.tools.cli import command, load_job, partition_count, positive_int
from localstate.core.config import apply_log_level

__all__ = ["positive_int", "partition_count", "install_stop_handlers", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What stops ``localstate run`` cleanly; the same signal again aborts at once (exit 128 + signal)."""


def install_stop_handlers(runner: Any) -> Callable[[], None]:
    """SIGTERM/SIGINT handlers for a run of ``runner`` (a SparkJobRunner) in this process's main
    thread: the first signal calls ``runner.stop()`` (the running batch completes and is committed,
    or is abandoned after ``runner.stop_grace`` seconds; kept instances are released; the run
    returns), a second one exits at once with 128 + the signal number (nothing uncommitted is ever
    visible, so the state stays exact). Install them after the SparkContext exists: PySpark installs
    its own SIGINT handler (cancel every job, raise KeyboardInterrupt) when it creates one. Returns
    a function that puts the previous handlers back. Library use installs nothing: call
    ``runner.stop()`` yourself."""
    received: list[int] = []

    def say(text: str) -> None:
        # os.write, not print: a handler may run in the middle of the main thread's own print.
        try:
            os.write(2, f"localstate run: {text}\n".encode())
        except OSError:
            pass

    def handle(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if received:
            say(f"{name} again: aborting now (state stays at the last committed batch)")
            os._exit(128 + signum)
        received.append(signum)
        say(f"{name}: stopping (a running batch gets {runner.stop_grace:.0f}s to complete, else it is abandoned; "
            f"{name} again aborts at once)")
        runner.stop()

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


@command("run", "run a job on Spark in micro-batches: standing (waits for new input) until SIGTERM/SIGINT, or "
                "--until-drained")
def run(args: argparse.Namespace) -> int:
    from localstate.runtime.driver.progress import ProgressObserver
    from localstate.runtime.driver.plan import lag_text
    from localstate.runtime.spark.runner import SparkJobRunner

    from localstate.runtime.driver.views import changelog_root, job_dir, stream_location
    from localstate.tools.validation import require_input_paths, require_own_changelogs, spark_notes

    if args.from_savepoint:
        from localstate.tools.statedata import start_from_savepoint

        start_from_savepoint(args)  # a new state epoch, switched to before the run starts
    job = load_job(args)
    # A mistyped input path would otherwise run as an empty input and exit 0.
    require_input_paths(job)
    require_own_changelogs(job)  # else refused later, at the first task, with a misleading message
    runner = SparkJobRunner(job, master=args.master, batch_size=args.batch_size)  # validates [spark]
    for note in spark_notes(job, runner.master):
        print(f"warning: {note}", file=sys.stderr)
    if not getattr(args, "verbose", 0):  # -v/-vv on the command line wins over the job file
        apply_log_level(job)
    print(f"job {job.name!r}: {job.partitions} partition(s) on {runner.master}, state in {job.state_dir}",
          flush=True)
    runner.check_inputs()  # before Spark starts: an input changed under the job fails fast
    observer = ProgressObserver.watch(runner)  # progress.jsonl, the live.json heartbeat, [job] metrics_port
    try:
        if observer.metrics is not None:
            print(f"metrics: http://{job.metrics_host}:{observer.metrics.port}/metrics", flush=True)
        context = runner.context  # first: PySpark installs its SIGINT handler when it makes the context
        restore = install_stop_handlers(runner)
        try:
            if not args.until_drained:
                trigger = f", a batch at most every {runner.trigger:g}s" if runner.trigger else ""
                print(f"standing: waiting for new input when there is none{trigger}; stop with SIGTERM or Ctrl-C "
                      f"(or run with --until-drained)", flush=True)
            summary = runner.run(batches=args.batches, until_drained=args.until_drained)
        finally:
            try:
                context.stop()
            finally:
                restore()
    finally:
        observer.close()
    rate = summary.records_in / summary.seconds if summary.seconds else 0.0
    ended = "stopped" if summary.stopped else "done"
    abandoned = f" (batch {summary.abandoned} abandoned, not committed)" if summary.abandoned is not None else ""
    print(f"{ended}: {summary.batch_count} batch(es){abandoned}, {summary.records_in:,} records in, "
          f"{summary.records_out:,} out, {summary.seconds:.1f}s ({rate:,.0f} rec/s), "
          f"{lag_text(summary.lag, summary.pending_bytes)}", flush=True)
    if runner.cluster and summary.warm_fraction is not None:
        print(f"warm local state: {summary.warm_fraction:.0%} of the tasks with state found it on their executor")
    for name in job.outputs:
        print(f"output {name}: {stream_location(job, 'outputs', name)}")
    logged = sorted(store.changelog for store in job.stores.values() if store.changelog)
    if logged:
        root = changelog_root(job)
        print(f"changelogs: {', '.join(logged)} " + (f"in {root}" if root else f"on {job.changelog_system}"))
    print(f"state: {job_dir(job)} (look at it: localstate inspect {args.job}; start over: "
          f"localstate reset {args.job} --yes)", flush=True)
    return 0


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--master", default=None, help="Spark master (default: [spark] master, else local[*]; "
                        "local masters get 4 task attempts)")
    parser.add_argument("--batches", type=positive_int, default=None, help="stop after N micro-batches (>= 1)")
    parser.add_argument("--until-drained", action="store_true",
                        help="stop once every input is consumed (default: stand, waiting for new input, until "
                             "SIGTERM or SIGINT)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="records per partition per micro-batch (default: [spark] batch_size, else all)")
    from localstate.tools.statedata import add_from_savepoint_arguments

    add_from_savepoint_arguments(parser)


run.arguments = _run_arguments  # type: ignore[attr-defined]
