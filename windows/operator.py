"""The windowed aggregation operator: assigns records to windows, keeps each window's aggregate in
the job's stores, and emits it through the task's collector, closed by event-time timers.

    class HourlyPageViews(StreamTask):
        def init(self, context):
            self.hourly = WindowedAggregation(context, Tumbling("1h"), count(), store="counts",
                                              output="hourly-counts")

        def process(self, envelope, collector, coordinator):
            self.hourly.add(envelope.key, envelope.value, envelope.timestamp, collector)

Guarantees (with the runtime's timers, which are state committed with the stores):

* a window is **closed** once the partition's watermark reaches its end plus ``lateness``; a record
  whose windows are all closed is *late*: dropped, counted (``context.counters``: ``late_records``
  of the store, reported with each committed batch in progress, ``localstate status`` and
  Prometheus; the first of each batch is logged with its key and timestamp) and, with
  ``late_output``, sent there as it came (the dead-letter route of late records);
* ``emit = "final"``: each window's aggregate is sent once, by the event-time timer at its end plus
  ``lateness``; ``emit = "update"``: after each record, the aggregate of every window it changed;
* a window's state is deleted when its timer fires, in both modes, so state holds open windows only.

Timers: each aggregation keeps its timers in its own timer namespace, ``"windows:<store>"``
(``context.timers.namespace``), which fires them itself: they never collide with another
aggregation's or with the task's own, and the job's ``[time] timer_key_serde`` does not matter to
them. An aligned window (tumbling, hopping) closes for every key at once, so the operator keeps
**one event-time timer per window** (key None), and its firing closes the window's entries of every
key with one prefix scan of the store. A session window is per key, and has a timer per key and
session (the record's key, in JSON: any JSON value).

Timers stored before timer namespaces were the task's own, for the keys ``"windows:<store>"`` and
``"windows:<store>|<key>"``: they fire through the task's ``on_timer``, which forwards them to
:meth:`WindowedAggregation.on_timer` (a task whose state predates namespaces keeps that forwarding
until they have fired: at most a window's length plus its lateness of event time).

Exactly once: the firing, its output and the deletions are one commit (the timers' guarantee).
"""

from __future__ import annotations

import json
import logging
from math import floor
from typing import Any, Callable

import numpy as np

from localstate.core.task import Collector, Coordinator, KeyValueStore, TaskContext
from localstate.core.time import TimerNamespace
from localstate.errors import ConfigError
from localstate.windows.aggregations import Aggregation, Fold, WindowState
from localstate.windows.checks import WindowUse, check_stores
from localstate.windows.kinds import Hopping, Session, Window, WindowKind, duration, overlaps

__all__ = ["WindowedAggregation", "EMIT_MODES", "default_shape", "LATE_RECORDS"]

log = logging.getLogger(__name__)

LATE_RECORDS = "late_records"
"""The kind of count (``context.counters``) of the records a window store dropped as late."""

EMIT_MODES = ("final", "update")

_NOW = object()  # "the partition's watermark now" (the default of the per-record paths)

Shape = Callable[[Any, Window, Any], Any]


def default_shape(key: Any, window: Window, value: Any) -> dict[str, Any]:
    """The value sent for a window: ``{"start", "end", "value"}`` (seconds; the aggregate)."""
    return {"start": window.start, "end": window.end, "value": value}


def _key_text(key: Any) -> str:
    """A key as it is written in window names: a str as it is, anything else as \\x00 + JSON (so
    a key sent for a window is the JSON value of the key: a tuple comes back as a list)."""
    return key if isinstance(key, str) else "\x00" + json.dumps(key, sort_keys=True)


def _as_list(values: Any) -> list[Any]:
    """A list from a list, a pyarrow array or any iterable."""
    if isinstance(values, list):
        return values
    to_pylist = getattr(values, "to_pylist", None)
    return to_pylist() if to_pylist is not None else list(values)


def _key_of(text: str) -> Any:
    """The key :func:`_key_text` wrote as ``text``."""
    return json.loads(text[1:]) if text.startswith("\x00") else text


