"""What a failed Spark task reports: the Python exception, never Py4J's Java stack.

Executor side, :func:`executor_failure` sorts a failure of :func:`~localstate.runtime.spark.runner.run_partition`:

* deterministic (the task's own bug, bad input or config, a RecursionError or OverflowError anywhere):
  a retry would fail the same way, so it becomes a typed, picklable LocalStateError carrying the
  formatted Python traceback, which the task *returns* to the driver (no Spark retry burnt);
* possibly transient (an OSError such as ENOSPC or EIO, MemoryError, a fenced instance, an
  unavailable changelog or output): re-raised, so that Spark retries the task.

Driver side, :func:`spark_failure` turns what is left, a Py4JJavaError after Spark's retries (a
re-raised transient error, a worker that died, an error before localstate's code ran), into a typed
error, taking the Python traceback out of the Java exception's text.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import socket
import traceback
from pathlib import Path
from typing import Any, Iterable, Mapping
from localstate import errors
from localstate.core.tracebacks import attach, describe, describe_frames
from localstate.errors import (ChangelogError, CheckpointError, ConfigError, ExecutorError, FencedError, InputError,
                               LocalStateError, OutputError, PluginError, RestoreError, SerdeError, StoreError,
                               TaskError)

__all__ = ["executor_failure", "spark_failure", "python_error", "python_traceback", "RETRYABLE",
           "record_failed_attempt", "failed_attempt_reasons", "log_failed_attempts", "attempt_error",
           "merge_attempt_reasons"]

log = logging.getLogger(__name__)

RETRYABLE: tuple[type[BaseException], ...] = (OSError, MemoryError, FencedError, ChangelogError, CheckpointError,
                                             RestoreError, OutputError)
"""Failures a new attempt may not meet again: Spark retries the task. A StoreError is retried too,
unless it is a misuse by the task (raised through the task's code, see :func:`_deterministic`)."""

_HINT = ("state stays at the last committed batch; fix the cause and run again (a retry of the batch "
         "would fail the same way)")


def _deterministic(exc: BaseException) -> bool:
    if isinstance(exc, (TaskError, InputError, ConfigError, PluginError, SerdeError)):
        return True
    if isinstance(exc, StoreError):
        return exc.traceback is not None  # misused by the task: it came through the task's own code
    return not isinstance(exc, RETRYABLE)


def executor_failure(exc: BaseException, batch: int, partition: int) -> bytes:
    """The pickled typed error to return to the driver for ``exc``, or re-raise ``exc`` for Spark
    to retry."""
    if not _deterministic(exc):
        raise exc
    if isinstance(exc, LocalStateError):
        # Its message says what is wrong; it carries a traceback already if it came through the
        # task's code (localstate's own frames would only hide that, e.g. for a bad input record).
        error = exc
        error.context.setdefault("batch", batch)
        error.args = (error._render(),)
    else:
        trace = describe(exc)
        error = attach(ExecutorError(f"Spark task of partition {partition} raised {trace.headline}", hint=_HINT,
                                     partition=partition, batch=batch), trace)
    try:
        return pickle.dumps(error)
    except Exception:  # noqa: BLE001 - e.g. a task's own LocalStateError subclass with unpicklable state
        fallback = ExecutorError(str(error), partition=partition, batch=batch)
        fallback.traceback, fallback.traceback_summary = error.traceback, error.traceback_summary
        return pickle.dumps(fallback)


# -- driver side: a Py4JJavaError's text ------------------------------------------------------
_TRACEBACK = "Traceback (most recent call last):"
_JAVA_FRAME = re.compile(r"^\s+at [\w$.<>/]+\(.*\)\s*$")
_FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+), in (?P<name>.+)$')
_JAVA_CLASS = re.compile(r"\b(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable)\b:?\s*")
# Spark 4 appends the error class's state (one per wrapping exception) to the Python text, and a
# streaming query's failure its description: neither is part of the Python error.
_SQLSTATE = re.compile(r"^\s*(SQLSTATE: \w+\s*)+$")
_QUERY_DESCRIPTION = "=== Streaming Query ==="
_ATTEMPTS = re.compile(r"failed (\d+) times")


def python_traceback(text: str) -> str | None:
    """The first Python traceback in a Spark error's text (what a PythonException carries), without
    the Java frames that follow it; None if there is none."""
    start = text.find(_TRACEBACK)
    if start < 0:
        return None
    lines = []
    for line in text[start:].splitlines():
        if _JAVA_FRAME.match(line) or _SQLSTATE.match(line) or \
                line.startswith(("Driver stacktrace:", "Caused by: ", _QUERY_DESCRIPTION)):
            break
        lines.append(line)
    return "\n".join(lines).rstrip() + "\n"


