"""Time as tasks and stores see it: the two time domains, the watermark, and timers.

*Event time* is the time carried by the records (``Envelope.timestamp``, seconds since the epoch).
It advances with a per-partition **watermark**: the largest event timestamp seen so far minus the
job's allowed lateness. The watermark never goes back and is saved in every checkpoint.

*Processing time* is the runtime's wall clock (seconds since the epoch).

Timers and TTL read time through a :class:`TimeSource`; the runtime hands each task partition one
(its timer service) and each store the same one (:attr:`StoreContext.time`), so a test driver that
advances time moves both together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from localstate.core.options import Option, parse_duration
from localstate.core.serdes import Serde

__all__ = ["EVENT_TIME", "PROCESSING_TIME", "TIME_DOMAINS", "TIMESTAMP_UNITS", "TimeSource", "SystemTime",
           "SYSTEM_TIME", "Timers", "TimerNamespace", "current_time", "TimeConfig", "TIME_OPTIONS", "TIMER_STORE",
           "TIMER_WRITE_BATCH", "PAST_TIMER_POLICIES", "TIMER_RESCALE_POLICIES"]

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
TIME_DOMAINS = (EVENT_TIME, PROCESSING_TIME)

TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
"""The words of a ``timestamp_unit`` option (an input's, a heap reorder store's), each with how many
of it make a second: event time inside localstate is always seconds."""


@runtime_checkable
class TimeSource(Protocol):
    """The current time of one task partition, in both domains."""

    def processing_time(self) -> float:
        """Seconds since the epoch by the runtime's clock."""
        ...

    @property
    def watermark(self) -> float | None:
        """The partition's event time (seconds since the epoch); None before any timestamped record."""
        ...


class SystemTime:
    """The time source outside a task partition: the wall clock, and no event time yet."""

    def processing_time(self) -> float:
        return time.time()

    @property
    def watermark(self) -> float | None:
        return None


SYSTEM_TIME = SystemTime()


def current_time(source: TimeSource, domain: str) -> float | None:
    """``source``'s time in ``domain`` (:data:`EVENT_TIME` or :data:`PROCESSING_TIME`)."""
    if domain == PROCESSING_TIME:
        return source.processing_time()
    if domain == EVENT_TIME:
        return source.watermark
    raise ValueError(f"unknown time domain {domain!r}; expected one of {', '.join(TIME_DOMAINS)}")


@runtime_checkable
class TimerNamespace(Protocol):
    """A namespace of a partition's timers (``context.timers.namespace(...)``): its own timers, keys
    encoded by its own serde, fired through its own ``on_fire`` instead of ``StreamTask.on_timer``.
    A timer is identified by (domain, namespace, key, timestamp): registering it twice keeps one, and
    timers of different namespaces never collide. Every namespace's timers share one firing order:
    each domain in timestamp order."""

    @property
    def name(self) -> str: ...

    def register_event_time(self, key: Any, timestamp: float) -> None: ...

    def register_processing_time(self, key: Any, timestamp: float) -> None: ...

    def delete_event_time(self, key: Any, timestamp: float) -> None: ...

    def delete_processing_time(self, key: Any, timestamp: float) -> None: ...


