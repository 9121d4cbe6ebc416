"""CLI commands of the Spark runtime (``localstate run``)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from typing import Any

from localstate.tools.cli import command, partition_count, positive_int
from localstate.core.config import apply_log_level
from localstate.runtime.layout import resolve_epoch
from localstate.tools.statedata import add_from_savepoint_arguments, start_from_savepoint
from localstate.tools.validation import require_valid

log = logging.getLogger(__name__)

__all__ = ["positive_int", "partition_count", "install_stop_handlers", "StopSignals", "STOP_SIGNALS", "DUMP_SIGNAL",
           "ignore_hangups"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What stops ``localstate run`` cleanly (exit 0): no new batch, the batch in flight gets a grace period
(``StopControl.grace`` seconds) to complete and be committed. SIGHUP is one of them: a service manager or a terminal that
hangs up means "stop", and re-reading job.toml under a running job (nginx's reload) could change what
its committed state means. A second one of them stops faster (exit 128 + its number): the batch in
flight is abandoned, nothing of it committed; a third exits at once."""

DUMP_SIGNAL = signal.SIGQUIT
"""What stops ``localstate run`` at once with a diagnostic dump (exit 131): every Python thread's stack
on stderr (``faulthandler``), then exit without waiting for anything. Nothing committed is lost: what
was not committed is rolled back and runs again at the next start."""


