"""Where each timer goes when the partition count changes: timers move with their keys.

A timer store entry is ``domain | timestamp | namespace | key``
(:func:`~localstate.runtime.partition.timer_entries.split_entry`). A timer registered for a record key
goes to that key's new partition (checked like a store's records: it must sit in the partition its
key routes to); a namespace's keys are read as JSON (the default serde of a namespace; a key that is
no JSON routes as its bytes). A window aggregation's timers (namespace ``windows:<store>``, and the
task's own timers of a task whose windows predate namespaces) follow their windows
(:mod:`localstate.windows.rescale`): a session's by its key, an aligned window's (one timer per window,
shared by every key) to every new partition that receives state of that window. A timer whose key
routes elsewhere than the partition holding it (a task's own per-partition timer) is refused, or
copied to every new partition with ``[time] timer_rescale = "all"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from localstate.core.config import JobConfig
from localstate.core.partitioner import key_bytes, partitions_of_bytes
from localstate.core.time import PROCESSING_TIME
from localstate.errors import RescaleError
from localstate.runtime.partition.timer_entries import json_decode, split_entry
from localstate.runtime.statedata.routing import Placed
from localstate.windows.rescale import TIMER_PREFIX, place_window_timers, window_timer_owner

__all__ = ["TimerRouter", "window_stores_of", "timer_owner"]


def window_stores_of(entries: list[bytes], decode: Any) -> set[str]:
    """The stores whose aligned windows have timers among ``entries`` (``decode``: the task's own
    timer keys' serde)."""
    stores = set()
    for entry in entries:
        _domain, _timestamp, namespace, data = split_entry(entry)
        owner = timer_owner(namespace, data, decode)
        if owner[0] == "window":
            stores.add(owner[1])
    return stores


def timer_owner(namespace: str, data: bytes, decode: Any) -> tuple[str, Any]:
    """``("window", store)`` for an aligned window's timer, else ``("key", the key it routes by)``;
    ``decode``: the serde of the task's own timer keys (namespace ``""``)."""
    if not namespace:  # the task's own timers, window timers stored before namespaces included
        key = _decode(decode, data)
        owner = window_timer_owner(key)
        return owner if owner is not None else ("key", key)
    key = _decode(json_decode, data)
    if namespace.startswith(TIMER_PREFIX) and key is None:  # an aligned window's: one per window
        return ("window", namespace[len(TIMER_PREFIX):])
    return ("key", key)


def _decode(decode: Any, data: bytes) -> Any:
    try:
        return decode(data)
    except Exception:  # noqa: BLE001 - a key the serde cannot read is routed as its bytes
        return data


class TimerRouter:
    """Routes the timer store's entries from ``old`` to ``new`` partitions (see the module docstring).
    ``window_targets(store, old_partition)`` says which new partitions get each window's state."""

    def __init__(self, job: JobConfig, old: int, new: int, key_serde: str) -> None:
        self.old, self.new = old, new
        serde = job.registry.serde(key_serde, allow_pickle=job.allow_pickle)
        self.decode = serde.deserialize
        self.copy_unrouted = job.time.timer_rescale == "all"
        self.next_timer: dict[int, float] = {}
        """new partition -> its earliest processing-time timer"""

    def route(self, partition: int, entries: list[bytes], window_targets: Any) -> Placed:
        placed: dict[int, set[bytes]] = {}
        routed_entries, routing = [], []
        shared: dict[str, list[tuple[bytes, float]]] = {}
        for entry in entries:
            _domain, timestamp, namespace, data = split_entry(entry)
            kind, owner = timer_owner(namespace, data, self.decode)
            if kind == "window":
                shared.setdefault(owner, []).append((entry, timestamp))
                continue
            routed_entries.append(entry)
            routing.append(key_bytes(owner))
        if routing:
            home = partitions_of_bytes(routing, self.old)
            targets = partitions_of_bytes(routing, self.new)
            for entry, at_home, target, route in zip(routed_entries, (home == partition).tolist(), targets.tolist(),
                                                     routing):
                if at_home or self.old == 1:
                    placed.setdefault(target, set()).add(entry)
                elif self.copy_unrouted:
                    for everywhere in range(self.new):
                        placed.setdefault(everywhere, set()).add(entry)
                else:
                    raise RescaleError(
                        f"a timer of partition {partition} is registered for key {_decode(self.decode, route)!r:.80}, "
                        f"which routes to partition {int(partitions_of_bytes([route], self.old)[0])}: it cannot follow a "
                        "key", store="_timers", partition=partition,
                        hint="register timers for the record keys, or set [time] timer_rescale = \"all\" to copy such "
                             "timers to every new partition (docs/state-as-data.md)")
        for store, timers in shared.items():
            places = place_window_timers([ts for _, ts in timers], window_targets(store, partition))
            for entry, timestamp in timers:
                for target in places.get(timestamp, ()):
                    placed.setdefault(target, set()).add(entry)
        out: Placed = {}
        for target, chosen in placed.items():
            keys = sorted(chosen)
            out[target] = (keys, [b""] * len(keys))
            for entry in keys:
                domain, timestamp, _namespace, _key = split_entry(entry)
                if domain == PROCESSING_TIME and timestamp < self.next_timer.get(target, np.inf):
                    self.next_timer[target] = timestamp
        return out
