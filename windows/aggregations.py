"""Window aggregations: functions from a window's records to a value, each kept in a store.

An :class:`Aggregation` names the engine kind it keeps its per-window state in and binds to that
store (:meth:`Aggregation.bind`), giving a :class:`WindowState`: per window *name* (a string the
windowed operator makes of the window and the key), ``add`` a record's value, read the ``result``,
``merge`` windows (session windows merging) and ``delete`` a window once it is emitted or expired.

* scalar folds in a ``kv`` store: :func:`count`, :func:`sum_of`, :func:`min_of`, :func:`max_of`,
  :func:`reduce` (one entry per window: the accumulator);
* :func:`distinct_count` in a ``sketch`` store of ``kind = "hll"`` (one HyperLogLog per window);
* :func:`quantiles` in a ``sketch`` store of ``kind = "quantiles"`` (one KLL sketch per window);
* :func:`top_n` in a ``heap`` store of ``kind = "topn"`` (the window's items, ranked).

The result of each is what the plain-Python reference model (:mod:`localstate.windows.reference`)
computes with :meth:`Aggregation.reference`, exactly for the folds and within the sketch's error for
the estimates.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from localstate.core.engine import SerdeUse
from localstate.core.task import KeyValueStore
from localstate.core.text import a
from localstate.errors import ConfigError

__all__ = ["Aggregation", "WindowState", "Fold", "count", "sum_of", "min_of", "max_of", "reduce",
           "distinct_count", "quantiles", "top_n", "HyperLogLogStore", "QuantilesStore", "TopNStore"]

Extract = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


class WindowState(ABC):
    """An aggregation's per-window state in one store partition. Window names are strings."""

    @abstractmethod
    def add(self, name: str, value: Any) -> None:
        """Add a record's value to window ``name``."""

    @abstractmethod
    def result(self, name: str) -> Any:
        """The window's aggregate (None when the window has no state)."""

    @abstractmethod
    def merge(self, into: str, source: str) -> None:
        """Fold window ``source``'s state into window ``into`` (``source`` is deleted after)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Forget window ``name`` (a changelog tombstone at the next commit)."""

    @abstractmethod
    def names(self, prefix: str) -> list[str]:
        """The names of the windows with state whose name starts with ``prefix``, in order."""

    def take(self, prefix: str) -> list[tuple[str, Any]]:
        """``(name, result)`` of every window named ``prefix...``, in name order, each deleted."""
        taken = [(name, self.result(name)) for name in self.names(prefix)]
        for name, _ in taken:
            self.delete(name)
        return taken


class Aggregation(ABC):
    """A window aggregation: what the windowed operator keeps per window, and in which engine."""

    engine: str = "kv"
    """The engine kind of the store it keeps its state in (``kv``, ``sketch``, ``heap``)."""
    kind: str | None = None
    """The store's ``kind`` option it needs (``hll``, ``quantiles``, ``topn``), if the engine has kinds."""
    name: str = ""
    """How messages name it: ``count``, ``top_n``, ..."""

    def needs(self, aligned: bool) -> dict[str, SerdeUse]:
        """What it puts through its store's ``key`` and ``value`` serdes (validation refuses a serde
        that cannot keep it): window names, strings, as keys; for aligned windows (tumbling,
        hopping) read back by prefix, since a window closes for every key with one scan."""
        return {"key": SerdeUse("window names", (str,))}

    @abstractmethod
    def bind(self, store: Any, name: str) -> WindowState:
        """The state of this aggregation in ``store``, the job's store ``name`` (its typed API,
        checked to be of the right kind: a ConfigError naming the store otherwise)."""

    @abstractmethod
    def reference(self, values: list[Any]) -> Any:
        """The aggregate of ``values`` (a window's values in arrival order) in plain Python: what a
        window's result should be (exactly, or what the estimate approximates)."""


# -- scalar folds in a kv store -------------------------------------------------------------------

