"""The ``sketch`` engine: named HyperLogLog, Bloom filter or KLL quantile sketches per store.

Configure a store with ``engine = "sketch"`` and ``kind = "hll" | "bloom" | "quantiles"``::

    [stores.visitors]
    engine = "sketch"
    key_serde = "string"   # sketch names
    kind = "hll"
    precision = 12         # 4..16, like datasketch.HyperLogLog(p)

The changelog records deltas (changed registers / words, or one serialised quantile sketch per
flush), never inputs; see ``docs/sketch.md``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from localstate.core.registry import open_store_backend
from localstate.core.engine import (COPY, Redistribution, SerdeColumn, SerdeUse, StateColumns, StorageEngine,
                                    StorageEngineFactory, StoreContext, StoreSerdes)
from localstate.core.logged import LoggedStore
from localstate.core.options import Option
from localstate.core.text import a
from localstate.engines.backends.options import BACKEND_OPTIONS, check_backend_options
from localstate.engines.sketch.bloom import MAX_WORDS, BloomFilter, bloom_size
from localstate.engines.sketch.engine import (BloomFilterEngine, HyperLogLogEngine, QuantilesEngine,
                                              SketchEngine)
from localstate.engines.sketch.hashing import HASHES, encode_item, fast_hash32, fast_hash64
from localstate.engines.sketch.hll import MAX_PRECISION, MIN_PRECISION, HyperLogLog
from localstate.engines.sketch.kll import MAX_K, MIN_K, KllSketch, rank_error
from localstate.errors import ConfigError, ConfigProblem
from localstate.engines.sketch.keys import META_KEY, split_key
from localstate.engines.sketch.columns import sketch_columns
from localstate.engines.sketch.merging import merge_units

__all__ = [
    "SketchEngineFactory",
    "SketchEngine",
    "HyperLogLogEngine",
    "BloomFilterEngine",
    "QuantilesEngine",
    "HyperLogLog",
    "BloomFilter",
    "KllSketch",
    "bloom_size",
    "rank_error",
    "encode_item",
    "fast_hash32",
    "fast_hash64",
    "KINDS",
]

KINDS = ("hll", "bloom", "quantiles")

DEFAULTS: dict[str, Any] = {"precision": 12, "capacity": 1_000_000, "error_rate": 0.01, "k": 200}
#: Options that only make sense for one kind (None default = "not given"; filled in check_options).
_KIND_OF = {"precision": "hll", "capacity": "bloom", "error_rate": "bloom", "k": "quantiles", "hash": ("hll", "bloom")}
_DEFAULT_HASH = {"hll": "datasketch", "bloom": "fast"}


def _error_rate(value: float) -> float:
    if not 0.0 < value < 1.0:
        raise ValueError(f"must be between 0 and 1 (exclusive), got {value!r}")
    return value


class SketchEngineFactory(StorageEngineFactory):
    """Creates a :class:`HyperLogLogEngine`, :class:`BloomFilterEngine` or :class:`QuantilesEngine`."""

    description: ClassVar[str] = ("probabilistic sketches (HyperLogLog, Bloom filter, KLL quantiles) whose "
                                  "changelog logs changed registers/words, not inputs")
    unsupported_options: ClassVar[Mapping[str, str]] = {
        "ttl": "a sketch's registers merge every item ever added, so one item cannot expire from them, "
               "and expiring whole sketches is not built (docs/time/ttl.md); keep a sketch per time "
               "window instead"}
    options: ClassVar[Mapping[str, Option]] = {
        "kind": Option(str, doc="which sketch the store holds: hll, bloom or quantiles", choices=KINDS),
        "precision": Option(int, None, f"HLL: p, 2**p registers ({MIN_PRECISION}..{MAX_PRECISION}, default 12; "
                            "relative error 1.04/sqrt(2**p))", minimum=MIN_PRECISION, maximum=MAX_PRECISION),
        "hash": Option(str, None, "hll/bloom: 'datasketch' (SHA-1 as datasketch; default for hll) or 'fast' "
                       "(numpy-vectorised 64-bit hash; default for bloom)", choices=HASHES),
        "capacity": Option(int, None, "bloom: expected number of distinct items (default 1000000)", minimum=1,
                           synonyms=("size", "expected_items", "max_items", "items", "n")),
        "error_rate": Option(float, None, "bloom: false-positive rate at capacity (default 0.01)",
                             parse=_error_rate),
        "k": Option(int, None, f"quantiles: KLL accuracy parameter ({MIN_K}..{MAX_K}, default 200: rank "
                    "error about 1.3%)", minimum=MIN_K, maximum=MAX_K),
        **BACKEND_OPTIONS,
    }

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        kind = options["kind"]
        problems: list[ConfigProblem] = []
        for name, kinds in _KIND_OF.items():
            kinds = kinds if isinstance(kinds, tuple) else (kinds,)
            if options.get(name) is not None and kind not in kinds:
                problems.append(ConfigProblem(f"stores.{store}.{name}", f"does not apply to kind = {kind!r} "
                                              f"(it is {a(' or '.join(kinds))} option)"))
        for name, default in DEFAULTS.items():
            if options.get(name) is None:
                options[name] = default
        if options.get("hash") is None:
            options["hash"] = _DEFAULT_HASH.get(kind, "datasketch")
        if kind == "bloom" and not problems:
            bits, _ = bloom_size(options["capacity"], options["error_rate"])
            if bits // 64 > MAX_WORDS:
                problems.append(ConfigProblem(f"stores.{store}.capacity",
                                              f"needs {bits} bits, more than the maximum {MAX_WORDS * 64}"))
        if problems:
            raise ConfigError(problems, hint="remove the options that do not apply, or fix their values")
        check_backend_options(store, options)

    def serdes(self, options: Mapping[str, Any]) -> StoreSerdes:
        """The task's sketch names (key serde); the sketches themselves are registers, words or
        compactors the engine encodes: no value serde."""
        return StoreSerdes(key=SerdeUse("sketch names"), value=None)

    def create(self, context: StoreContext) -> StorageEngine:
        options = context.options
        if "hash" not in options or options.get("precision") is None:
            options = self.validate_options(context.store, dict(options))
        backend = open_store_backend(context, options)
        try:
            logged = LoggedStore(context, backend)
        except BaseException:
            backend.close()
            raise
        store_options = {"restore_batch_size": int(options.get("restore_batch_size") or 10_000)}
        try:
            kind = options["kind"]
            if kind == "hll":
                return HyperLogLogEngine(context, logged, options["precision"], options["hash"], **store_options)
            if kind == "bloom":
                bits, hashes = bloom_size(options["capacity"], options["error_rate"])
                return BloomFilterEngine(context, logged, options["capacity"], options["error_rate"], bits, hashes,
                                        options["hash"], **store_options)
            return QuantilesEngine(context, logged, options["k"], **store_options)
        except BaseException:
            logged.close()
            raise

    def state_columns(self, store: str, options: Mapping[str, Any], key: SerdeColumn,
                      value: SerdeColumn) -> StateColumns:
        """One row per sketch: :func:`~localstate.engines.sketch.columns.sketch_columns`."""
        return sketch_columns(options, key)

    def redistribution(self, store: str, options: Mapping[str, Any],
                       merge_values: Any = None) -> Redistribution:
        """``core.engine.Rescalable``: a unit goes with its sketch's name (the layout record is copied);
        sketches merge exactly as :meth:`merge` does (HLL registers: the largest, Bloom words: or'ed,
        quantile sketches: KLL merge)."""
        def route(key: bytes) -> bytes | str | None:
            if key == META_KEY:
                return COPY
            parsed = split_key(key)
            return None if parsed is None else parsed[0]
        kind = options["kind"]
        return Redistribution(route, lambda values: merge_units(kind, values))
