"""The storage-engine contract.

An engine keeps one store partition's state locally and makes it fault tolerant by logging every
change to the changelog writer it is handed. The runtime drives it through three calls
(:meth:`StorageEngine.restore`, :meth:`StorageEngine.flush`, :meth:`StorageEngine.close`) and asks
it one question (:meth:`StorageEngine.local_offset`). Users talk to the engine's own query API
(get/put, push/top, add/count, search, ...).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Protocol, runtime_checkable

from localstate.core.changelog import PLUGIN_API_VERSION, ChangelogRecord, ChangelogWriter, RecordColumns
from localstate.core.options import Option, Removed, validate_options
from localstate.core.serdes import Serde
from localstate.core.text import a
from localstate.core.time import SYSTEM_TIME, TimeSource
from localstate.errors import ConfigError

__all__ = ["StoreContext", "StorageEngine", "StorageEngineFactory", "SerdeUse", "StoreSerdes", "serde_problem",
           "ColumnRestore", "StateFormat", "SerdeColumn", "StateColumns", "LiveEntries", "TimedStore",
           "Redistribution", "Rescalable", "COPY"]


@dataclass(frozen=True)
class StoreContext:
    """Everything an engine needs to open one store partition. Passed explicitly; never global."""

    job: str
    store: str
    partition: int
    directory: Path
    """Local directory owned by this store partition (created by the runtime)."""
    options: Mapping[str, Any]
    """Engine options, already validated by the factory."""
    key_serde: Serde
    value_serde: Serde
    changelog: ChangelogWriter
    """The only place the engine logs its changes."""
    logged: bool = True
    """False when the store has ``changelog = false`` (not fault tolerant)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """What the runtime adds: ``registry`` (the job's plugin registry) and ``state_format``, the layout
    (:class:`StateFormat`) the partition's committed checkpoint recorded for the store (None: none
    recorded), which an engine may trust its stored state to be in."""
    time: TimeSource = SYSTEM_TIME
    """The partition's clock and watermark (:mod:`localstate.core.time`): what a store with a TTL
    reads to decide what has expired. The runtime passes the task partition's time source."""

    def describe(self) -> dict[str, Any]:
        """Context for error messages."""
        return {"store": self.store, "partition": self.partition}


@dataclass(frozen=True)
class SerdeUse:
    """What a store keeps through one of its serdes, as its engine (or a window aggregation) declares
    it: validation refuses a serde that cannot keep it (:meth:`problem`), at the store's
    ``key_serde`` or ``value_serde``.

    ``what`` names it for messages ("items", "window names"); ``types`` are the Python types put
    through the serde, () when they are the task's own objects (any serde may suit them); ``prefix``:
    read back by prefix scans of the encoded keys, so the serde must keep prefixes."""

    what: str
    types: tuple[type, ...] = ()
    prefix: bool = False

    def problem(self, serde: Serde | type[Serde]) -> str | None:
        """Why ``serde`` (a Serde class or instance) cannot keep this, or None. A serde that does not
        declare what it holds (``holds = None``) is trusted."""
        holds = serde.holds
        if holds is None:
            return None
        missing = [t for t in self.types if not any(issubclass(t, held) for held in holds)]
        if missing:
            return (f"the {self.what} are {' or '.join(t.__name__ for t in missing)}, which serde {serde.name!r} does "
                    f"not hold (it holds {', '.join(t.__name__ for t in holds)})")
        if self.prefix and not serde.keeps_prefixes:
            return (f"the {self.what} are read back by prefix, which serde {serde.name!r} does not keep (the bytes "
                    "of a prefix are not a prefix of the bytes)")
        return None


@dataclass(frozen=True)
class StoreSerdes:
    """What a store keeps through its key and its value serde (:class:`SerdeUse`); None: the engine
    does not use that serde (it encodes that part itself, or has none), so setting it is an error."""

    key: SerdeUse | None = SerdeUse("keys")
    value: SerdeUse | None = SerdeUse("values")


def serde_problem(engine: str, options: Mapping[str, Any], role: str, use: SerdeUse | None, serde: Serde | None,
                  *, set_here: bool = True) -> str | None:
    """Why a store of ``engine`` (its validated ``options``) cannot use ``serde`` as its ``role``
    (``"key"`` or ``"value"``) serde where the engine declares ``use``
    (:meth:`StorageEngineFactory.serdes`), or None. Either the engine uses no such serde (an error
    only where the job sets one), or the serde does not hold what the engine puts through it."""
    kind = f" (kind = {options['kind']!r})" if isinstance(options.get("kind"), str) else ""
    if use is None:
        return (f"{a(engine)} store{kind} has no {role} serde: its engine encodes what it keeps there itself "
                f"(remove {role}_serde)") if set_here else None
    if serde is None:
        return None
    problem = use.problem(serde)
    return None if problem is None else f"{a(engine)} store{kind} cannot use serde {serde.name!r}: {problem}"


