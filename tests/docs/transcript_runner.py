"""Runs the docs' commands for tests/docs/test_transcripts.py, one after the other in this one process,
so that their Spark runs share one JVM (each ``localstate run`` still makes and stops its own
SparkContext, as on the command line; the JVM's start-up is the expensive part).

Reads a JSON list of steps on stdin: ``{"argv", "cwd", "env", "standing", "timeout", "subprocess"}``, and writes a
JSON list of results, ``{"code", "out", "err", "seconds", "stopped"}``, on stdout at the end.

A ``localstate ...`` command runs through ``localstate.tools.cli.main`` (what the console script
calls), ``python X.py ARGS`` through ``runpy`` with ``sys.argv`` set, ``cat FILE`` reads the file;
a step marked ``subprocess`` runs as a process of its own. A *standing* step (a ``localstate run`` without
``--until-drained``) is stopped as a user would: Ctrl-C (SIGINT to this process) once its output has
said it stands, nothing came for :data:`IDLE` seconds and its checkpoints are at the inputs' ends
(``localstate status``'s lag 0); or after its timeout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
from typing import Any

IDLE = 3.0
"""Seconds without a new line of output (the last batch at lag 0) after which a standing run is idle."""


class Capture(io.TextIOBase):
    """A text stream that keeps what is written, and when it was last written to."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.written = time.monotonic()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.parts.append(text)
            self.written = time.monotonic()
        return len(text)

    def text(self) -> str:
        with self.lock:
            return "".join(self.parts)

    def writable(self) -> bool:
        return True


def _caught_up(job_file: str) -> bool:
    """Whether the job's checkpoints are at its inputs' ends (``localstate status``'s lag is 0)."""
    from localstate.core.config import load_job_config
    from localstate.tools.status import job_status

    try:
        return job_status(load_job_config(job_file))["lag"] == 0
    except Exception:  # noqa: BLE001 - a state directory being written: ask again
        return False


def _idle(out: Capture, job_file: str) -> bool:
    """The run stands (it said so), printed nothing for IDLE seconds, and has read everything."""
    if "standing:" not in out.text() or time.monotonic() - out.written < IDLE:
        return False
    return _caught_up(job_file)


def _stop_when_idle(out: Capture, job_file: str, timeout: float, done: threading.Event, stopped: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while not done.wait(1.0):
        if _idle(out, job_file) or time.monotonic() > deadline:
            stopped.append("idle" if time.monotonic() <= deadline else "timeout")
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            return


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1


def _dispatch(argv: list[str], cwd: str, env: dict[str, str], timeout: float,
              alone: bool) -> tuple[int, str | None, str | None]:
    """``(code, out, err)``; out and err None when the step printed to this process's streams."""
    program = os.path.basename(argv[0])
    if alone:
        done = subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    if program == "localstate":
        from localstate.tools.cli import main

        return main(argv[1:]), None, None
    if re.fullmatch(r"python3?(\.\d+)?", program) and len(argv) > 1 and argv[1].endswith(".py"):
        saved = sys.argv
        sys.argv = argv[1:]
        try:
            runpy.run_path(argv[1], run_name="__main__")
        finally:
            sys.argv = saved
        return 0, None, None
    if program == "cat":
        for name in argv[1:]:
            with open(name, encoding="utf-8") as handle:
                sys.stdout.write(handle.read())
        return 0, None, None
    raise ValueError(f"no way to run {argv[0]!r} in this process: mark the step as a subprocess")


def run_step(step: dict[str, Any]) -> dict[str, Any]:
    previous_cwd, saved_env = os.getcwd(), dict(os.environ)
    out, err = Capture(), Capture()
    done, stopped = threading.Event(), []
    started = time.monotonic()
    os.chdir(step["cwd"])
    os.environ.update(step.get("env") or {})
    if step.get("standing"):
        job_file = next(word for word in step["argv"][2:] if not word.startswith("-"))  # localstate run JOB ...
        threading.Thread(target=_stop_when_idle, args=(out, job_file, step["timeout"], done, stopped),
                         daemon=True).start()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code, sub_out, sub_err = _dispatch(step["argv"], step["cwd"], step.get("env") or {}, step["timeout"],
                                                   bool(step.get("subprocess")))
            except SystemExit as exc:
                code, sub_out, sub_err = _exit_code(exc), None, None
            except KeyboardInterrupt:
                code, sub_out, sub_err = 130, None, None
    finally:
        done.set()
        os.chdir(previous_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return {"code": code, "out": out.text() if sub_out is None else sub_out,
            "err": err.text() if sub_err is None else sub_err, "seconds": round(time.monotonic() - started, 2),
            "stopped": stopped[0] if stopped else None}


def main() -> None:
    steps = json.load(sys.stdin)
    real_stdout = sys.stdout
    results = []
    for step in steps:
        result = run_step(step)
        results.append(result)
        print(f"[transcripts] {' '.join(step['argv'])}: exit {result['code']} in {result['seconds']}s",
              file=sys.__stderr__, flush=True)
    real_stdout.write(json.dumps(results))
    real_stdout.flush()


if __name__ == "__main__":
    main()
