"""Contract-suite adapters for every built-in engine configuration.

Each adapter draws random changes over a small key universe (so keys are overwritten and deleted
often) and reads the engine's whole logical state through its public query API. The crash child
rebuilds them from this file (``type(adapter)(**adapter.params)``).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from localstate.testing.contract import EngineAdapter
from localstate.testing.time import ManualTime
from localstate.core.serdes import BytesSerde, JsonSerde, Serde, StringSerde

__all__ = ["KvAdapter", "TtlKvAdapter", "TopNAdapter", "ReorderAdapter", "SketchAdapter", "SearchAdapter", "ALL_ADAPTERS",
           "CRASH_ADAPTERS"]


class _ApiAdapter(EngineAdapter):
    """Ops are ``(method, *args)`` calls of the engine's own API; string keys, JSON values; local
    state persists unless the backend is ``memory``."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.persistent = params.get("backend") != "memory"

    def key_serde(self) -> Serde:
        return StringSerde()

    def value_serde(self) -> Serde:
        return JsonSerde()

    def apply(self, engine: Any, op: Any) -> None:
        getattr(engine, op[0])(*op[1:])


class _HeapAdapter(_ApiAdapter):
    def factory(self):
        from localstate.engines.heap import HeapEngineFactory
        return HeapEngineFactory()


class KvAdapter(_ApiAdapter):
    """``engine = "kv"``: puts, deletes and batches over 24 keys. ``write_batch_size`` small makes
    the engine spill (log and write) between flushes."""

    KEYS = [f"k{i:02d}" for i in range(24)]

    def __init__(self, backend: str, write_batch_size: int | None = None, bulk: int = 0,
                 restore_batch_size: int | None = None) -> None:
        params: dict[str, Any] = {"backend": backend}
        if write_batch_size is not None:
            params["write_batch_size"] = write_batch_size
        if restore_batch_size is not None:
            params["restore_batch_size"] = restore_batch_size
        if bulk:
            params["bulk"] = bulk
        super().__init__(**params)
        self.bulk = bulk

    def factory(self):
        from localstate.engines.kv import KeyValueEngineFactory
        return KeyValueEngineFactory()

    def options(self) -> dict[str, Any]:
        options = {k: v for k, v in self.params.items() if k != "bulk"}
        if self.bulk:
            options["write_batch_size"] = self.bulk + 1  # one big atomic write per flush, like a large commit
        return {**options, "cache_size": 4}

    def random_op(self, rng: random.Random) -> Any:
        if self.bulk and rng.random() < 0.5:
            # Rewrite every bulk key with one value: a SIGKILL in the middle of writing them must
            # leave all or none of them (never a mix of two flushes).
            value = [rng.randrange(1000), "." * 200]
            return ("put_all", [(f"bulk{i:05d}", value) for i in range(self.bulk)])
        roll = rng.random()
        if roll < 0.6:
            return ("put", rng.choice(self.KEYS), [rng.randrange(1000), "x" * rng.randrange(5)])
        if roll < 0.8:
            return ("delete", rng.choice(self.KEYS))
        if roll < 0.9:
            return ("put_all", [(k, rng.randrange(100)) for k in rng.sample(self.KEYS, 3)])
        return ("delete_all", rng.sample(self.KEYS, 2))

    def state(self, engine: Any) -> Any:
        return list(engine.all())

    def expected_state(self, ops: Sequence[Any]) -> Any:
        model: dict[str, Any] = {}
        for op in ops:
            if op[0] == "put":
                model[op[1]] = op[2]
            elif op[0] == "delete":
                model.pop(op[1], None)
            elif op[0] == "put_all":
                model.update(op[1])
            else:
                for key in op[1]:
                    model.pop(key, None)
        return sorted(model.items())


