"""Python tracebacks for the errors a user reads: the user's own frames first.

A failure inside the user's task (or anywhere in a Spark executor) becomes a typed
:class:`~localstate.errors.LocalStateError` that names the exception type, its message and the
innermost frame of the user's code (``file:line in function``), and carries the formatted traceback
in ``error.traceback`` (the user's frames, then the full traceback) and ``error.traceback_summary``
(the user's frames and the exception line only), which the CLI prints.

A *user frame* is one whose file lies outside the localstate package, the standard library,
PySpark, Py4J and installed third-party packages (site-packages): the task module and whatever it
calls of the user's own. A failure inside numpy thus points at the user's line that called numpy.
Frames of installed packages stand in when there is no other (a task installed as a package).
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import traceback
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, NoReturn

from localstate.errors import LocalStateError, TaskError

__all__ = ["Trace", "describe", "describe_frames", "is_user_file", "attach", "raise_task_error", "USER_FRAMES"]

USER_FRAMES = 8
"""At most this many of the user's innermost frames go into the summary."""
_MESSAGE_CHARS = 500


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib")}
    # Every folder the localstate distribution maps to a package (pyproject.toml's package-dir).
    for package in ("localstate", "localstate.core", "localstate.runtime", "localstate.tools", "localstate.testing",
                    "localstate.native", "localstate.windows",
                    "localstate.engines", "localstate.changelog",
                    "localstate.streams", "localstate.demo", "pyspark", "py4j"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            roots.update(spec.submodule_search_locations or [])
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots)


@lru_cache(maxsize=4096)
def _kind(filename: str) -> int:
    """0: localstate, the standard library, PySpark, Py4J; 1: an installed third-party package;
    2: the user's own code."""
    if not filename or filename.startswith("<"):  # <frozen ...>, <string>
        return 0
    parts = filename.replace("\\", "/").split("/")
    if "pyspark" in parts or "py4j" in parts or any(part.endswith((".zip", ".egg")) for part in parts):
        return 0  # an executor's copy of PySpark (pyspark.zip, py4j-*.zip), wherever it lives
    if os.path.realpath(filename).startswith(_library_roots()):
        return 0
    return 1 if "site-packages" in parts or "dist-packages" in parts else 2


def is_user_file(filename: str) -> bool:
    """True if ``filename`` is the user's code: not localstate, the standard library, PySpark, Py4J,
    nor an installed package (an installed package counts when no other frame does)."""
    return _kind(filename) == 2


@dataclass(frozen=True)
class Trace:
    """One failure, formatted: what a user needs to find it in their code."""

    type_name: str
    message: str
    location: str | None
    """``file:line in function`` of the innermost user frame, else of the innermost frame"""
    in_user_code: bool
    summary: str
    """the user's frames (innermost last) and the exception line"""
    full: str
    """the user's frames, then the complete Python traceback"""

    @property
    def headline(self) -> str:
        """``Type: message at file:line in function``, on one line."""
        message = " ".join(self.message.split())
        if len(message) > _MESSAGE_CHARS:
            message = message[:_MESSAGE_CHARS] + "..."
        text = f"{self.type_name}: {message}" if message else self.type_name
        return f"{text} at {self.location}" if self.location else text


def _where(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def describe_frames(frames: Iterable[traceback.FrameSummary], type_name: str, message: str,
                    full_traceback: str) -> Trace:
    """A :class:`Trace` from frames (outermost first), the exception's type name and message, and the
    complete traceback text. Also used for tracebacks parsed from a Spark error's text."""
    frames = list(frames)
    # The user's frames; else those of installed packages (a task installed as a package).
    user = [frame for frame in frames if _kind(frame.filename) == 2] or \
        [frame for frame in frames if _kind(frame.filename) == 1]
    exception_line = f"{type_name}: {message}" if message else type_name
    if user:
        shown = traceback.StackSummary.from_list(user[-USER_FRAMES:])
        more = f"  ({len(user) - USER_FRAMES} outer frame(s) of your code not shown)\n" if len(user) > USER_FRAMES \
            else ""
        summary = "in your code (most recent call last):\n" + more + "".join(shown.format()) + exception_line
        full = summary + "\n\nfull traceback:\n" + full_traceback.rstrip("\n")
    else:
        last = traceback.StackSummary.from_list(frames[-3:])
        summary = ("not in your code; innermost frames (most recent call last):\n" + "".join(last.format())
                   + exception_line)
        full = full_traceback.rstrip("\n")
    location = _where(user[-1]) if user else _where(frames[-1]) if frames else None
    return Trace(type_name, message, location, bool(user), summary.rstrip("\n"), full)


def describe(exc: BaseException, *, importing: bool = False) -> Trace:
    """Format ``exc`` (with its traceback and chained causes).

    A SyntaxError in the user's file is shown as Python shows it (the file, the line, a caret),
    not by the frames of the import machinery that compiled it. ``importing``: ``exc`` was raised
    while importing the user's module; without a frame of the user's, the summary is the exception
    alone (the import machinery's frames are in the full traceback, ``-v``)."""
    details = traceback.TracebackException.from_exception(exc)
    full = "".join(details.format())
    message = str(exc) if not isinstance(exc, LocalStateError) else exc.message
    if isinstance(exc, SyntaxError) and exc.filename and _kind(exc.filename) == 2:
        shown = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
        summary = "in your code:\n" + shown
        return Trace(type(exc).__name__, message, f"{exc.filename}:{exc.lineno}", True, summary,
                     summary + "\n\nfull traceback:\n" + full.rstrip("\n"))
    trace = describe_frames(details.stack, type(exc).__name__, message, full)
    if importing and not trace.in_user_code:
        exception_line = f"{trace.type_name}: {message}" if message else trace.type_name
        return Trace(trace.type_name, message, trace.location, False, exception_line, trace.full)
    return trace


def attach(error: LocalStateError, trace: Trace, *, at: bool = False, **context: Any) -> LocalStateError:
    """Give ``error`` the traceback of ``trace`` (unless it already has one), and add ``context``
    entries it lacks (plus ``at`` = the user's location if ``at`` and the failure is in user code)."""
    if error.traceback is None:
        error.traceback, error.traceback_summary, error.location = trace.full, trace.summary, trace.location
        if at and trace.in_user_code:
            context = {"at": trace.location, **context}
    added = {key: value for key, value in context.items() if value is not None and key not in error.context}
    if added:
        error.context.update(added)
        error.args = (error._render(),)
    return error


def raise_task_error(exc: BaseException, call: str, *, hint: str, **context: Any) -> NoReturn:
    """Raise the typed error for ``exc``, raised by the user's task in ``call`` (``"process()"``...):
    a :class:`TaskError` naming the exception, its message and the user's file and line; a
    LocalStateError (e.g. from a store the task used) keeps its type and gains the location."""
    trace = describe(exc)
    if isinstance(exc, LocalStateError):
        raise attach(exc, trace, at=True, **context)
    error = TaskError(f"task {call} raised {trace.headline}", hint=hint, **context)
    raise attach(error, trace) from exc