@runtime_checkable
class Timers(TimeSource, Protocol):
    """A task partition's timers (``context.timers``): per-key timers in either domain, kept in a
    logged store and committed with the other stores. A timer is identified by (domain, key,
    timestamp): registering it twice keeps one. It fires once, through ``StreamTask.on_timer``, when
    its domain's time reaches its timestamp, in timestamp order; its firing, the outputs it sends and
    its deletion are committed together. :meth:`namespace` opens a separate set of timers with its
    own key serde and callback (as Flink keys a timer by key and namespace)."""

    def register_event_time(self, key: Any, timestamp: float) -> None: ...

    def register_processing_time(self, key: Any, timestamp: float) -> None: ...

    def delete_event_time(self, key: Any, timestamp: float) -> None: ...

    def delete_processing_time(self, key: Any, timestamp: float) -> None: ...

    def namespace(self, name: str, on_fire: Callable[[Any, float, Any, Any], None],
                  key_serde: Serde | str | None = None) -> TimerNamespace:
        """The timers of namespace ``name`` (a non-empty str of at most 255 UTF-8 bytes, no NUL): keys
        encoded by ``key_serde`` (a serde name or a Serde; default ``json``, whatever ``[time]
        timer_key_serde`` says), each due one fired through ``on_fire(key, timestamp, collector,
        coordinator)``. Open it in ``init()``: a stored timer of a namespace not opened since the
        partition opened stops the firing with a ConfigError. Opening it again with the same
        ``on_fire`` and ``key_serde`` returns it; with others it is a ConfigError. The task need not
        define ``on_timer`` for it."""
        ...

    @property
    def firing_domain(self) -> str | None:
        """The domain of the timer being fired (inside ``on_timer`` or a namespace's ``on_fire``),
        else None."""
        ...


# -- the [time] table of a job ------------------------------------------------------------------------
TIMER_STORE = "_timers"
"""The name of the internal kv store that holds a job's timers (``[time] timers = true``): a logged
store like the others (recovered, flushed and checkpointed with them), hidden from the task's
``context.stores``; a user store may not take this name."""

TIMER_WRITE_BATCH = 100_000
"""Pending timer changes that trigger a spill of the timer store before the next commit."""

PAST_TIMER_POLICIES = ("fire", "error")
TIMER_RESCALE_POLICIES = ("key", "all")
"""``[time] timer_rescale``: a timer whose key does not route to the partition that holds it is
refused by a rescale (``key``) or copied to every new partition (``all``)."""
"""``[time] past_timers``: a timer registered before its domain's current time fires at the next
firing point (``fire``, as Flink does) or is refused with a ConfigError (``error``)."""


def _lateness(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be a positive duration such as '5s' (leave it out for a watermark equal to the "
                         f"largest event timestamp seen), got {value!r}")
    return seconds


TIME_OPTIONS = {
    "allowed_lateness": Option((int, float, str), default=0.0, parse=_lateness,
                               doc="how far event time may run out of order: the partition's watermark is the "
                                   "largest event timestamp seen minus this (default: 0, the largest timestamp "
                                   "seen; when given, a positive duration)"),
    "timers": Option(bool, default=False,
                     doc="keep per-key timers for the task (`context.timers`), in a logged kv store committed "
                         "with the other stores"),
    "timer_backend": Option(str, default=None,
                            doc="the backend of the timer store (`rocksdb`, `lmdb`, `memory`; default: the kv "
                                "engine's)"),
    "timer_changelog": Option(str, default=None,
                              doc="the timer store's changelog stream (default `\"<job>-timers-changelog\"`); "
                                  "timers are always logged"),
    "timer_key_serde": Option(str, default="json",
                              doc="serde of the keys of the task's own timers (`json`, `string`, `int`, ...; a "
                                  "timer namespace has its own)"),
    "timer_rescale": Option(str, default="key", choices=TIMER_RESCALE_POLICIES,
                            doc="how a rescale moves a timer whose key does not route to its partition (the "
                                "task's own per-partition timers): `key` refuses it, `all` copies it to every new "
                                "partition (docs/state-as-data.md)"),
    "past_timers": Option(str, default="fire", choices=PAST_TIMER_POLICIES,
                          doc="a timer registered before its domain's current time: `fire` at the next firing "
                              "point (as Flink), or `error` (a ConfigError naming this option)"),
}
"""Every ``[time]`` key: the watermark and the timers of each task partition."""


@dataclass(frozen=True)
class TimeConfig:
    """The ``[time]`` table after validation (defaults when the job has none)."""

    allowed_lateness: float = 0.0
    timers: bool = False
    timer_key_serde: str = "json"
    past_timers: str = "fire"
    timer_rescale: str = "key"