class TtlKvAdapter(KvAdapter):
    """``engine = "kv"`` with ``ttl``. ``expiring`` false: ttl = 365 days on the wall clock, so
    nothing expires during a run (every kv case must hold as without ttl). ``expiring`` true: ttl =
    15 s on the adapter's own clock, which each op moves to its own time; the op is committed at once
    (a flush per op, as a task committing every record): entries written more than 15 ops ago are
    gone, and the model says which. (Committing each op keeps the visible state a function of the
    changelog and the clock at every point the suite compares states: an op that moved the clock but
    was discarded by a close would otherwise make the states before and after the reopen differ by
    the entries that expired in between, which is right, but not what the suite compares.)"""

    TTL = 15.0

    def __init__(self, backend: str, expiring: bool = False, write_batch_size: int | None = None) -> None:
        super().__init__(backend, write_batch_size=write_batch_size)
        self.params["expiring"] = expiring
        self.expiring = expiring
        self.clock = ManualTime(processing_time=0.0)
        self._draws = 0

    def options(self) -> dict[str, Any]:
        options = {k: v for k, v in super().options().items() if k != "expiring"}
        return {**options, "ttl": self.TTL if self.expiring else "365d"}

    def time_source(self) -> Any:
        return self.clock if self.expiring else super().time_source()

    def random_op(self, rng: random.Random) -> Any:
        op = super().random_op(rng)
        if not self.expiring:
            return op
        self._draws += 1  # each op's own time, increasing across every check run with this adapter
        return ("at", float(self._draws), op)

    def apply(self, engine: Any, op: Any) -> None:
        if op[0] != "at":
            super().apply(engine, op)
            return
        self.clock.advance_processing_time(op[1] - self.clock.processing_time())
        engine.refresh_time()
        super().apply(engine, op[2])
        engine.flush()

    def expected_state(self, ops: Sequence[Any]) -> Any:
        if not self.expiring:
            return super().expected_state(ops)
        written: dict[str, float] = {}
        for _, at, op in ops:
            keys = [op[1]] if op[0] in ("put", "delete") else [k for k, *_ in op[1]] if op[0] == "put_all" else op[1]
            for key in keys:
                written[key] = at
        now = self.clock.processing_time()
        return [(key, value) for key, value in super().expected_state([op for _, _, op in ops])
                if now < written[key] + self.TTL]


class TopNAdapter(_HeapAdapter):
    """``engine = "heap"``, ``kind = "topn"`` with a capacity (evictions), payloads, removes, pops."""

    ITEMS = [f"item{i:02d}" for i in range(20)]

    def __init__(self, backend: str, capacity: int | None = 8, order: str = "max",
                 restore_batch_size: int | None = None) -> None:
        super().__init__(backend=backend, capacity=capacity, order=order, restore_batch_size=restore_batch_size)

    def options(self) -> dict[str, Any]:
        return {"kind": "topn", **{k: v for k, v in self.params.items() if v is not None}}

    def random_op(self, rng: random.Random) -> Any:
        roll = rng.random()
        if roll < 0.7:
            payload = {"n": rng.randrange(100)} if rng.random() < 0.5 else None
            return ("push", rng.choice(self.ITEMS), rng.randrange(40) / 4, payload)
        if roll < 0.85:
            return ("remove", rng.choice(self.ITEMS))
        if roll < 0.93:
            return ("pop",)
        return ("pop_worst",)

    def state(self, engine: Any) -> Any:
        return [tuple(entry) for entry in engine.top(1000)]


class ReorderAdapter(_HeapAdapter):
    """``engine = "heap"``, ``kind = "reorder"``: out-of-order pushes (some late, dropped), drains."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend=backend)

    def options(self) -> dict[str, Any]:
        return {"kind": "reorder", "max_lateness": 30, "late_policy": "drop", **self.params}

    def random_op(self, rng: random.Random) -> Any:
        roll = rng.random()
        if roll < 0.8:
            return ("push", {"e": rng.randrange(10_000)}, rng.randrange(200))
        if roll < 0.9:
            return ("drain",)
        return ("drain_until", rng.randrange(200))

    def state(self, engine: Any) -> Any:
        return {"buffered": [tuple(event) for event in engine], "watermark": engine.watermark,
                "max_timestamp": engine.max_timestamp, "next_sequence": engine.next_sequence}


class SketchAdapter(_ApiAdapter):
    """``engine = "sketch"``: adds (single and many), merges and deletes over three named sketches;
    the state is every non-empty sketch's registers / words / serialised KLL sketch."""

    NAMES = ["a", "b", "c"]
    KIND_OPTIONS = {"hll": {"precision": 6}, "bloom": {"capacity": 500, "error_rate": 0.05},
                    "quantiles": {"k": 8}}

    def __init__(self, kind: str, backend: str = "rocksdb") -> None:
        super().__init__(kind=kind, backend=backend)

    def factory(self):
        from localstate.engines.sketch import SketchEngineFactory
        return SketchEngineFactory()

    def options(self) -> dict[str, Any]:
        return {**self.params, **self.KIND_OPTIONS[self.params["kind"]]}

    def value_serde(self) -> Serde:
        return BytesSerde()

    def random_op(self, rng: random.Random) -> Any:
        roll = rng.random()
        name = rng.choice(self.NAMES)
        item = rng.random() * 100 if self.params["kind"] == "quantiles" else f"u{rng.randrange(300)}"
        if roll < 0.5:
            return ("add", name, item)
        if roll < 0.8:
            items = [rng.random() * 100 if self.params["kind"] == "quantiles" else f"u{rng.randrange(300)}"
                     for _ in range(rng.randrange(1, 30))]
            return ("add_many", name, items)
        if roll < 0.92:
            return ("merge", name, rng.choice(self.NAMES))
        return ("delete", name)

    def apply(self, engine: Any, op: Any) -> None:
        if op[0] == "merge" and (op[1] == op[2] or not engine.exists(op[2])):
            return  # merging a sketch into itself or from an empty one is not a change worth testing
        getattr(engine, op[0])(*op[1:])

    def state(self, engine: Any) -> Any:
        kind = self.params["kind"]
        result = {}
        for name in engine.names():
            if kind == "hll":
                result[name] = (engine.registers(name).tolist(), engine.count(name))
            elif kind == "bloom":
                result[name] = engine.words(name).tolist()
            else:
                result[name] = engine.serialized(name)
        return result