class StopSignals:
    """The signal handlers of a standing run of ``runner`` (a SparkJobRunner) in this process's main
    thread: :data:`STOP_SIGNALS` call ``runner.stop()`` (the first), ``runner.stop(force=True)`` (the
    second), or exit at once (the third); :data:`DUMP_SIGNAL` dumps the Python stacks and exits at
    once. Each says what it does on stderr. :meth:`install` may be called again to take the handlers
    back (PySpark installs its own SIGINT handler when it creates a SparkContext); calling the object
    (or :meth:`restore`) puts the previous handlers back. :attr:`exit_code` is what the run should exit
    with: 0, or 128 + the signal that forced the stop."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.received: list[int] = []
        self.forced_by: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        return 128 + self.forced_by if self.forced_by is not None else 0

    def install(self) -> "StopSignals":
        for sig in STOP_SIGNALS:
            self._keep(sig, signal.signal(sig, self._stop))
        self._keep(DUMP_SIGNAL, signal.signal(DUMP_SIGNAL, self._dump))
        return self

    def _keep(self, sig: int, previous: Any) -> None:
        if sig not in self._previous:
            self._previous[sig] = previous

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    __call__ = restore

    @staticmethod
    def say(text: str) -> None:
        # os.write, not print: a handler may run in the middle of the main thread's own print; and the
        # terminal may be gone (a hang-up): then there is nobody to tell.
        try:
            os.write(2, f"localstate run: {text}\n".encode())
        except OSError:
            pass

    def _stop(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(signum)
        if len(self.received) == 1:
            self.say(f"{name}: stopping (no new batch; the batch in flight gets {self.runner.stop_control.grace:.0f}s to "
                     f"complete and be committed, else it is abandoned; {name} again stops at once)")
            self.runner.stop()
        elif len(self.received) == 2:
            self.forced_by = signum
            self.say(f"{name} again: stopping now (the batch in flight, if any, is abandoned: nothing of it is "
                     f"committed, it runs again at the next start; {name} once more exits without waiting for "
                     f"Spark)")
            self.runner.stop(force=True)
        else:
            self.say(f"{name} a third time: exiting (state stays at the last committed batch)")
            os._exit(128 + signum)

    def _dump(self, signum: int, frame: Any) -> None:
        self.say("SIGQUIT: exiting at once, after the stacks of this process's Python threads (state stays at the "
                 "last committed batch; what was not committed runs again at the next start)")
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(128 + signum)


def install_stop_handlers(runner: Any) -> StopSignals:
    """:class:`StopSignals` for ``runner``, installed. Install them (again) after the SparkContext
    exists: PySpark installs its own SIGINT handler (cancel every job, raise KeyboardInterrupt) when it
    creates one. The object returned, called, puts the previous handlers back. Library use installs
    nothing: call ``runner.stop()`` yourself."""
    return StopSignals(runner).install()


def ignore_hangups(context: Any) -> None:
    """Make the SparkContext's JVM ignore SIGHUP: a terminal that hangs up signals its whole foreground
    process group, and the JVM's default (exit) would fail the batch in flight that the driver's clean
    stop waits for. (PySpark already starts it ignoring SIGINT, for Ctrl-C.) The JVM still ends with
    the driver: it exits when its standard input closes."""
    try:
        jvm_signal = context._jvm.sun.misc.Signal  # noqa: SLF001 - the context's own py4j view of its JVM
        jvm_signal.handle(jvm_signal("HUP"), context._jvm.sun.misc.SignalHandler.SIG_IGN)  # noqa: SLF001
    except Exception:  # noqa: BLE001 - a JVM without sun.misc.Signal: a hang-up then ends it, as before
        log.debug("cannot make the JVM ignore SIGHUP", exc_info=True)


@command("run", "run a job on Spark in micro-batches: standing (waits for new input) until SIGTERM, SIGINT or "
                "SIGHUP, or --until-drained")
def run(args: argparse.Namespace) -> int:
    # CLI start-up: --help loads no driver module (the runner loads pyspark, progress prometheus_client, the
    # views the storage backends)
    from localstate.runtime.driver.plan import summary_line
    from localstate.runtime.driver.progress import ProgressObserver
    from localstate.runtime.spark.continuous import runner_for
    from localstate.runtime.driver.views import changelog_root, job_dir, stream_location

    # Everything `localstate validate` checks, before Spark starts, every problem at once and in its
    # words; only what depends on the inputs' contents waits for the plan (runner.check_inputs).
    checked = require_valid(args.job, plugins=args.plugins, master=args.master).job
    if args.from_savepoint:
        start_from_savepoint(args)  # a new state epoch, switched to before the run starts
    job = resolve_epoch(checked)  # the job bound to its current state epoch (docs/state-as-data.md)
    runner = runner_for(job, master=args.master, batch_size=args.batch_size, progress=_say)
    if not getattr(args, "verbose", 0):  # -v/-vv on the command line wins over the job file
        apply_log_level(job)
    signals = StopSignals(runner).install()  # from here on, a signal stops the run (Spark starting or not)
    _say(f"job {job.name!r}: {job.partitions} partition(s) on {runner.master}, state in {job.state_dir}")
    runner.check_inputs()  # before Spark starts: an input changed under the job fails fast
    try:
        observer = ProgressObserver.watch(runner)  # progress.jsonl, the live.json heartbeat, [job] metrics_port
        try:
            if observer.metrics is not None:
                _say(f"metrics: http://{job.metrics_host}:{observer.metrics.port}/metrics")
            context = runner.context
            signals.install()  # again: PySpark installs its SIGINT handler when it makes the context
            ignore_hangups(context)
            try:
                if runner.spark.continuous:
                    _say(f"continuous: long-running tasks follow the inputs, epochs of {runner.spark.epoch:g}s")
                if not args.until_drained:
                    trigger = f", a batch at most every {runner.trigger:g}s" if runner.trigger and not \
                        runner.spark.continuous else ""
                    _say(f"standing: waiting for new input when there is none{trigger}; stop with SIGTERM, SIGINT "
                         f"(Ctrl-C) or SIGHUP (or run with --until-drained)")
                summary = runner.run(batches=args.batches, until_drained=args.until_drained)
            finally:
                context.stop()
        finally:
            observer.close()
    finally:
        signals.restore()
    _say(summary_line(summary))
    if runner.cluster and summary.warm_fraction is not None:
        _say(f"warm local state: {summary.warm_fraction:.0%} of the tasks with state found it on their executor")
    for name in job.outputs:
        _say(f"output {name}: {stream_location(job, 'outputs', name)}")
    logged = sorted(store.changelog for store in job.stores.values() if store.changelog)
    if logged:
        root = changelog_root(job)
        _say(f"changelogs: {', '.join(logged)} " + (f"in {root}" if root else f"on {job.changelog_system}"))
    _say(f"state: {job_dir(job)} (look at it: localstate inspect {args.job}; start over: "
         f"localstate reset {args.job} --yes)")
    return signals.exit_code


def _say(text: str) -> None:
    """Print a line of the run's report. Standard output may be a terminal that hung up (SIGHUP):
    then nobody reads it, and the rest of the output goes to /dev/null rather than failing the run (or
    Python's last flush) with EIO."""
    try:
        print(text, flush=True)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--master", default=None, help="Spark master (default: [spark] master, else local[*]; "
                        "local masters get 4 task attempts)")
    parser.add_argument("--batches", type=positive_int, default=None, help="stop after N micro-batches (>= 1)")
    parser.add_argument("--until-drained", action="store_true",
                        help="stop once every input is consumed (default: stand, waiting for new input, until "
                             "SIGTERM, SIGINT or SIGHUP)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="records per partition per micro-batch (default: [spark] batch_size, else all)")
    add_from_savepoint_arguments(parser)


run.arguments = _run_arguments  # type: ignore[attr-defined]
