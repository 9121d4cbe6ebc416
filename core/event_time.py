"""Where event time enters: an input's record timestamps checked and converted to seconds, one rule
for every input system (jsonl, file, kafka, generator, the DataFrame step, the TaskTestDriver).

An input declares the unit its timestamps are in (``timestamp_unit``: ``s``, ``ms``, ``us``, ``ns``)
and the plausible range of its event times, in seconds after conversion (``min_timestamp``,
``max_timestamp``; default the epoch (0) to 2200-01-01, ``false``: no bound). A timestamp that is not a
number (a boolean, a string, a list), not finite, or outside the range is a bad record: the input's
``on_error`` applies (``fail`` raises :class:`~localstate.errors.TimestampError` naming the input,
partition, offset and the timestamp as read). So a job fed milliseconds as seconds stops at the
first such record, before anything event time drives (the watermark, timers, windows, TTL) moves
a thousand times too far."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from numbers import Real
from typing import Any, Mapping

from localstate.core.options import Option
from localstate.core.time import TIMESTAMP_UNITS
from localstate.core.text import a
from localstate.errors import ConfigError, InputError, TimestampError

__all__ = ["TimestampRule", "BadTimestamp", "RecordProblem", "TIMESTAMP_OPTIONS", "DEFAULT_MIN_TIMESTAMP",
           "DEFAULT_MAX_TIMESTAMP", "timestamp_rule", "NO_BOUNDS"]

DEFAULT_MIN_TIMESTAMP = 0.0
"""1970-01-01T00:00:00Z, the epoch: the default ``min_timestamp``. A negative event time is refused;
small ones are not, as logical clocks in tests and replays start at 0 (declare a later bound to
catch seconds declared as milliseconds)."""

DEFAULT_MAX_TIMESTAMP = 7_258_118_400.0
"""2200-01-01T00:00:00Z: the default ``max_timestamp`` (past it: most likely milliseconds,
microseconds or nanoseconds read as seconds, 1e3 to 1e9 times too far)."""

_FINITE = 1.7976931348623157e308  # the largest double: bounds are finite, so inf and NaN never pass


class RecordProblem(str):
    """An :class:`~localstate.core.stream.InputRecord`'s ``error`` that is more than
    "undecodable": the typed error the ``fail`` policy raises (``error_type``), its ``hint`` and its
    ``context`` (such as the timestamp as read); ``policy``: the input's policy that applies instead of
    its ``on_error`` (a misrouted record's ``on_misrouted``), None: ``on_error``; ``counted_as``: the
    ``(kind, label)`` it is counted under when it is skipped or dead-lettered
    (:class:`~localstate.core.task.TaskCounters`). Still a str: logs and dead-letter records show it
    as text."""

    error_type: type[InputError]
    hint: str | None
    context: dict[str, Any]
    policy: str | None
    counted_as: tuple[str, str] | None

    def __new__(cls, text: str, error_type: type[InputError] = InputError, hint: str | None = None, *,
                policy: str | None = None, counted_as: tuple[str, str] | None = None,
                **context: Any) -> "RecordProblem":
        problem = super().__new__(cls, text)
        problem.error_type, problem.hint, problem.context = error_type, hint, context
        problem.policy, problem.counted_as = policy, counted_as
        return problem


class BadTimestamp(ValueError):
    """Raised by :meth:`TimestampRule.seconds`: ``problem`` is the record's error (a
    :class:`RecordProblem` whose ``fail`` raises TimestampError)."""

    def __init__(self, problem: RecordProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _iso(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "beyond the calendar"


class TimestampRule:
    """How one input's record timestamps become event time: divided by ``timestamp_unit`` per second
    and checked to be a finite number from ``minimum`` to ``maximum`` seconds (None: no bound).
    Guarantee: :meth:`seconds` returns only a finite float inside the bounds, or None for a record
    without a timestamp; :meth:`column_fits` says whether a whole column is such (the batch paths
    check a column at once, and decode record by record only when it is not)."""

    __slots__ = ("input", "unit", "per_second", "minimum", "maximum", "_low", "_high")

    def __init__(self, input_name: str = "", unit: str = "s", minimum: float | None = DEFAULT_MIN_TIMESTAMP,
                 maximum: float | None = DEFAULT_MAX_TIMESTAMP) -> None:
        self.input = input_name
        self.unit = unit
        self.per_second = TIMESTAMP_UNITS[unit]
        self.minimum, self.maximum = minimum, maximum
        self._low = -_FINITE if minimum is None else float(minimum)
        self._high = _FINITE if maximum is None else float(maximum)

    def _fields(self) -> tuple[Any, ...]:
        return (self.input, self.unit, self.minimum, self.maximum)

    def __eq__(self, other: object) -> bool:
        """Rules are equal when they are made of the same options (a DataFrame step's micro-batches
        each build theirs, and share one apply stage while they are equal)."""
        return isinstance(other, TimestampRule) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def seconds(self, value: Any, per_second: float | None = None) -> float | None:
        """``value`` (a record's timestamp as read, in the input's unit, or ``per_second`` units a
        second for a timestamp whose unit is fixed, such as a Kafka record's milliseconds; None: it
        has none) as event time in seconds; :class:`BadTimestamp` when it is not a finite number
        inside the bounds."""
        if value is None:
            return None
        cls = value.__class__
        if cls is float or cls is int or (isinstance(value, Real) and not isinstance(value, bool)):
            per = self.per_second if per_second is None else per_second
            try:
                ts = float(value) / per if per != 1.0 else float(value)
            except OverflowError:  # an int beyond a double
                raise BadTimestamp(self.problem(value, "is beyond any double")) from None
            if self._low <= ts <= self._high:  # NaN and the infinities fail it: the bounds are finite
                return ts + 0.0  # -0.0 is 0.0: a column reader cannot tell a "-0" from a "-0.0"
            raise BadTimestamp(self._out_of_range(value, ts))
        raise BadTimestamp(self.problem(value, f"is {_a(value)}, not a number"))

    def column_fits(self, seconds: Any) -> bool:
        """Whether every non-null value of ``seconds`` (a pyarrow float64 array or a numpy array, in
        seconds already) is finite and inside the bounds. A column that fits is used as
        :meth:`seconds` would give it once its negative zeros are made 0.0 (add 0.0)."""
        # `import localstate` does not load numpy: only columns need it
        import numpy as np

        if not isinstance(seconds, np.ndarray):
            # nulls dropped first (to_numpy would make them NaN, which must fail the check)
            seconds = seconds.drop_null().to_numpy(zero_copy_only=False)
        return bool(((seconds >= self._low) & (seconds <= self._high)).all())

    def problem(self, value: Any, why: str) -> RecordProblem:
        """The bad record's error for timestamp ``value``: it ``why``."""
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        where = f"[inputs.{self.input}]" if self.input else "the input"
        return RecordProblem(
            f"timestamp {shown} {why}", TimestampError, timestamp=shown,
            hint=f"fix the record's timestamp; declare the unit the input's timestamps are in "
                 f"(timestamp_unit = 's', 'ms', 'us' or 'ns') and their plausible range (min_timestamp, "
                 f"max_timestamp) in {where}; or set on_error = 'skip' or 'dead_letter' there")

    def _out_of_range(self, value: Any, ts: float) -> RecordProblem:
        if ts != ts or ts in (math.inf, -math.inf):
            return self.problem(value, "is not a finite number")
        seconds = "" if self.unit == "s" else f"{self.unit} ({ts!r} s) "
        if ts > self._high:
            side = f"after max_timestamp {self.maximum!r} ({_iso(self._high)})"
        else:
            side = f"before min_timestamp {self.minimum!r} ({_iso(self._low)})"
        guess = next((name for name, per in TIMESTAMP_UNITS.items()
                      if per > self.per_second and self._low <= ts * self.per_second / per <= self._high), None)
        unit = f": in {guess}? declare timestamp_unit = {guess!r}" if guess is not None else ""
        return self.problem(value, f"{seconds}is {side}{unit}")