@runtime_checkable
class ColumnRestore(Protocol):
    """Optional engine capability: restore from :class:`RecordColumns` runs (the bulk path: no
    object per record). Same guarantee as :meth:`StorageEngine.restore`: records applied in order,
    last record per key wins, tombstones delete, nothing re-logged. Recovery uses it when offered."""

    def restore_columns(self, columns: Iterable[RecordColumns]) -> None: ...


@dataclass(frozen=True)
class SerdeColumn:
    """A column decoded with one of the store's serdes, as the state reader shows it: ``type`` is its
    Spark type (``bigint``, ``string``, ``binary``; ``string`` holding JSON text for any other serde)
    and ``decode(data)`` turns the serialized bytes into the column's value."""

    type: str
    decode: Callable[[bytes], Any]


@dataclass(frozen=True)
class StateColumns:
    """How the state reader (``spark.read.format("localstate")``, docs/state-reader.md) shows a store
    partition's committed contents as typed columns (offered by
    :meth:`StorageEngineFactory.state_columns`).

    ``schema`` is the Spark DDL of the columns after ``partition`` (``"item string, score double"``);
    ``rows(entries)`` turns one store partition's committed changelog records (the last record per
    key, tombstones dropped, in key byte order) into one tuple per row, in the schema's order."""

    schema: str
    rows: Callable[[list[tuple[bytes, bytes]]], Iterable[tuple]]


@runtime_checkable
class LiveEntries(Protocol):
    """Optional factory capability: engines whose stored values are more than the serde's bytes (a
    kv store with ``ttl`` stores each value with its expiry) say how a reader of stored entries (the
    state reader, ``localstate inspect``) gets the live ones. ``live_entries`` returns a filter of a
    store partition's stored ``(key, value)`` pairs to the visible ones, each value as its serde wrote
    it, as of ``time``'s current time; None: every stored entry is live and stored as is.
    ``stored_value`` splits one stored value."""

    def live_entries(self, store: str, options: Mapping[str, Any], time: TimeSource
                     ) -> Callable[[Iterable[tuple[bytes, bytes]]], Iterator[tuple[bytes, bytes]]] | None: ...

    def stored_value(self, options: Mapping[str, Any], data: bytes) -> tuple[bytes, float | None]:
        """One stored value (a changelog record's) as its serde wrote it, and when it expires (None:
        never), for tools that show the records themselves."""
        ...


@runtime_checkable
class StateFormat(Protocol):
    """Optional engine capability: a name for how the engine lays out its stored and logged state,
    where options change it (a kv store with ``ttl`` stores an expiry with every value). The runtime
    records it in each checkpoint and refuses to open a store whose checkpoint recorded another: the
    old state would be read in the wrong layout (:class:`~localstate.errors.ConfigError` at
    ``stores.<store>``)."""

    state_format: str
    """e.g. ``"kv"``, ``"kv+ttl"``; stable across releases for one layout"""


@runtime_checkable
class TimedStore(Protocol):
    """Optional engine capability: an engine that reads its time source (:attr:`StoreContext.time`)
    at chosen moments rather than at every access (a kv store with ``ttl`` reads it once per commit).
    ``refresh_time()`` makes it read the time now: the runtime calls it when a batch starts (the time
    an idle partition spent waiting counts), a test driver when it moves time."""

    def refresh_time(self) -> None: ...


COPY = "copy"
"""What :attr:`Redistribution.route` returns for a record that is the store's own metadata (a sketch
store's layout record): it goes to every new partition that holds any of the store's records."""


@dataclass(frozen=True)
class Redistribution:
    """How a rescale (docs/state-as-data.md) moves one store's committed changelog records to
    another partition count.

    ``route(key)`` gives, for a record key, the serialized store key it belongs to: the runtime decodes
    it with the store's key serde and routes it with the job's partitioner (a kv, heap or search
    record: the key itself; a sketch unit: the sketch's name). It returns :data:`COPY` for the store's
    own metadata and None for a record that belongs to no key (a reorder buffer's event): a store
    holding one is refused unless it is redistributed as a whole. ``merge(values)``: the one value of
    a record key found in several old partitions, when a store is merged into every new partition or
    into one (HLL registers: the largest; Bloom words: or'ed; quantile sketches: merged; top-N
    items: the best score); None: the kind cannot merge. ``finish(records)``: applied to each new
    partition's merged records, in key order (a capped top-N keeps its best ``capacity`` items)."""

    route: Callable[[bytes], bytes | str | None]
    merge: Callable[[list[bytes]], bytes] | None = None
    finish: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]] | None = None