class SearchAdapter(_ApiAdapter):
    """``engine = "search"`` (tantivy): adds/replaces and deletes over 16 doc ids; the state is every
    document by id plus the matching ids and counts of a few fixed queries."""

    IDS = [f"d{i:02d}" for i in range(16)]
    WORDS = ["apple", "banana", "cherry", "delta", "echo", "fox", "golf", "hotel"]
    QUERIES = ["apple", "banana OR cherry", "title:delta", "tag:red", "n:[0 TO 50]", "fox AND golf"]
    FIELDS = {
        "title": {"type": "text", "stored": True},
        "body": {"type": "text"},
        "tag": {"type": "string", "stored": True},
        "n": {"type": "int", "stored": True, "fast": True},
    }

    def __init__(self) -> None:
        super().__init__()

    def factory(self):
        from localstate.engines.search import SearchEngineFactory
        return SearchEngineFactory()

    def options(self) -> dict[str, Any]:
        return {"fields": self.FIELDS, "writer_memory": "16MB"}

    def random_op(self, rng: random.Random) -> Any:
        doc_id = rng.choice(self.IDS)
        if rng.random() < 0.25:
            return ("delete", doc_id)
        doc = {"title": " ".join(rng.choices(self.WORDS, k=2)), "body": " ".join(rng.choices(self.WORDS, k=6)),
               "tag": rng.choice(["red", "green", "blue"]), "n": rng.randrange(100)}
        return ("add", doc_id, doc)

    def state(self, engine: Any) -> Any:
        docs = {doc_id: engine.get(doc_id) for doc_id in self.IDS}
        queries = {query: (sorted(hit.doc_id for hit in engine.search(query, limit=100)), engine.count(query))
                   for query in self.QUERIES}
        return {"docs": {k: v for k, v in docs.items() if v is not None}, "queries": queries}


#: Every built-in engine configuration the suite runs over.
ALL_ADAPTERS: list[EngineAdapter] = [
    KvAdapter("rocksdb"),
    KvAdapter("lmdb", restore_batch_size=2),
    KvAdapter("memory"),
    KvAdapter("rocksdb", write_batch_size=3),
    TtlKvAdapter("rocksdb"),
    TtlKvAdapter("lmdb"),
    TtlKvAdapter("memory"),
    TtlKvAdapter("rocksdb", expiring=True),
    TtlKvAdapter("lmdb", expiring=True, write_batch_size=3),
    TtlKvAdapter("memory", expiring=True),
    TopNAdapter("rocksdb"),
    TopNAdapter("lmdb", capacity=None, order="min", restore_batch_size=2),
    TopNAdapter("memory"),
    ReorderAdapter("rocksdb"),
    ReorderAdapter("lmdb"),
    ReorderAdapter("memory"),
    SketchAdapter("hll"),
    SketchAdapter("bloom"),
    SketchAdapter("quantiles"),
    SketchAdapter("hll", backend="memory"),
    SketchAdapter("quantiles", backend="lmdb"),
    SearchAdapter(),
]

#: The crash test adds kv stores whose flushes write thousands of keys (long flush windows to kill in),
#: and leaves out the expiring ttl stores (their clock lives in the adapter, and each crash child
#: would start it again from zero).
CRASH_ADAPTERS: list[EngineAdapter] = [a for a in ALL_ADAPTERS if not getattr(a, "expiring", False)] + [KvAdapter("rocksdb", bulk=3000), KvAdapter("lmdb", bulk=3000)]