def _parse(python: str) -> tuple[list[traceback.FrameSummary], str, str]:
    """Frames, exception type name and message of the last (outermost raised) traceback in ``python``."""
    last = python[python.rfind(_TRACEBACK) + len(_TRACEBACK):].splitlines()[1:]
    frames: list[traceback.FrameSummary] = []
    rest: list[str] = []
    for index, line in enumerate(last):
        match = _FRAME.match(line)
        if match:
            frames.append(traceback.FrameSummary(match["file"], int(match["line"]), match["name"], line=None))
        elif line.startswith("    ") and frames and frames[-1].line is None and line.strip("^~ "):
            frame = frames[-1]
            frames[-1] = traceback.FrameSummary(frame.filename, frame.lineno, frame.name, line=line.strip())
        elif not line.startswith("  "):
            rest = last[index:]
            break
    exception = "\n".join(rest).strip()
    head, _, message = exception.partition(": ")
    if not re.fullmatch(r"[\w.]+", head):
        head, message = "Error", exception
    return frames, head, message


def _typed(type_name: str) -> type[LocalStateError]:
    """The localstate error class named ``type_name`` (``localstate.errors.FencedError``), else ExecutorError."""
    module, _, name = type_name.rpartition(".")
    cls = getattr(errors, name, None) if module in ("", "localstate.errors") else None
    return cls if isinstance(cls, type) and issubclass(cls, LocalStateError) else ExecutorError


def spark_failure(exc: BaseException, batch: int) -> LocalStateError:
    """The typed error for a Spark job that failed after its retries (``exc``: a Py4JJavaError or
    whatever PySpark raised), made of its Python traceback; no Java frame in its message."""
    text = str(exc)
    attempts = _ATTEMPTS.search(text)
    tried = f" after {attempts[1]} attempt(s)" if attempts else ""
    python = python_traceback(text)
    if python is None:  # the worker died (killed, out of memory, a crash in native code), or Spark itself failed
        reason = _java_reason(text) or type(exc).__name__
        return ExecutorError(f"Spark batch {batch} failed{tried}: {reason}", batch=batch,
                             hint="a Python worker that dies (killed, out of memory, a crash in native code) is "
                                  "retried by Spark; it died every time. State stays at the last committed batch: "
                                  "check the executors' memory and logs, then run again")
    frames, type_name, message = _parse(python)
    trace = describe_frames(frames, type_name.rpartition(".")[2] or type_name, message, python)
    cls = _typed(type_name)
    if cls is ExecutorError:
        error: LocalStateError = ExecutorError(f"Spark batch {batch} failed{tried}: {trace.headline}", batch=batch,
                                               hint="state stays at the last committed batch; fix the cause and "
                                                    "run again")
    else:
        # A localstate error re-raised for Spark to retry: keep its type (callers catch e.g. FencedError);
        # its text already holds its context and hint.
        error = _rebuilt(cls, f"Spark batch {batch} failed{tried}: {message}")
    return attach(error, trace)


def python_error(exc: BaseException) -> LocalStateError | None:
    """The localstate error whose Python traceback a Spark error's text holds (e.g. raised by a Python
    data source while Spark planned a query), rebuilt with its type and message; None if the text
    holds no localstate error."""
    python = python_traceback(str(exc))
    if python is None:
        return None
    frames, type_name, message = _parse(python)
    cls = _typed(type_name)
    if cls is ExecutorError and type_name.rpartition(".")[2] != "ExecutorError":
        return None  # not a localstate error (an ExecutorError itself, e.g. run_batch's, is one)
    trace = describe_frames(frames, type_name.rpartition(".")[2] or type_name, message, python)
    return attach(_rebuilt(cls, message), trace)


def _rebuilt(cls: type[LocalStateError], text: str) -> LocalStateError:
    """An error of ``cls`` whose text (context and hint already rendered in) is ``text``."""
    error = cls.__new__(cls)
    LocalStateError.__init__(error, text)
    error.context = {}
    return error


def _java_reason(text: str) -> str | None:
    """The failure's reason from a Java exception's text, without Java class names or frames."""
    for marker in ("most recent failure:", "Job aborted due to stage failure:"):
        at = text.find(marker)
        if at >= 0:
            line = text[at + len(marker):].splitlines()[0]
            line = line.split("): ", 1)[1] if "): " in line else line  # "Lost task 0.3 in stage 1.0 (TID 7) (host ...): "
            reason = _JAVA_CLASS.sub("", line).strip()
            return reason or None
    # Spark itself failed (a stopped context, a lost executor...): its first line that is no frame.
    for line in text.splitlines():
        if line.strip() and not _JAVA_FRAME.match(line) and not line.startswith("An error occurred while calling"):
            reason = _JAVA_CLASS.sub("", line.lstrip(": ")).strip()
            if reason:
                return reason[:500]
    return None


# -- failed task attempts: why each one failed ------------------------------------------------------
_MESSAGE_LIMIT = 500