@runtime_checkable
class Rescalable(Protocol):
    """Optional factory capability: the engine's records can be redistributed to another partition
    count. ``redistribution`` is given the store's validated options and, for a kind whose values
    only the user can merge (a kv store), ``merge_values``: the user's merge of several values as
    their serde wrote them (None: none configured). An engine factory without this capability is
    refused by a rescale with a :class:`~localstate.errors.RescaleError` naming the store."""

    def redistribution(self, store: str, options: Mapping[str, Any],
                       merge_values: Callable[[list[bytes]], bytes] | None) -> Redistribution: ...


class StorageEngine(ABC):
    """One store partition's local state.

    Contract (what the commit protocol relies on):

    * Every change is eventually written to ``context.changelog`` as ``(key, value | None)``
      records such that keeping only the last record per key restores the same state
      (the changelog is *compactable*).
    * :meth:`flush` appends all changes since the previous flush, calls ``changelog.flush()``
      (which returns the end offset ``n``), then makes local state durable together with ``n``
      as its local offset, atomically.
    * Local state never becomes durable ahead of the changelog: a change may reach local disk
      before :meth:`flush` only if its record was already flushed to the changelog.
    * :meth:`local_offset` returns an offset ``o`` such that the local state equals the changelog's
      state at ``o`` plus, possibly, changes recorded in the changelog at or after ``o``; or None
      when there is no usable local state (the runtime then rebuilds from offset 0).
    * :meth:`restore` applies records in order, last record per key wins, tombstones delete; it
      does not log them again. Restored state becomes durable at the next :meth:`flush`.
    """

    def __init__(self, context: StoreContext) -> None:
        self.context = context

    @abstractmethod
    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Rebuild from changelog records, in order (bulk loading allowed)."""

    @abstractmethod
    def flush(self) -> None:
        """Log pending changes, make the changelog durable, persist local state with its offset."""

    @abstractmethod
    def local_offset(self) -> int | None:
        """The changelog offset local state reflects (see class docstring), or None if unknown."""

    @abstractmethod
    def close(self) -> None:
        """Release resources. Does not flush: unflushed changes are discarded."""

    def __enter__(self) -> "StorageEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StorageEngineFactory(ABC):
    """Builds an engine for one store partition. Registered under ``localstate.engines``.

    Declare options in ``options``; the runtime validates each store's table with
    :meth:`validate_options` before any data is touched.
    """

    plugin_api: ClassVar[int] = PLUGIN_API_VERSION
    options: ClassVar[Mapping[str, Option | Removed]] = {}
    """the store options, by name; an option of an earlier version is declared as :class:`Removed`
    with what to write instead"""
    #: Options other engines have that this one cannot honour (e.g. ``ttl``), mapped to why: a store
    #: that sets one gets a ConfigError at ``stores.<store>.<option>`` saying so, not "unknown option".
    unsupported_options: ClassVar[Mapping[str, str]] = {}
    description: ClassVar[str] = ""

    def validate_options(self, store: str, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Check a store's engine options; problems are reported at ``stores.<store>.<option>``.

        Override :meth:`check_options` for cross-option rules; keep this template as is.
        """
        for name, why in self.unsupported_options.items():
            if name in raw and name not in self.options:
                raise ConfigError.at(f"stores.{store}.{name}", f"store {store!r} sets {name!r}, which its engine "
                                     f"does not support: {why}", hint=f"remove {name} from store {store!r}")
        options = validate_options(self.options, raw, f"stores.{store}")
        self.check_options(store, options)
        return options

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        """Cross-option checks; raise ConfigError with ``stores.<store>.<option>`` paths."""

    def serdes(self, options: Mapping[str, Any]) -> StoreSerdes:
        """What a store of this engine with these validated ``options`` keeps through its key and
        value serdes (:class:`StoreSerdes`). The default: the task's keys and values, through both.
        Validation refuses a serde that is set but unused, or that cannot keep what it is given."""
        return StoreSerdes()

    @abstractmethod
    def create(self, context: StoreContext) -> StorageEngine:
        """Open (or create) the engine for ``context.store`` partition ``context.partition``."""

    def state_columns(self, store: str, options: Mapping[str, Any], key: SerdeColumn,
                      value: SerdeColumn) -> StateColumns | None:
        """Optional: the typed columns the state reader shows this engine's committed contents in,
        given the store's validated ``options`` and its ``key`` and ``value`` serde columns. None
        (the default): one row per changelog key, ``key`` and ``value`` decoded with the serdes."""
        return None