class Fold(Aggregation):
    """A fold kept in a ``kv`` store: ``step(acc, value)`` from ``acc = None`` (no record yet),
    ``combine(a, b)`` when two windows merge, ``finish(acc)`` the emitted result. The accumulator
    must round-trip the store's value serde (``int`` for counts, ``json`` for most others)."""

    engine = "kv"

    def __init__(self, name: str, step: Callable[[Any, Any], Any], combine: Callable[[Any, Any], Any],
                 finish: Callable[[Any], Any] = _identity, *, holds: tuple[type, ...] = ()) -> None:
        self.name = name
        self.step = step
        self.combine = combine
        self.finish = finish
        self.holds = holds
        """the accumulator's types, when the fold alone decides them (a count's int); () when they
        are the task's values (a sum of what ``of`` returns)"""

    def needs(self, aligned: bool) -> dict[str, SerdeUse]:
        """Window names as keys (read back by prefix for aligned windows) and the accumulator as the
        value: an int for :func:`count`, the task's values otherwise."""
        return {"key": SerdeUse("window names", (str,), prefix=aligned),
                "value": SerdeUse(f"{self.name} accumulators", self.holds)}

    def bind(self, store: Any, name: str) -> WindowState:
        return _KvFold(_typed(store, name, KeyValueStore, "kv", self.name), self)

    def reference(self, values: list[Any]) -> Any:
        acc = None
        for value in values:
            acc = self.step(acc, value)
        return None if acc is None else self.finish(acc)

    def __repr__(self) -> str:
        return f"{self.name}()"


class _KvFold(WindowState):
    __slots__ = ("store", "get", "put", "remove", "step", "combine", "finish")

    def __init__(self, store: KeyValueStore, fold: Fold) -> None:
        # Bound methods once: add() runs per record and window.
        self.store = store
        self.get, self.put, self.remove = store.get, store.put, store.delete
        self.step, self.combine, self.finish = fold.step, fold.combine, fold.finish

    def add(self, name: str, value: Any) -> None:
        self.put(name, self.step(self.get(name), value))

    def result(self, name: str) -> Any:
        acc = self.get(name)
        return None if acc is None else self.finish(acc)

    def merge(self, into: str, source: str) -> None:
        other = self.get(source)
        if other is None:
            return
        acc = self.get(into)
        self.put(into, other if acc is None else self.combine(acc, other))

    def delete(self, name: str) -> None:
        self.remove(name)

    def names(self, prefix: str) -> list[str]:
        with self.store.prefix(prefix) as entries:  # type: ignore[attr-defined]
            return [name for name, _ in entries]

    def take(self, prefix: str) -> list[tuple[str, Any]]:
        # One scan reads the accumulators too.
        with self.store.prefix(prefix) as entries:  # type: ignore[attr-defined]
            found = list(entries)
        finish = self.finish
        self.store.delete_all([name for name, _ in found])
        return [(name, finish(acc)) for name, acc in found]


def _count_step(acc: Any, value: Any) -> int:
    return 1 if acc is None else acc + 1


def _add(a: Any, b: Any) -> Any:
    return a + b


def count() -> Fold:
    """The number of records in the window."""
    return Fold("count", _count_step, _add, holds=(int,))


def sum_of(of: Extract = _identity) -> Fold:
    """The sum of ``of(value)`` over the window's records (the value itself by default)."""
    return Fold("sum", lambda acc, v: of(v) if acc is None else acc + of(v), _add)


def min_of(of: Extract = _identity) -> Fold:
    """The least ``of(value)`` of the window's records."""
    return Fold("min", lambda acc, v: of(v) if acc is None else min(acc, of(v)), min)


def max_of(of: Extract = _identity) -> Fold:
    """The greatest ``of(value)`` of the window's records."""
    return Fold("max", lambda acc, v: of(v) if acc is None else max(acc, of(v)), max)


def reduce(function: Callable[[Any, Any], Any], of: Extract = _identity) -> Fold:
    """``function`` folded over ``of(value)`` of the window's records, first to last. When windows
    merge (sessions), ``function(earlier_state, later_state)`` combines them, so it should be
    associative (and commutative, for records that arrive out of order)."""
    return Fold("reduce", lambda acc, v: of(v) if acc is None else function(acc, of(v)), function)


# -- estimates in sketch and heap stores ----------------------------------------------------------

class _NamedSketches(Protocol):
    """What every sketch store offers the windows: named sketches, merged and deleted by name."""

    def exists(self, name: Any) -> bool: ...

    def merge(self, into: Any, *sources: Any) -> None: ...

    def delete(self, name: Any) -> None: ...

    def names(self) -> list[Any]: ...


