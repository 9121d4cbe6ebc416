"""Options of the key-value engine: its own (object cache, write batching) plus the shared backend
options (``localstate.engines.backends.options``)."""

from __future__ import annotations

from typing import Any

from localstate.core.options import Option, parse_duration
from localstate.core.time import EVENT_TIME, PROCESSING_TIME
from localstate.errors import ConfigError
from localstate.engines.backends.options import (BACKEND_OPTIONS, COMPRESSIONS, ROCKSDB_PASSTHROUGH,
                                                 check_backend_options)

__all__ = ["KV_OPTIONS", "ROCKSDB_PASSTHROUGH", "check_kv_options", "COMPRESSIONS", "TTL_UPDATES"]

#: ``ttl_update`` values: what sets an entry's expiry (Flink's ``StateTtlConfig.UpdateType``).
TTL_UPDATES = ("on_write", "on_read_and_write")


def _ttl(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be a positive duration such as '7d', '12h' or 3600, got {value!r}")
    return seconds

KV_OPTIONS: dict[str, Option] = {
    "backend": BACKEND_OPTIONS["backend"],
    "cache_size": Option(int, 10_000, "entries (at most) in the object cache (two generations of dicts, see "
                         "docs/kv.md); 0 disables caching of read objects", minimum=0),
    "write_batch_size": Option(int, 10_000, "pending changed keys that trigger a spill (changelog flush, "
                               "then backend write) before the next commit; each spill costs a changelog "
                               "fsync; a pending key holds its key and value objects (+ ~150 bytes)", minimum=1),
    "write_behind": Option(bool, False, "apply each commit's backend write on a background thread once the "
                           "changelog is flushed (the commit is durable then); overlaps LMDB's commit fsync "
                           "with the next batch's processing; a crash before the write lands is replayed from "
                           "the changelog at the next open"),
    "ttl": Option((int, float, str), None, "time to live of an entry (e.g. '7d', '12h', 3600 seconds): an "
                  "entry not written for this long is never read again and is deleted, with a changelog "
                  "tombstone, by the bounded sweep of each flush (docs/time/ttl.md); a ttl of an hour or "
                  "more expires at the whole second, rounded up; unset: entries never expire", parse=_ttl,
                  synonyms=("expiry", "expire", "expire_after", "retention", "time_to_live")),
    "ttl_time": Option(str, PROCESSING_TIME, "the time domain ttl is measured in: 'processing' (the clock, "
                       "as Flink and Spark) or 'event' (the partition's watermark)",
                       choices=(PROCESSING_TIME, EVENT_TIME)),
    "ttl_update": Option(str, "on_write", "what restarts an entry's ttl: 'on_write' (every put, as Flink's "
                         "OnCreateAndWrite) or 'on_read_and_write' (a get of a live entry too, which logs it "
                         "again)", choices=TTL_UPDATES),
    "ttl_sweep": Option(int, 1_000, "entries (at most) the expiry sweep examines per flush, resuming where "
                        "the previous flush stopped; bounds the cost of purging expired entries per commit",
                        minimum=1),
    **{name: option for name, option in BACKEND_OPTIONS.items() if name != "backend"},
}


def check_kv_options(store: str, options: dict[str, Any], prefix: str = "") -> None:
    """Validate the backend options of a kv store (see :func:`check_backend_options`) and its ttl
    options (the ``ttl_*`` options mean nothing without ``ttl``)."""
    check_backend_options(store, options, prefix)
    if options.get("ttl") is None:
        for name in ("ttl_time", "ttl_update", "ttl_sweep"):
            if options.get(name) != KV_OPTIONS[name].default:
                raise ConfigError.at(f"stores.{store}.{prefix}{name}",
                                     f"store {store!r} sets {name} but no ttl",
                                     hint=f"set ttl (e.g. ttl = \"7d\") on store {store!r}, or remove {name}")
