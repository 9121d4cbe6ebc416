"""Where each record of a store goes when the partition count changes from ``old`` to ``new``.

Soundness first: after a rescale every key's state must live in the partition its future records go
to. A store is *keyed* when each of its records belongs to a store key (the engine says which:
:class:`~localstate.core.engine.Redistribution`) whose routing key, decoded with the store's key serde,
the job's partitioner sends to the partition holding the record. :class:`KeyRouter` checks that on the
data itself, for every record of every old partition, and refuses a store that breaks it
(:class:`RescaleError` naming the store, the partition and a sample key) unless the store's config
says how to redistribute it (``rescale``): routed by a user function ``module:function``, whose
result is checked the same way; or merged (:class:`MergeRouter`) into every new partition (``all``)
or into partition 0 (``one``), for state that merges (sketches, heaps, a kv store with a
``rescale_merge`` function). Records that are the store's own metadata (:data:`~localstate.core.engine.COPY`)
go to every new partition that gets any of the store's records.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from localstate.core.config import JobConfig, StoreConfig
from localstate.core.engine import COPY, Redistribution, Rescalable
from localstate.core.partitioner import key_bytes, partitions_of_bytes
from localstate.core.serdes import BytesSerde, Serde, StringSerde
from localstate.errors import RescaleError
from localstate.windows.rescale import window_number
from localstate.core.tracebacks import raise_task_error
from localstate.runtime.statedata.sources import load_function

__all__ = ["KeyRouter", "MergeRouter", "redistribution_of", "Placed", "router_for", "routing_bytes"]

Placed = dict[int, tuple[list[bytes], list[bytes]]]
"""new partition -> (keys, values) of the records placed there"""


def redistribution_of(job: JobConfig, config: StoreConfig, merge: Callable[[list[Any]], Any] | None
                      ) -> Redistribution:
    """The store's :class:`Redistribution` from its engine factory (RescaleError if the engine offers
    none). ``merge``: the user's ``rescale_merge`` over decoded values, wrapped in the store's serdes."""
    factory = job.registry.engine_factory(config.engine)
    if not isinstance(factory, Rescalable):
        raise RescaleError(f"store {config.name!r}: its engine {config.engine!r} cannot redistribute its records to "
                           "another partition count (its factory offers no Rescalable capability)",
                           store=config.name, engine=config.engine,
                           hint="keep the partition count, or ask the engine's author for the Rescalable capability "
                                "(docs/plugins.md)")
    merge_values = None
    if merge is not None:
        serde = job.registry.serde(config.value_serde, allow_pickle=job.allow_pickle)

        def merge_values(values: list[bytes]) -> bytes:
            return serde.serialize(merge([serde.deserialize(value) for value in values]))
    return factory.redistribution(config.name, dict(config.options), merge_values)


def routing_bytes(serde: Serde) -> Callable[[list[bytes]], list[bytes]]:
    """Store keys (serialized) -> the bytes the partitioner hashes (``key_bytes`` of the decoded key):
    the serialized bytes themselves for the string and bytes serdes."""
    if type(serde) in (StringSerde, BytesSerde):
        return lambda keys: keys
    decode = serde.deserialize
    return lambda keys: [key_bytes(decode(key)) for key in keys]


class KeyRouter:
    """Routes a store's records by key (or by a user function) from ``old`` to ``new`` partitions,
    checking that each record sits in the partition its key routes to (see the module docstring)."""

    def __init__(self, job: JobConfig, config: StoreConfig, redistribution: Redistribution, old: int, new: int,
                 function: Callable[[Any, Any], Any] | None = None, window_store: bool = False) -> None:
        self.store = config.name
        self.route_of = redistribution.route
        self.merge = redistribution.merge
        self.old, self.new = old, new
        self.function = function
        registry = job.registry
        self.key_serde = registry.serde(config.key_serde, allow_pickle=job.allow_pickle)
        self.value_serde = registry.serde(config.value_serde, allow_pickle=job.allow_pickle) \
            if config.engine == "kv" else None
        self.to_routing = routing_bytes(self.key_serde)
        self.window_store = window_store
        self.window_targets: dict[int, dict[int | None, set[int]]] = {}
        """old partition -> window number (None: not a window's) -> new partitions given its state"""
        self.copies: dict[bytes, dict[int, bytes]] = {}
        """metadata records: key -> old partition -> value"""
        self.receivers: set[int] = set()

    def route(self, partition: int, keys: list[bytes], values: list[bytes]) -> Placed:
        """Place old partition ``partition``'s records; RescaleError if one does not route there."""
        owners = list(map(self.route_of, keys))
        if None in owners or COPY in owners:
            owned_keys, owned_values, store_keys = self._owned(partition, keys, values, owners)
        else:  # every record belongs to a key (a kv store's always do)
            owned_keys, owned_values, store_keys = keys, values, owners
        routing = self._routing(store_keys, owned_values)
        self._check(partition, routing, store_keys)
        targets = partitions_of_bytes(routing, self.new) if self.new > 1 else np.zeros(len(routing), dtype=np.int64)
        placed = _placed(owned_keys, owned_values, targets, self.new)
        self.receivers.update(placed)
        if self.window_store:
            windows = self.window_targets.setdefault(partition, {})
            for store_key, target in zip(store_keys, targets.tolist()):
                windows.setdefault(window_number(self._decode_key(store_key)), set()).add(target)
        return placed

    def _owned(self, partition: int, keys: list[bytes], values: list[bytes], owners: list[Any]
               ) -> tuple[list[bytes], list[bytes], list[Any]]:
        """The records that belong to a key, with their store keys; the metadata records kept aside
        (:attr:`copies`); RescaleError for a record that belongs to no key."""
        owned_keys, owned_values, store_keys = [], [], []
        for key, value, owner in zip(keys, values, owners):
            if owner == COPY:
                self.copies.setdefault(key, {})[partition] = value
            elif owner is None:
                raise RescaleError(f"store {self.store!r} partition {partition}: record {key[:64]!r} belongs to no key "
                                   "and cannot be routed", store=self.store, partition=partition, key=key[:64],
                                   hint="release it first (a reorder buffer's events: drain the job), or keep the "
                                        "partition count")
            else:
                owned_keys.append(key)
                owned_values.append(value)
                store_keys.append(owner)
        return owned_keys, owned_values, store_keys

    def _routing(self, store_keys: list[bytes], values: list[bytes]) -> list[bytes]:
        if self.function is None:
            return self.to_routing(store_keys)
        out = []
        for store_key, value in zip(store_keys, values):
            decoded_value = value if self.value_serde is None else _lenient(self.value_serde, value)
            try:
                out.append(key_bytes(self.function(self._decode_key(store_key), decoded_value)))
            except Exception as exc:  # noqa: BLE001 - the user's function
                raise_task_error(exc, f"the rescale routing function of store {self.store!r}", store=self.store,
                                 hint="fix the store's rescale function; nothing was changed")
        return out

    def _decode_key(self, store_key: bytes) -> Any:
        return _lenient(self.key_serde, store_key)

    def _check(self, partition: int, routing: list[bytes], store_keys: list[bytes]) -> None:
        if self.old == 1 or not routing:
            return
        home = partitions_of_bytes(routing, self.old)
        wrong = np.flatnonzero(home != partition)
        if wrong.size:
            first = int(wrong[0])
            how = "its rescale function gives" if self.function is not None else "the key"
            raise RescaleError(
                f"store {self.store!r} is not keyed by the routing key: partition {partition} holds "
                f"{int(wrong.size)} record(s) whose key does not route there, e.g. {self._decode_key(store_keys[first])!r:.80} "
                f"({how} routes to partition {int(home[first])})", store=self.store, partition=partition,
                key=repr(self._decode_key(store_keys[first]))[:80], records=int(wrong.size),
                hint=f"say how to redistribute it: [stores.{self.store}] rescale = \"all\" or \"one\" (merged; a kv "
                     f"store also needs rescale_merge) or a routing function \"module:function\" "
                     f"(docs/state-as-data.md)")

    def copy_records(self) -> Placed:
        """The metadata records, merged across old partitions, for every new partition that got records."""
        if not self.copies or not self.receivers:
            return {}
        keys, values = [], []
        for key, found in sorted(self.copies.items()):
            keys.append(key)
            values.append(_merge_one(self.store, key, list(found.values()), self.merge))
        return {target: (list(keys), list(values)) for target in sorted(self.receivers)}


class MergeRouter:
    """A store merged as a whole (``rescale = "all"`` or ``"one"``): every key's values from the old
    partitions merged into one (the engine's merge, or the user's ``rescale_merge``), then placed in
    every new partition or in partition 0."""

    def __init__(self, config: StoreConfig, redistribution: Redistribution, new: int) -> None:
        if redistribution.merge is None:
            raise RescaleError(f"store {config.name!r} has rescale = {config.rescale!r}, but its records cannot be "
                               "merged" + (" without a merge function" if config.engine == "kv" else ""),
                               store=config.name, hint=f"add rescale_merge = \"module:function\" to [stores.{config.name}] "
                               "(the merge of one key's values from several partitions)" if config.engine == "kv"
                               else "redistribute it by key or with a routing function")
        self.store = config.name
        self.merge = redistribution.merge
        self.finish = redistribution.finish
        self.targets = list(range(new)) if config.rescale == "all" else [0]
        self.found: dict[bytes, list[bytes]] = {}

    def route(self, partition: int, keys: list[bytes], values: list[bytes]) -> Placed:
        for key, value in zip(keys, values):
            self.found.setdefault(key, []).append(value)
        return {}

    def copy_records(self) -> Placed:
        records = [(key, _merge_one(self.store, key, values, self.merge)) for key, values in sorted(self.found.items())]
        if self.finish is not None:
            records = self.finish(records)
        if not records:
            return {}
        keys = [key for key, _ in records]
        values = [value for _, value in records]
        return {target: (list(keys), list(values)) for target in self.targets}


def _placed(keys: list[bytes], values: list[bytes], targets: np.ndarray, partitions: int) -> Placed:
    """The records grouped by their target partition, each group in the records' order."""
    if not keys:
        return {}
    counts = np.bincount(targets, minlength=partitions)
    if np.count_nonzero(counts) == 1:
        return {int(targets[0]): (list(keys), list(values))}
    order = np.argsort(targets, kind="stable").tolist()
    sorted_keys = [keys[i] for i in order]
    sorted_values = [values[i] for i in order]
    placed: Placed = {}
    start = 0
    for target, count in enumerate(counts.tolist()):
        if count:
            placed[target] = (sorted_keys[start:start + count], sorted_values[start:start + count])
            start += count
    return placed


def _merge_one(store: str, key: bytes, values: list[bytes], merge: Callable[[list[bytes]], bytes] | None) -> bytes:
    """One key's values from several old partitions as one (equal values need no merge only when the
    store has none: a merge such as a sum counts each)."""
    if len(values) == 1:
        return values[0]
    if merge is None and all(value == values[0] for value in values):
        return values[0]
    if merge is None:
        raise RescaleError(f"store {store!r}: record {key[:64]!r} has different values in several partitions and "
                           "the store cannot merge them", store=store, key=key[:64],
                           hint="redistribute the store by key, or give it a merge (rescale_merge for a kv store)")
    return merge(values)


def _lenient(serde: Serde, data: bytes) -> Any:
    try:
        return serde.deserialize(data)
    except Exception:  # noqa: BLE001 - a record the serde cannot read is routed as its bytes
        return data


def router_for(job: JobConfig, config: StoreConfig, old: int, new: int, window_stores: Iterable[str] = ()
               ) -> KeyRouter | MergeRouter:
    """The router of a store under its ``rescale`` config (see the module docstring)."""
    merge = load_function(job, config.rescale_merge, f"stores.{config.name}.rescale_merge") \
        if config.rescale_merge else None
    redistribution = redistribution_of(job, config, merge)
    if config.rescale in ("all", "one"):
        return MergeRouter(config, redistribution, new)
    function = None if config.rescale == "key" else \
        load_function(job, config.rescale, f"stores.{config.name}.rescale")
    return KeyRouter(job, config, redistribution, old, new, function, window_store=config.name in set(window_stores))