@runtime_checkable
class HyperLogLogStore(_NamedSketches, Protocol):
    """What a sketch store of ``kind = "hll"`` offers the windows."""

    def add(self, name: Any, item: Any) -> None: ...

    def count(self, name: Any) -> float: ...


@runtime_checkable
class QuantilesStore(_NamedSketches, Protocol):
    """What a sketch store of ``kind = "quantiles"`` offers the windows."""

    def add(self, name: Any, value: float) -> None: ...

    def quantiles(self, name: Any, qs: Iterable[float]) -> Any: ...


@runtime_checkable
class TopNStore(Protocol):
    """What a heap store of ``kind = "topn"`` offers the windows."""

    def push(self, item: Any, score: Any, payload: Any = None) -> Any: ...

    def score(self, item: Any) -> float | None: ...

    def remove(self, item: Any) -> Any: ...

    def __iter__(self) -> Any: ...


def _typed(store: Any, name: str, protocol: type, engine: str, aggregation: str) -> Any:
    """``store`` if it offers ``protocol``, else a ConfigError at ``stores.<name>.engine``."""
    if not isinstance(store, protocol):
        raise ConfigError.at(f"stores.{name}.engine", f"the {aggregation} window aggregation keeps its state in "
                             f"store {name!r}, which must be {a(engine)} store ({protocol.__name__}); the job's "
                             f"engine gives {a(type(store).__name__)}",
                             hint=f"declare [stores.{name}] with engine = {engine.split()[0]!r}, or give the "
                                  f"aggregation a store of that kind")
    return store


class _DistinctCount(Aggregation):
    engine, kind, name = "sketch", "hll", "distinct_count"

    def __init__(self, of: Extract) -> None:
        self.of = of

    def bind(self, store: Any, name: str) -> WindowState:
        return _HllState(_typed(store, name, HyperLogLogStore, 'sketch (kind = "hll")', "distinct_count"), self.of)

    def reference(self, values: list[Any]) -> Any:
        return len({self.of(v) for v in values}) if values else None


class _SketchState(WindowState):
    """A window state of one named sketch per window (HLL, KLL): merged and deleted by name."""

    store: Any

    def merge(self, into: str, source: str) -> None:
        if self.store.exists(source):
            self.store.merge(into, source)

    def delete(self, name: str) -> None:
        self.store.delete(name)

    def names(self, prefix: str) -> list[str]:
        return sorted(name for name in self.store.names() if name.startswith(prefix))


class _HllState(_SketchState):
    def __init__(self, store: HyperLogLogStore, of: Extract) -> None:
        self.store, self.of = store, of

    def add(self, name: str, value: Any) -> None:
        self.store.add(name, self.of(value))

    def result(self, name: str) -> Any:
        return round(self.store.count(name)) if self.store.exists(name) else None


def distinct_count(of: Extract = _identity) -> Aggregation:
    """The number of distinct ``of(value)`` in the window, estimated by a HyperLogLog per window
    (a sketch store with ``kind = "hll"``; its ``precision`` sets the error)."""
    return _DistinctCount(of)


class _Quantiles(Aggregation):
    engine, kind, name = "sketch", "quantiles", "quantiles"

    def __init__(self, qs: tuple[float, ...], of: Extract) -> None:
        self.qs, self.of = qs, of

    def bind(self, store: Any, name: str) -> WindowState:
        return _KllState(_typed(store, name, QuantilesStore, 'sketch (kind = "quantiles")', "quantiles"), self)

    def reference(self, values: list[Any]) -> Any:
        if not values:
            return None
        # The smallest value whose normalised rank reaches q: what a KLL sketch answers while it
        # holds every value (fewer than its k), and approximates beyond.
        ordered = sorted(float(self.of(v)) for v in values)
        return [ordered[max(0, math.ceil(q * len(ordered)) - 1)] for q in self.qs]


class _KllState(_SketchState):
    def __init__(self, store: QuantilesStore, aggregation: _Quantiles) -> None:
        self.store, self.qs, self.of = store, list(aggregation.qs), aggregation.of

    def add(self, name: str, value: Any) -> None:
        self.store.add(name, float(self.of(value)))

    def result(self, name: str) -> Any:
        return [float(x) for x in self.store.quantiles(name, self.qs)] if self.store.exists(name) else None