class WindowedAggregation:
    """One windowed aggregation of a task partition: ``window`` (:class:`Tumbling`,
    :class:`Hopping`, :class:`Session`) over event time, ``aggregate`` (from
    :mod:`localstate.windows.aggregations`) kept in store ``store``, results sent to ``output`` as
    ``(key, shape(key, window, aggregate))``.

    ``lateness`` (seconds or a duration string) keeps windows open that long past their end for
    out-of-order records; ``emit`` is ``"final"`` or ``"update"``; ``late_output`` names an output
    that receives late records. Session windows also keep, per key, the list of its open sessions
    in a kv store with a ``json`` value serde: ``index_store`` (default: ``store``)."""

    def __init__(self, context: TaskContext, window: WindowKind, aggregate: Aggregation, *, store: str,
                 output: str, emit: str = "final", lateness: Any = 0.0, late_output: str | None = None,
                 shape: Shape = default_shape, index_store: str | None = None) -> None:
        if emit not in EMIT_MODES:
            raise ConfigError.at("window.emit", f"the window aggregation of store {store!r}: emit mode {emit!r} is not "
                                 f"one of {', '.join(EMIT_MODES)}",
                                 hint='emit = "final" sends each window once, when it closes; "update" on each change')
        self.window = window
        self.aggregate = aggregate
        self.store_name = store
        self.output = output
        self.final = emit == "final"
        self.lateness = duration("window.lateness", lateness, positive=False)
        self.late_output = late_output
        self.shape = shape
        config = getattr(context, "config", None)
        if getattr(config, "stores", None) is not None and getattr(config, "registry", None) is not None:
            # the stores' engines and serdes, before any record: not a SerdeError at the first one
            check_stores(WindowUse(aggregate, store, not isinstance(window, Session), index_store), config)
        self.state: WindowState = aggregate.bind(context.store(store), store)
        self.timers = context.timers
        self.counters = context.counters
        self.late = 0
        """Late records seen by this task instance (dropped; the runtime reports them per committed
        batch from ``context.counters``)."""
        self.timer_key = f"windows:{store}"
        """the name of this aggregation's timer namespace; also the key of an aligned window's timer
        stored before timer namespaces (a session's: this, ``|`` and its key)"""
        self.timer_namespace: TimerNamespace = self.timers.namespace(self.timer_key, self._fire)
        """this aggregation's timers (an aligned window's key None, a session's its record key)"""
        self._register = self.timer_namespace.register_event_time
        self._registered: set[float] = set()
        # closing times this instance registered a timer for (registering again is a no-op, so a
        # restart that forgets them registers each open window's timer once more: harmless)
        self._allowed_lateness = getattr(getattr(config, "time", None), "allowed_lateness", 0.0)
        self._batch_watermark = self.timers.watermark
        """the watermark :meth:`add_batch` judges a batch's first row by (see there)"""
        self.index: KeyValueStore | None = None
        self._tumbling_fold = False
        self._add_at: Callable[[Any, Any, float, Collector, float | None], None]
        if isinstance(window, Session):
            self.index = context.kv(index_store or store)
            self._add_at = self._add_to_session
        elif isinstance(window, Hopping) and window.hops == 1 and isinstance(aggregate, Fold):
            # The common case (a tumbling fold) runs a path with the window arithmetic inlined and
            # the store's get/put called directly: it is per record, and most of the operator's cost.
            self._kv = context.kv(store)
            self._get, self._put, self._step = self._kv.get, self._kv.put, aggregate.step
            self._size, self._offset = window.size, window.offset
            self._tumbling_fold = True
            self._add_at = self.add = self._add_tumbling  # type: ignore[method-assign]
        else:
            self._add_at = self._add_aligned

    # -- records ---------------------------------------------------------------------------------
    def add(self, key: Any, value: Any, timestamp: float, collector: Collector) -> None:
        """Aggregate one record (its event time ``timestamp``) into its windows, judged by the
        partition's watermark now (the runtime has raised it by this record already)."""
        self._add_at(key, value, timestamp, collector, self.timers.watermark)

    def add_batch(self, keys: Any, values: Any, timestamps: Any, collector: Collector) -> None:
        """:meth:`add` for each row of a batch, in order (lists or Arrow arrays; what a
        :class:`~localstate.core.task.BatchTask` receives), with the same results as per-record
        calls: the runtime raises the watermark by a whole batch before delivering it, so each row
        is judged by the watermark it would have had, the one after the previous batch raised row by
        row (``[time] allowed_lateness`` included). A tumbling ``count()`` with ``emit = "final"``
        runs vectorised: window numbers and lateness in numpy, the counts in one ``merge_many``."""
        keys, stamps = _as_list(keys), _as_list(timestamps)
        if not len(keys) == len(values) == len(stamps):
            raise ValueError(f"add_batch: {len(keys)} keys, {len(values)} values, {len(stamps)} timestamps")
        if not stamps:
            return
        ts = np.asarray(stamps, dtype=np.float64)
        marks = np.maximum.accumulate(ts) - self._allowed_lateness
        if self._batch_watermark is not None:
            marks = np.maximum(marks, self._batch_watermark)
        if self._tumbling_fold and self.final and self.aggregate.name == "count" and \
                getattr(self._kv, "merge_many", None) is not None:
            self._count_batch(keys, values, ts, marks, collector)
        else:
            add_at = self._add_at
            for key, value, stamp, mark in zip(keys, _as_list(values), stamps, marks.tolist()):
                add_at(key, value, stamp, collector, mark)
        self._batch_watermark = float(marks[-1])

    def _count_batch(self, keys: list[Any], values: list[Any], ts: Any, marks: Any, collector: Collector) -> None:
        """:meth:`add_batch` of a tumbling count, emit final: the window arithmetic of
        :meth:`_add_tumbling` on arrays (the same float operations, so the same windows)."""
        window = self.window
        size, offset = window.size, window.offset  # type: ignore[attr-defined]
        index = np.floor((ts - offset) / size)
        index -= offset + index * size > ts  # division rounded up: the window before
        end = offset + (index + 1) * size
        after = ~(ts < end)  # rounded down: the window after
        index += after
        end = offset + (index + 1) * size
        closes = end + self.lateness
        late = closes <= marks
        numbers = index.astype(np.int64).tolist()
        if late.any():
            for row in np.flatnonzero(late).tolist():
                value = values[row]  # values are read for late rows only (a count needs none)
                self._late(keys[row], value.as_py() if hasattr(value, "as_py") else value, float(ts[row]),
                           float(marks[row]), collector)
            keep = np.flatnonzero(~late).tolist()
            keys, numbers = [keys[i] for i in keep], [numbers[i] for i in keep]
            closes = closes[~late]
        names = [f"{n}|{k}" if k.__class__ is str else f"{n}|{_key_text(k)}" for n, k in zip(numbers, keys)]
        self._kv.merge_many(names, [1] * len(names))  # type: ignore[attr-defined]
        registered = self._registered
        for close in set(closes.tolist()) - registered:
            self._register(None, close)
            registered.add(close)

    def _add_aligned(self, key: Any, value: Any, timestamp: float, collector: Collector,
                     watermark: float | None) -> None:
        window = self.window
        assert isinstance(window, Hopping)
        lateness = self.lateness
        text = _key_text(key)
        taken = False
        for index in window.indexes(timestamp):
            bounds = window.window(index)
            closes = bounds[1] + lateness
            if watermark is not None and closes <= watermark:
                continue  # this window is closed (a hopping record may still fit a later one)
            taken = True
            name = f"{index}|{text}"
            self.state.add(name, value)
            if closes not in self._registered:
                self._register(None, closes)
                self._registered.add(closes)
            if not self.final:
                collector.send(self.output, key, self.shape(key, bounds, self.state.result(name)))
        if not taken:
            self._late(key, value, timestamp, watermark, collector)

    def _add_tumbling(self, key: Any, value: Any, timestamp: float, collector: Collector,
                      watermark: Any = _NOW) -> None:
        """:meth:`_add_aligned` for a tumbling window and a fold (and :meth:`add` itself then, the
        watermark read here): the same rules, the window computed inline exactly as
        :meth:`Hopping.window` computes it."""
        if watermark is _NOW:
            watermark = self.timers.watermark
        size, offset = self._size, self._offset
        index = floor((timestamp - offset) / size)
        end = offset + (index + 1) * size
        if offset + index * size > timestamp:  # division rounded up: the window before
            index -= 1
            end = offset + (index + 1) * size
        elif not timestamp < end:  # rounded down: the window after
            index += 1
            end = offset + (index + 1) * size
        closes = end + self.lateness
        if watermark is not None and closes <= watermark:
            self._late(key, value, timestamp, watermark, collector)
            return
        name = f"{index}|{key}" if key.__class__ is str else f"{index}|{_key_text(key)}"
        self._put(name, self._step(self._get(name), value))
        if closes not in self._registered:
            self._register(None, closes)
            self._registered.add(closes)
        if not self.final:
            collector.send(self.output, key, self.shape(key, self.window.window(index), self.state.result(name)))

    def _late(self, key: Any, value: Any, timestamp: float, watermark: float | None, collector: Collector) -> None:
        """A record whose windows are all closed: counted, the first of a batch logged, and sent to
        ``late_output`` if there is one."""
        self.late += 1
        if self.counters.add(LATE_RECORDS, self.store_name) == 1:
            shown = repr(key)
            log.warning("window store %r dropped a late record (key %s, timestamp %r; its windows closed at "
                        "watermark %r, lateness %r s): the first of this batch, all counted as late_records in "
                        "progress%s", self.store_name, shown if len(shown) <= 200 else shown[:197] + "...",
                        timestamp, watermark, self.lateness,
                        f"; sent to output {self.late_output!r}" if self.late_output is not None else
                        " (late_output would keep them)")
        if self.late_output is not None:
            collector.send(self.late_output, key, value)

    def _add_to_session(self, key: Any, value: Any, timestamp: float, collector: Collector,
                        watermark: float | None) -> None:
        window = self.window
        assert isinstance(window, Session) and self.index is not None
        lateness = self.lateness
        text = _key_text(key)
        index_key = f"sessions|{text}"
        sessions: list[list[float]] = self.index.get(index_key) or []
        if watermark is not None and any(s[1] + lateness <= watermark for s in sessions):
            # Sessions already closed, their timer due but not fired yet (timers fire at batch
            # boundaries): close them now, as their timer would, so they take no more records.
            # (sent for the key's JSON value, as by the timer: a tuple key as a list)
            for s in [s for s in sessions if s[1] + lateness <= watermark]:
                self.timer_namespace.delete_event_time(key, s[1] + lateness)
                self._close_session(_key_of(text), s[1] + lateness, collector)
            sessions = self.index.get(index_key) or []
        opened = window.window(timestamp)
        merging = [s for s in sessions if overlaps(s, opened)]
        if not merging and watermark is not None and opened.end + lateness <= watermark:
            self._late(key, value, timestamp, watermark, collector)
            return
        start = min([opened.start, *(s[0] for s in merging)])
        end = max([opened.end, *(s[1] for s in merging)])
        name = f"{start!r}|{text}"
        for s in sorted(merging):
            if s[1] + lateness != end + lateness:
                self.timer_namespace.delete_event_time(key, s[1] + lateness)
            old = f"{s[0]!r}|{text}"
            if old != name:
                self.state.merge(name, old)
                self.state.delete(old)
        self.state.add(name, value)
        self._register(key, end + lateness)
        kept = [s for s in sessions if s not in merging]
        self.index.put(index_key, sorted([*kept, [start, end]]))
        if not self.final:
            collector.send(self.output, key, self.shape(key, Window(start, end), self.state.result(name)))

    # -- timers ----------------------------------------------------------------------------------
    def _fire(self, key: Any, timestamp: float, collector: Collector, coordinator: Coordinator) -> None:
        """A timer of this aggregation's namespace fired: close its window (``key`` None) or ``key``'s
        session ending at ``timestamp``."""
        if self.index is not None:
            self._close_session(key, timestamp, collector)
        else:
            self._close_aligned(timestamp, collector)

    def on_timer(self, key: Any, timestamp: float, collector: Collector) -> bool:
        """Close the windows that a timer this aggregation stored *before timer namespaces* closes
        (key ``"windows:<store>"``: an aligned window's entries of every key; ``"windows:<store>|<key>"``:
        ``key``'s session), as its namespace's timers do: such timers fire through the task's
        ``on_timer``, which forwards them here. False when the timer is not one of this
        aggregation's (or its window is gone). Timers registered since fire through the namespace:
        a task needs no ``on_timer`` for them."""
        if self.index is not None:
            prefix = self.timer_key + "|"
            if not (isinstance(key, str) and key.startswith(prefix)):
                return False
            return self._close_session(_key_of(key[len(prefix):]), timestamp, collector)
        if key != self.timer_key:
            return False
        return self._close_aligned(timestamp, collector)

    def _close_aligned(self, timestamp: float, collector: Collector) -> bool:
        """Close the aligned window whose timer is at ``timestamp``: send each key's aggregate
        (``emit = "final"``) and delete the window's entries. False when no window closes then."""
        window = self.window
        assert isinstance(window, Hopping)
        index = window.index_closing_at(timestamp, self.lateness)
        if index is None:
            return False
        self._registered.discard(timestamp)
        closed = self.state.take(f"{index}|")
        if self.final:
            bounds = window.window(index)
            cut = len(str(index)) + 1
            send, shape, output = collector.send, self.shape, self.output
            for name, result in closed:
                owner = _key_of(name[cut:])
                send(output, owner, shape(owner, bounds, result))
        return True

    def _close_session(self, key: Any, timestamp: float, collector: Collector) -> bool:
        assert self.index is not None
        text = _key_text(key)
        index_key = f"sessions|{text}"
        sessions: list[list[float]] = self.index.get(index_key) or []
        closing = [s for s in sessions if s[1] + self.lateness == timestamp]
        if not closing:
            return False
        start, end = closing[0]
        name = f"{start!r}|{text}"
        if self.final:
            collector.send(self.output, key, self.shape(key, Window(start, end), self.state.result(name)))
        self.state.delete(name)
        kept = [s for s in sessions if s is not closing[0]]
        if kept:
            self.index.put(index_key, kept)
        else:
            self.index.delete(index_key)
        return True