def record_failed_attempt(directory: str, batch: int, partition: int | None, attempt: int,
                          exc: BaseException) -> None:
    """Executor side, local masters: before an attempt re-raises ``exc`` for Spark to retry, leave its
    reason for the driver in ``directory`` (one small JSON file per attempt, written aside and renamed),
    which reads and deletes it after the batch (:func:`failed_attempt_reasons`). Never raises: the
    attempt's own error is what matters."""
    if not directory:
        return
    try:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = {"batch": batch, "partition": partition, "attempt": attempt, "type": type(exc).__name__,
                  "message": message[:_MESSAGE_LIMIT], "host": socket.gethostname(), "pid": os.getpid()}
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{batch}-{partition if partition is not None else 'slot'}-{attempt}-{os.getpid()}.json"
        partial = folder / f".{name}.partial"
        partial.write_text(json.dumps(reason))
        partial.replace(folder / name)
    except Exception:  # noqa: BLE001 - a full or read-only disk: the attempt's count still reaches the driver
        pass


def failed_attempt_reasons(directory: Path | None, batch: int,
                           results: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Driver side, after batch ``batch``: the reasons its failed attempts left in ``directory``
    (read, then deleted), plus one per attempt that the successful ``results`` count (a result's
    ``attempt`` = attempts of its task that failed before it) but that left nothing: its Python worker
    died (killed, out of memory, a crash in native code) before it could say why."""
    reasons: list[dict[str, Any]] = []
    if directory is not None and directory.is_dir():
        for path in sorted(directory.glob(f"{batch}-*.json")):
            try:
                reasons.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
            path.unlink(missing_ok=True)
    told = {(r.get("partition"), r.get("attempt")) for r in reasons}
    host = socket.gethostname() if directory is not None else None
    for result in results:
        partition = result.get("partition")
        for attempt in range(int(result.get("attempt", 0) or 0)):
            if (partition, attempt) not in told and partition is not None:
                where = "Python worker exited unexpectedly" if directory is not None else \
                    "failed on an executor (Spark recorded no reason for it)"
                reasons.append({"batch": batch, "partition": partition, "attempt": attempt, "type": "WorkerExited",
                                "message": f"{where} (attempt {attempt} of partition {partition})", "host": host})
    reasons.sort(key=lambda r: (r.get("partition") if r.get("partition") is not None else -1, r.get("attempt", 0)))
    return reasons


def log_failed_attempts(reasons: Iterable[Mapping[str, Any]], retried: bool = True) -> None:
    """One WARNING per failed attempt: type, message, host, partition, batch; no Java stack."""
    for r in reasons:
        partition = r.get("partition")
        log.warning("batch %s: task attempt %s of %s failed%s: %s: %s%s", r.get("batch"), r.get("attempt"),
                    f"partition {partition}" if partition is not None else "a slot",
                    f" on {r['host']}" if r.get("host") else "", r.get("type"), r.get("message") or "",
                    " (Spark retried it)" if retried else "")


_WORKER_EXITED = "Python worker exited unexpectedly"


def attempt_error(text: str) -> tuple[str, str]:
    """``(type, message)`` of one failed task attempt from its error text as Spark's status store
    keeps it: the Python exception's type name and the first line of its message when the text holds
    a Python traceback, else the Java side's reason (``ExecutorLostFailure``, a Python worker that
    died: ``WorkerExited``, as :func:`failed_attempt_reasons` names it), without any Java frame."""
    python = python_traceback(text)
    if python is not None:
        _frames, type_name, message = _parse(python)
        first = message.strip().splitlines()[0] if message.strip() else ""
        return type_name.rpartition(".")[2] or type_name, first[:_MESSAGE_LIMIT]
    line = next((line.strip() for line in text.splitlines() if line.strip() and not _JAVA_FRAME.match(line)), "")
    if _WORKER_EXITED in line:
        return "WorkerExited", line[line.find(_WORKER_EXITED):][:_MESSAGE_LIMIT]
    head = re.match(r"^([\w$.]+)(?::\s*|\s+|$)(.*)$", line)
    if head is None:
        return "Error", line[:_MESSAGE_LIMIT]
    return head[1].rpartition(".")[2], head[2].strip()[:_MESSAGE_LIMIT]


def merge_attempt_reasons(counted: Iterable[Mapping[str, Any]],
                          known: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``counted`` (one reason per failed attempt the successful results count, possibly without its
    cause) with each entry replaced by the ``known`` reason of the same partition and attempt; known
    reasons of attempts not counted are kept too. Ordered by partition, then attempt."""
    by_attempt = {(r.get("partition"), r.get("attempt")): dict(r) for r in counted}
    for reason in known:
        by_attempt[(reason.get("partition"), reason.get("attempt"))] = dict(reason)
    return sorted(by_attempt.values(), key=lambda r: (r.get("partition") if r.get("partition") is not None else -1,
                                                       r.get("attempt", 0)))
