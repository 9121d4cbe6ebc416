"""The parts of the one feed loop (:mod:`.feeder`): bad-record policies (:class:`InputPolicy`,
:class:`OnError`, :func:`apply_on_error`), what a feed did (:class:`FeedStats`), the rows a runtime
may hand over already in columns (:class:`ArrowRows`, :class:`ColumnRows`), and the fast envelope
maker (:func:`make_envelope`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any, Callable, Protocol

from localstate.core.stream import InputRecord
from localstate.core.task import Collector, Envelope, TaskCounters
from localstate.errors import ConfigError, InputError

__all__ = ["InputPolicy", "OnError", "FeedStats", "apply_on_error", "make_envelope", "safe_text", "PROCESS_HINT",
           "CHUNK", "BATCH_ROWS", "ArrowRows", "ColumnRows"]

log = logging.getLogger(__name__)

PROCESS_HINT = "fix the task or the input; state is rolled back to the last commit on restart"

CHUNK = 256
"""Records pulled from the input at a time. Small on purpose: a chunk's records must die before
Python's cyclic GC promotes them to its oldest generation, or every few thousand records trigger a
full collection of the worker's heap."""


BATCH_ROWS = 4096
"""Records pulled at a time for a BatchTask, hence the most rows of a batch built from records: large
enough to spread the per-batch costs (building Arrow arrays, one Python call), small enough to keep a
worker's memory flat."""


@dataclass(frozen=True)
class ArrowRows:
    """A batch of one input's rows held as Arrow already (the DataFrame step): ``batch`` has the
    BatchTask columns (:data:`~localstate.core.task.BATCH_COLUMNS`), its offsets run from ``start``
    without gaps. Fed to a BatchTask as it is; a StreamTask gets its rows as records."""

    stream: str
    batch: Any
    """a ``pyarrow.RecordBatch``"""
    start: int

    def records(self) -> list[tuple[str, InputRecord]]:
        """The rows as ``(stream, InputRecord)`` (for a StreamTask)."""
        columns = [self.batch.column(name).to_pylist() for name in ("offset", "key", "value", "timestamp")]
        return [(self.stream, InputRecord(*row)) for row in zip(*columns)]


@dataclass(frozen=True)
class ColumnRows:
    """A chunk of one input's rows read as columns (an input with the
    :class:`~localstate.core.stream.ColumnarInput` capability, for a BatchTask): ``columns`` is
    an :class:`~localstate.core.stream.InputColumns`. The feed loop applies ``on_error`` to its
    bad rows, one by one, builds one Arrow batch of the good ones and advances the input's position
    to ``columns.end``."""

    stream: str
    columns: Any


FAIL = "fail"


class InputPolicy(Protocol):
    """What to do with an input's bad records. Every configured
    :class:`~localstate.core.stream.InputStream` is one (its ``[inputs.<name>]`` options);
    :class:`OnError` is one without a stream (the TaskTestDriver's)."""

    name: str
    on_error: str
    """``fail`` | ``skip`` | ``dead_letter``"""
    dead_letter: str
    """the output stream bad records go to with ``on_error = 'dead_letter'``"""


@dataclass(frozen=True)
class OnError:
    """A bad-record policy given directly (an :class:`InputPolicy`)."""

    name: str
    on_error: str = FAIL
    dead_letter: str = ""

    def __post_init__(self) -> None:
        if self.on_error not in (FAIL, "skip", "dead_letter"):
            raise ConfigError.at(f"inputs.{self.name}.on_error", f"unknown on_error {self.on_error!r}",
                                 hint="use 'fail', 'skip' or 'dead_letter'")
        if self.on_error == "dead_letter" and not self.dead_letter:
            raise ConfigError.at(f"inputs.{self.name}.dead_letter",
                                 "on_error = 'dead_letter' needs an output stream; got ''",
                                 hint="set dead_letter = '<output stream>'")


@dataclass
class FeedStats:
    """What one ``TaskInstance.feed`` call did."""

    records: int = 0
    """records fed, good and bad (each advanced its input's position)"""
    skipped: int = 0
    dead_lettered: int = 0
    read_seconds: float = 0.0
    """time spent pulling (reading and decoding) records from the input"""
    chunk_read: float = 0.0
    """when the pull of the chunk being fed started (``time.perf_counter``)"""


def make_envelope_maker() -> Callable[[str, int, int, Any, Any, float | None], Envelope]:
    """A function building ``Envelope(stream, partition, offset, key, value, timestamp)`` at about
    half the cost of the constructor: a frozen dataclass's ``__init__`` sets every field through
    ``object.__setattr__``; this sets the same slots through their descriptors. The result is an
    ordinary, equal Envelope. Falls back to the constructor if Envelope's fields ever change."""
    names = ("stream", "partition", "offset", "key", "value", "timestamp")
    if tuple(f.name for f in fields(Envelope)) != names or not all(n in Envelope.__dict__ for n in names):
        return Envelope
    s_stream, s_partition, s_offset, s_key, s_value, s_ts = (Envelope.__dict__[n].__set__ for n in names)
    new = object.__new__

    def make(stream: str, partition: int, offset: int, key: Any, value: Any, ts: float | None) -> Envelope:
        envelope = new(Envelope)
        s_stream(envelope, stream)
        s_partition(envelope, partition)
        s_offset(envelope, offset)
        s_key(envelope, key)
        s_value(envelope, value)
        s_ts(envelope, ts)
        return envelope

    return make


make_envelope = make_envelope_maker()


def apply_on_error(policy: InputPolicy | None, partition: int, collector: Collector, counters: TaskCounters,
                   name: str, record: InputRecord, stats: FeedStats) -> None:
    """Apply the input's ``on_error`` policy (none: ``fail``) to an undecodable or keyless record of
    input ``name``'s ``partition``, or the policy its error names (a RecordProblem of
    :mod:`localstate.core.event_time`: a misrouted record's ``on_misrouted``), counting it in
    ``counters`` where the error says (a dead letter is sent through ``collector``)."""
    error = record.error
    on_error = getattr(error, "policy", None) or (FAIL if policy is None else policy.on_error)
    counted_as = getattr(error, "counted_as", None)
    if on_error != FAIL and counted_as is not None:
        counters.add(*counted_as)
    if on_error == FAIL:
        # a RecordProblem names its own error type, hint and context
        raise getattr(error, "error_type", InputError)(
            f"bad input record ({safe_text(error)}): {safe_text(str(record.raw)[:200])}", stream=name,
            partition=partition, offset=record.offset, **getattr(error, "context", {}),
            hint=getattr(error, "hint", None) or f"fix the record, or set on_error = 'skip' or 'dead_letter' on "
                                                 f"[inputs.{name}]")
    if on_error == "dead_letter":
        # error and raw come from the bad data itself: make them encodable by every output (a lone
        # surrogate would otherwise fail the dead-letter write, and the job, on every run).
        collector.send(policy.dead_letter, None, {  # type: ignore[union-attr]
            "stream": name, "partition": partition, "offset": record.offset, "error": safe_text(record.error),
            "raw": safe_text(record.raw)})
        stats.dead_lettered += 1
    else:
        stats.skipped += 1
        log.warning("skipping bad record of %s[%d] at offset %d: %s", name, partition, record.offset, record.error)


def safe_text(text: Any) -> Any:
    """``text`` with lone surrogates escaped (``\\udc80``), so that UTF-8 outputs accept it."""
    if not isinstance(text, str):
        return text if text is None else repr(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
