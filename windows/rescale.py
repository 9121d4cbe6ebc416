"""How a rescale (docs/state-as-data.md) moves windowed aggregations: their state and their timers
follow the keys of the records they aggregate.

A window store's keys are ``"<window>|<key>"`` (an aligned window's number, a session's start) and a
session index's ``"sessions|<key>"``: configure the store with ``rescale =
"localstate.windows:window_state_owner"`` and each entry goes to the partition of its record key.

Timers: a session's timer (``"windows:<store>|<key>"``) is routed by its key
(:func:`window_timer_owner`); an aligned window's timer (``"windows:<store>"``) closes that window in
every partition, so it goes to every new partition that receives state of that window
(:func:`place_window_timers`)."""

from __future__ import annotations

from typing import Any, Iterable

from localstate.windows.operator import _key_of

__all__ = ["window_state_owner", "window_timer_owner", "window_number", "place_window_timers"]

TIMER_PREFIX = "windows:"


def window_state_owner(key: Any, value: Any = None) -> Any:
    """The record key a window store's entry belongs to (the routing function of a window store)."""
    if not isinstance(key, str) or "|" not in key:
        return key
    return _key_of(key.split("|", 1)[1])


def window_timer_owner(timer_key: Any) -> tuple[str, Any] | None:
    """``("key", record key)`` for a session's timer, ``("window", store)`` for an aligned window's
    timer, None for a timer that is not a window aggregation's."""
    if not isinstance(timer_key, str) or not timer_key.startswith(TIMER_PREFIX):
        return None
    store, bar, text = timer_key[len(TIMER_PREFIX):].partition("|")
    return ("key", _key_of(text)) if bar else ("window", store)


def window_number(key: Any) -> int | None:
    """The window number of an aligned window's state entry (``"<number>|<key>"``), else None."""
    if not isinstance(key, str):
        return None
    head = key.split("|", 1)[0]
    try:
        return int(head)
    except ValueError:
        return None


def place_window_timers(timestamps: Iterable[float], targets: dict[int, set[int]]) -> dict[float, set[int]]:
    """Where the aligned-window timers of one old partition go: ``timestamps`` are its timers of one
    window store, ``targets`` maps each window number it holds state of to the new partitions that
    receive that state. A window's timer fires at its end (plus lateness), later for a later window,
    and the operator keeps exactly one timer per window holding state: so the i-th timer is the i-th
    window's, and goes where that window's state goes. If the counts differ (state written otherwise),
    every timer goes to every partition that receives any of the store's state: a timer firing where
    its window holds nothing closes nothing."""
    stamps = sorted(set(timestamps))
    numbers = sorted(targets)
    if len(stamps) == len(numbers):
        return {stamp: set(targets[number]) for stamp, number in zip(stamps, numbers)}
    everywhere = set().union(*targets.values()) if targets else set()
    return {stamp: set(everywhere) for stamp in stamps}