def quantiles(qs: Iterable[float], of: Extract = _identity) -> Aggregation:
    """The ``qs`` quantiles (each in [0, 1]) of ``of(value)`` in the window, estimated by a KLL
    sketch per window (a sketch store with ``kind = "quantiles"``)."""
    qs = tuple(float(q) for q in qs)
    if not qs or any(not 0.0 <= q <= 1.0 for q in qs):
        raise ValueError(f"quantiles: give one or more fractions from 0 to 1, got {qs!r}")
    return _Quantiles(qs, of)


class _TopN(Aggregation):
    engine, kind, name = "heap", "topn", "top_n"

    def needs(self, aligned: bool) -> dict[str, SerdeUse]:
        """Its items are strings, ``"<window name>\\x1f<item>"``, as the heap's keys."""
        return {"key": SerdeUse("window items", (str,))}

    def __init__(self, n: int, item: Extract, score: Extract | None) -> None:
        self.n, self.item, self.score = n, item, score

    def bind(self, store: Any, name: str) -> WindowState:
        return _HeapState(_typed(store, name, TopNStore, 'heap (kind = "topn")', "top_n"), self)

    def reference(self, values: list[Any]) -> Any:
        if not values:
            return None
        scores: dict[str, float] = {}
        for value in values:
            item = _item_text(self.item(value))
            if self.score is None:
                scores[item] = scores.get(item, 0.0) + 1.0
            else:
                scores[item] = max(scores.get(item, float("-inf")), float(self.score(value)))
        return _best(scores.items(), self.n)


def _item_text(item: Any) -> str:
    return item if isinstance(item, str) else json.dumps(item, sort_keys=True)


def _best(scored: Iterable[tuple[str, float]], n: int) -> list[list[Any]]:
    """The ``n`` best ``[item, score]``, best first; ties by item, so the order is deterministic."""
    return [[item, score] for item, score in sorted(scored, key=lambda e: (-e[1], e[0]))[:n]]


_SEP = "\x1f"  # between a window name and an item in a heap item (no window name contains it)


class _HeapState(WindowState):
    """The window's items in the heap store as ``"<window name>\\x1f<item>"``. Items of every open
    window share the store, so reading or deleting a window walks the store's items: the heap suits
    few open windows of many items (a top-N of pages per hour), not many keys' small windows."""

    def __init__(self, store: TopNStore, aggregation: _TopN) -> None:
        self.store, self.n, self.item, self.score = store, aggregation.n, aggregation.item, aggregation.score

    def add(self, name: str, value: Any) -> None:
        item = f"{name}{_SEP}{_item_text(self.item(value))}"
        old = self.store.score(item)
        if self.score is None:
            self.store.push(item, (old or 0.0) + 1.0)
        else:
            score = float(self.score(value))
            if old is None or score > old:
                self.store.push(item, score)

    def _items(self, name: str) -> list[tuple[str, float]]:
        prefix = name + _SEP
        return [(entry.item, entry.score) for entry in self.store if entry.item.startswith(prefix)]

    def result(self, name: str) -> Any:
        cut = len(name) + 1
        items = [(item[cut:], score) for item, score in self._items(name)]
        return _best(items, self.n) if items else None

    def merge(self, into: str, source: str) -> None:
        cut = len(source) + 1
        for item, score in self._items(source):
            target = f"{into}{_SEP}{item[cut:]}"
            old = self.store.score(target)
            if self.score is None:
                self.store.push(target, (old or 0.0) + score)
            elif old is None or score > old:
                self.store.push(target, score)

    def delete(self, name: str) -> None:
        for item, _ in self._items(name):
            self.store.remove(item)

    def names(self, prefix: str) -> list[str]:
        return sorted({entry.item.split(_SEP, 1)[0] for entry in self.store if entry.item.startswith(prefix)})


def top_n(n: int, item: Extract = _identity, score: Extract | None = None) -> Aggregation:
    """The ``n`` best items of the window as ``[item, score]`` pairs, best first: by how many
    records name ``item(value)`` (without ``score``), or by the highest ``score(value)`` seen for
    it. Kept in a heap store (``kind = "topn"``, ``order = "max"``)."""
    if n < 1:
        raise ValueError(f"top_n: n must be at least 1, got {n!r}")
    return _TopN(n, item, score)