def _a(value: Any) -> str:
    """The type of ``value`` with its article, for messages: ``a boolean``, ``an int``."""
    return "a boolean" if isinstance(value, bool) else a(type(value).__name__)


NO_BOUNDS = TimestampRule(minimum=None, maximum=None)
"""Seconds, any finite number: the rule of a stream that declares none (a TaskTestDriver input not
declared with bounds, the DataFrame step by default)."""


def _bound(value: Any) -> float | None:
    """A ``min_timestamp`` / ``max_timestamp``: seconds since the epoch, a date or date-time string
    (ISO 8601; UTC unless it says otherwise), or false (no bound)."""
    if value is False:
        return None
    if value is True:
        raise ValueError("must be seconds since the epoch, a date such as '2200-01-01', or false (no bound)")
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"must be seconds since the epoch, a date such as '2200-01-01', or false (no bound); "
                             f"got {value!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    return float(value)


TIMESTAMP_OPTIONS: Mapping[str, Option] = {
    "timestamp_unit": Option(str, default="s", choices=tuple(TIMESTAMP_UNITS),
                             doc="unit of the records' timestamps (s, ms, us, ns): event time is seconds, so a "
                                 "timestamp is divided by it as it is read"),
    "min_timestamp": Option((int, float, str, bool), default=DEFAULT_MIN_TIMESTAMP, parse=_bound,
                            doc="earliest plausible event time, in seconds after timestamp_unit (or a date such as "
                                "'2015-06-01'; false: none); a record before it is a bad record (on_error). "
                                "Default 0, the epoch"),
    "max_timestamp": Option((int, float, str, bool), default=DEFAULT_MAX_TIMESTAMP, parse=_bound,
                            doc="latest plausible event time, in seconds after timestamp_unit (or a date such as "
                                "'2200-01-01'; false: none); a record after it is a bad record (on_error): "
                                "timestamps in a smaller unit than declared. Default 2200-01-01"),
}
"""Options every input accepts (with ``on_error``): how its timestamps become event time."""


def timestamp_rule(name: str, config: Mapping[str, Any]) -> TimestampRule:
    """The rule of input ``name`` from its validated options (:data:`TIMESTAMP_OPTIONS`); a
    ConfigError at ``inputs.<name>.min_timestamp`` when the bounds leave nothing between them."""
    low, high = config.get("min_timestamp"), config.get("max_timestamp")
    if low is not None and high is not None and low >= high:
        raise ConfigError.at(f"inputs.{name}.min_timestamp", f"min_timestamp {low!r} is not before max_timestamp "
                             f"{high!r}: no timestamp would be accepted",
                             hint="give min_timestamp < max_timestamp (seconds since the epoch, or dates)")
    return TimestampRule(name, config.get("timestamp_unit", "s"), low, high)
