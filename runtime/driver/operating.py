"""A job's operating files read as hostile input: ``progress/live.json`` and ``progress/progress.jsonl``
(:mod:`localstate.runtime.driver.progress` writes them) can be damaged by a full disk, a crash in the middle
of a write, an editor or anyone with access to the state directory. ``localstate status``, the metrics
and ``localstate run`` read them only through here.

Guarantees: no reader raises on what it finds (a missing, unreadable, symlinked, oversized, truncated,
binary or wrongly typed file); it returns what it could use and, for the rest, a problem in words that
says what to do. Nothing is followed through a symlink, nothing but a regular file is opened (a FIFO
cannot block a reader), at most :data:`LIVE_BYTES` / :data:`TAIL_BYTES` are read. A damaged or
implausible ``live.json`` makes a job's liveness ``unknown``, never ``live``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from localstate.core.fsutil import check_no_symlinks, read_regular
from localstate.errors import LocalStateError

__all__ = ["Found", "LIVE", "NOT_LIVE", "UNKNOWN", "LIVE_BYTES", "TAIL_BYTES", "PID_MAX", "read_live", "judge_live",
           "read_last_progress", "progress_problems", "progress_time", "json_safe", "LIVE_FIELDS", "PROGRESS_FIELDS"]

LIVE, NOT_LIVE, UNKNOWN = "live", "not_live", "unknown"
"""the three answers to "is the job running?" (``unknown``: the files cannot tell; treat it as not live)"""

LIVE_BYTES = 64 * 1024
"""``live.json`` is a few hundred bytes; a larger file is damaged (only its last bytes are read)"""
TAIL_BYTES = 16 * 1024 * 1024
"""the newest progress object is looked for in at most this many bytes at the end of a progress file"""
PID_MAX = 1 << 22
"""the largest process id Linux hands out (``/proc/sys/kernel/pid_max`` at most)"""
_EPOCH_MAX = 1e11
"""seconds since the epoch beyond this (the year 5138) are no time a run wrote"""

_WHAT_TO_DO_LIVE = ("if a run is live, its next heartbeat (every 5 s) rewrites live.json; otherwise the next "
                    "`localstate run` does (or delete the file)")


@dataclass(frozen=True)
class Found:
    """What a reader could use (``value``, None if nothing) and why the rest could not be used
    (``problems``: one sentence each, with what to do)."""

    value: dict[str, Any] | None
    problems: tuple[str, ...] = field(default=())


# -- field checks ------------------------------------------------------------------------------------------

def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda value: type(value) is int and low <= value <= high


def _number_in(low: float, high: float) -> Callable[[Any], bool]:
    return lambda value: type(value) in (int, float) and math.isfinite(value) and low <= value <= high


def _text(limit: int) -> Callable[[Any], bool]:
    """Printable text of at most ``limit`` characters (what is shown to an operator's terminal)."""
    return lambda value: isinstance(value, str) and len(value) <= limit and value.isprintable()


def _timestamp(value: Any) -> bool:
    return isinstance(value, str) and progress_time({"timestamp": value}) is not None


_COUNT = _int_in(0, (1 << 63) - 1)
_SIGNED = _int_in(-(1 << 63), (1 << 63) - 1)
_EPOCH = _number_in(0.0, _EPOCH_MAX)

LIVE_FIELDS: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    # name: (check, what it must be, required)
    "pid": (_int_in(1, PID_MAX), f"a process id (1 to {PID_MAX})", True),
    "host": (lambda v: _text(255)(v) and bool(v), "a host name", True),
    "state": (lambda v: v in ("running", "stopped"), '"running" or "stopped"', True),
    "heartbeat": (_EPOCH, "a time in seconds since the epoch", True),
    "started": (_EPOCH, "a time in seconds since the epoch", False),
    "run_id": (_text(200), "a run id (text)", False),
    "batch": (lambda v: v is None or _COUNT(v), "a batch number or null", False),
    "heartbeat_interval": (_number_in(1e-3, 86400.0), "seconds between heartbeats", False),
}
"""what ``live.json`` holds, field by field"""

PROGRESS_FIELDS: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "batch": (_COUNT, "a batch number", True),
    "timestamp": (_timestamp, "an ISO 8601 time", True),
    "duration_ms": (_number_in(0.0, 1e15), "milliseconds", True),
    "rows_in": (_COUNT, "a count", True),
    "rows_out": (_COUNT, "a count", True),
    "lag": (_SIGNED, "a count of records", True),
    "pending_bytes": (_COUNT, "a count of bytes", False),
    "skipped": (_COUNT, "a count", False),
    "dead_lettered": (_COUNT, "a count", False),
    "failed_attempts": (_COUNT, "a count", False),
    "failed_attempt_reasons": (lambda v: isinstance(v, list), "a list", False),
    "run_id": (_text(200), "a run id (text)", False),
    "inputs": (lambda v: isinstance(v, dict), "an object", False),
    "state": (lambda v: isinstance(v, dict), "an object", False),
}
"""the fields of a progress object that ``status`` and the metrics read (it holds more)"""


