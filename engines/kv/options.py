"""Options of the key-value engine: its own (object cache, write batching) plus the shared backend
options (``localstate.engines.backends.options``)."""

from __future__ import annotations

from typing import Any

from localstate.core.options import Option
from localstate.engines.backends.options import (BACKEND_OPTIONS, COMPRESSIONS, ROCKSDB_PASSTHROUGH,
                                                 check_backend_options)

__all__ = ["KV_OPTIONS", "ROCKSDB_PASSTHROUGH", "check_kv_options", "COMPRESSIONS"]

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
    **{name: option for name, option in BACKEND_OPTIONS.items() if name != "backend"},
}


def check_kv_options(store: str, options: dict[str, Any], prefix: str = "") -> None:
    """Validate the backend options of a kv store (see :func:`check_backend_options`)."""
    check_backend_options(store, options, prefix)