def _field_problems(data: Mapping[str, Any], fields: Mapping[str, tuple[Callable[[Any], bool], str, bool]]
                    ) -> list[str]:
    problems = []
    for name, (check, what, required) in fields.items():
        if name not in data:
            if required:
                problems.append(f"{name} is missing")
        elif not check(data[name]):
            problems.append(f"{name} is {_shown(data[name])}, not {what}")
    return problems


def _usable(data: Mapping[str, Any], fields: Mapping[str, tuple[Callable[[Any], bool], str, bool]]) -> dict[str, Any]:
    """The entries of ``data`` that are known fields holding what they should."""
    return {name: data[name] for name, (check, _, _) in fields.items() if name in data and check(data[name])}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse(data: bytes) -> tuple[Any, str | None]:
    """The JSON value of ``data``, or why it is none."""
    try:
        return json.loads(data), None
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    except ValueError as exc:  # also UnicodeDecodeError, and ints of more than 4300 digits
        return None, f"not JSON ({str(exc)[:80]})"


def _read(path: Path, anchor: Path, limit: int, *, tail: bool) -> tuple[bytes | None, str | None]:
    """``(bytes, None)``, ``(None, None)`` when the file is missing, or ``(None, problem)``. At most
    ``limit`` bytes: the last ones (``tail``), or the whole file, which must not be larger."""
    try:
        check_no_symlinks(anchor, path)
        data = read_regular(path, limit if tail else limit + 1, tail=tail)
        if not tail and len(data) > limit:
            return None, f"{path} is damaged: larger than {limit} bytes"
        return data, None
    except FileNotFoundError:
        return None, None
    except LocalStateError as exc:  # a symlink, or not a regular file
        return None, f"{path} cannot be read: {exc.message}"
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror or exc}"


# -- live.json ------------------------------------------------------------------------------------------

def read_live(path: Path, anchor: Path) -> Found:
    """The fields of ``live.json`` at ``path`` (no component below ``anchor``, the state directory, may
    be a symlink) that hold what they should; every other one is a problem."""
    data, problem = _read(path, anchor, LIVE_BYTES, tail=False)
    if data is None:
        return Found(None, (f"{problem}; {_WHAT_TO_DO_LIVE}",) if problem else ())
    value, problem = _parse(data)
    if problem is not None:
        return Found(None, (f"{path} is damaged: {problem}; {_WHAT_TO_DO_LIVE}",))
    if not isinstance(value, dict):
        return Found(None, (f"{path} is damaged: a JSON {type(value).__name__}, not an object; {_WHAT_TO_DO_LIVE}",))
    problems = _field_problems(value, LIVE_FIELDS)
    usable = _usable(value, LIVE_FIELDS)
    if problems:
        return Found(usable, (f"{path} is damaged: {'; '.join(problems)}; {_WHAT_TO_DO_LIVE}",))
    return Found(usable)


def judge_live(found: Found, *, now: float | None = None, stale: float = 30.0,
               host: str | None = None) -> tuple[str, str]:
    """``(liveness, why)`` of the run ``found`` (:func:`read_live`) describes: :data:`LIVE` only when
    every field it needs is sound, it says ``running``, its heartbeat is at most ``stale`` seconds old
    (and not in the future) and, on this host, its pid is a running process that started before the
    run did; :data:`UNKNOWN` when the file cannot tell; else :data:`NOT_LIVE`."""
    if found.value is None:
        return (UNKNOWN, found.problems[0]) if found.problems else (NOT_LIVE, "no run has recorded a heartbeat")
    live = _usable(found.value, LIVE_FIELDS)  # as read_live keeps them, whoever made ``found``
    missing = [name for name, (_, _, required) in LIVE_FIELDS.items() if required and name not in live]
    if missing:
        return UNKNOWN, found.problems[0] if found.problems else f"live.json lacks {', '.join(missing)}"
    now = time.time() if now is None else now
    heartbeat = float(live["heartbeat"])
    if live["state"] != "running":
        return NOT_LIVE, f"the last run stopped at {_iso(heartbeat)}"
    age = now - heartbeat
    if age < -stale:
        return UNKNOWN, (f"the heartbeat is {-age:.0f}s in the future: the clocks of this host and of "
                         f"{live['host']} disagree, or live.json is damaged; {_WHAT_TO_DO_LIVE}")
    age = max(age, 0.0)
    if live["host"] != (socket.gethostname() if host is None else host):
        alive = age <= stale
        return (LIVE if alive else NOT_LIVE), (
            f"heartbeat {age:.0f}s ago from host {live['host']} (pid not checkable here)" if alive
            else f"heartbeat {age:.0f}s ago from host {live['host']}: stale")
    pid = int(live["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return NOT_LIVE, f"pid {pid} is gone (the run died without stopping: a crash or SIGKILL)"
    except PermissionError:
        pass  # alive, another user's
    except OSError as exc:
        return UNKNOWN, f"pid {pid} cannot be checked: {exc.strerror or exc}"
    began = process_start(pid)
    started = live.get("started")
    if began is not None and started is not None and began > float(started) + 2.0:
        return NOT_LIVE, (f"pid {pid} belongs to a process started at {_iso(began)}, after the run started "
                          f"({_iso(float(started))}): the run is gone and its pid was reused")
    if age > stale:
        return NOT_LIVE, f"pid {pid} exists but its heartbeat is {age:.0f}s old (hung, or the pid was reused)"
    return LIVE, f"pid {pid}, heartbeat {age:.1f}s ago"


def process_start(pid: int) -> float | None:
    """When process ``pid`` of this host started (seconds since the epoch), None where ``/proc`` cannot
    say."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
        with open("/proc/stat", "rb") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _iso(epoch: float) -> str:
    try:
        return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return f"{epoch!r} (no time)"


# -- progress.jsonl ----------------------------------------------------------------------------------------

def progress_problems(progress: Any) -> list[str]:
    """Why ``progress`` (a parsed progress line) is no progress object ``status`` and the metrics can
    read; [] if it is one."""
    if not isinstance(progress, dict):
        return [f"a JSON {type(progress).__name__}, not an object"]
    return _field_problems(progress, PROGRESS_FIELDS)


def progress_time(progress: Mapping[str, Any]) -> float | None:
    """The epoch seconds of a progress object's ``timestamp``, None if it has no valid one."""
    stamp = progress.get("timestamp")
    if not isinstance(stamp, str) or len(stamp) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        seconds = parsed.timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return seconds if 0.0 <= seconds <= _EPOCH_MAX else None


def read_last_progress(files: list[Path], anchor: Path) -> Found:
    """The newest progress object of ``files`` (newest file first, e.g. ``progress.jsonl`` then
    ``progress.jsonl.1``) that :func:`progress_problems` accepts; lines after it that are damaged (a
    torn last line after a crash, garbage) are skipped and reported, unreadable files too."""
    problems: list[str] = []
    damaged = 0
    first_damage = ""
    for path in files:
        data, problem = _read(path, anchor, TAIL_BYTES, tail=True)
        if problem is not None:
            problems.append(problem)
        if not data:
            continue
        lines = data.split(b"\n")
        if len(data) >= TAIL_BYTES:
            lines = lines[1:]  # the first line may be cut by the limit
        for line in reversed(lines):
            if not line.strip():
                continue
            value, problem = _parse(line)
            found = [problem] if problem is not None else progress_problems(value)
            if not found:
                if damaged:
                    problems.append(f"{damaged} damaged line(s) after batch {value['batch']} in {path.parent} skipped "
                                    f"(the newest: {first_damage}); a running job appends its next batch after "
                                    f"them, and they leave with rotation")
                return Found(value, tuple(problems))
            damaged += 1
            first_damage = first_damage or f"{path.name}: {'; '.join(found)[:200]}"
        if len(data) >= TAIL_BYTES and damaged == 0:
            problems.append(f"{path}: no complete line in its last {TAIL_BYTES} bytes")
    if damaged:
        problems.append(f"no readable progress object: {damaged} damaged line(s) (the newest: {first_damage}); "
                        "a running job appends its next batch after them")
    return Found(None, tuple(problems))


def json_safe(value: Any, depth: int = 64) -> Any:
    """``value`` with every float that JSON cannot hold (NaN, infinities) as None and anything nested
    deeper than ``depth`` levels as None, so that ``json.dumps(..., allow_nan=False)`` of what a
    damaged file held can neither fail nor recurse without bound."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dict, list)) and depth <= 0:
        return None
    if isinstance(value, dict):
        return {str(key): json_safe(item, depth - 1) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item, depth - 1) for item in value]
    return value
