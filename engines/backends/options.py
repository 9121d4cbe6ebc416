"""Options of the built-in storage backends: the ``backend`` choice itself and the RocksDB/LMDB tuning
knobs (with the validated RocksDB pass-through table). Every engine kind takes them the same way, as
keys of the store's table (``backend = "rocksdb"``, ``block_cache_size = "64MB"``, ...): adding an
engine kind does not multiply backend configuration. Importing this module loads no backend library.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from localstate.core.options import Option, did_you_mean, parse_size
from localstate.errors import ConfigError, ConfigProblem
from localstate.core.registry import backend_names

__all__ = ["BACKEND_OPTIONS", "ROCKSDB_PASSTHROUGH", "COMPRESSIONS", "DEFAULT_BACKEND", "check_backend_options"]

COMPRESSIONS = ("none", "snappy", "lz4", "zstd")
DEFAULT_BACKEND = "rocksdb"


def _size(value: Any) -> int:
    return parse_size(value)


def _backend_name(value: str) -> str:
    # The names are not listed here: the registry (entry-point group localstate.backends) is the one list.
    known = backend_names()
    if value not in known:
        raise ValueError(f"must be one of {', '.join(map(repr, known))} (installed backend plugins), got {value!r}")
    return value


BACKEND_OPTIONS: dict[str, Option] = {
    "backend": Option(str, DEFAULT_BACKEND, "local structure: a storage backend plugin (built in: rocksdb "
                      "(default), lmdb, or memory, which persists nothing)", parse=_backend_name),
    "restore_batch_size": Option(int, 10_000, "keys per atomic batch when restoring record by record "
                                 "(the bulk path writes runs of the backend's bulk_run_keys)", minimum=1),
    # RocksDB
    "block_cache_size": Option((int, str), "64MB", "RocksDB block cache (e.g. '64MB')", parse=_size),
    "write_buffer_size": Option((int, str), "16MB", "RocksDB memtable size (e.g. '16MB'); larger memtables "
                                "make every insert slower (a deeper skiplist)", parse=_size),
    "compression": Option(str, "lz4", "RocksDB compression", choices=COMPRESSIONS),
    "bloom_bits": Option(int, 10, "RocksDB bloom filter bits per key in table files, also enabling a "
                         "whole-key bloom filter on the memtable; 0 disables both", minimum=0, maximum=64),
    "rocksdb": Option(dict, {}, "extra RocksDB options passed to rocksdict.Options setters "
                      "(see ROCKSDB_PASSTHROUGH)"),
    # LMDB
    "map_size": Option((int, str), "64MB", "initial LMDB map size; doubles automatically when full",
                       parse=_size, minimum=1 << 16),
    "lmdb_sync": Option(bool, True, "fsync LMDB at each commit (false: faster, a machine crash may lose "
                        "recent commits)"),
}
# Every engine kind takes these: did-you-mean suggests an engine's own options first (Option.shared).
BACKEND_OPTIONS = {name: replace(option, shared=True) for name, option in BACKEND_OPTIONS.items()}


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"expected an integer, got {type(v).__name__} {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected a boolean, got {type(v).__name__} {v!r}")
    return v


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {type(v).__name__} {v!r}")
    return float(v)


#: Pass-through names accepted in ``rocksdb = { ... }``: each maps to ``rocksdict.Options.set_<name>``.
ROCKSDB_PASSTHROUGH: dict[str, Callable[[Any], Any]] = {
    "max_open_files": _int,
    "max_background_jobs": _int,
    "max_subcompactions": _int,
    "max_write_buffer_number": _int,
    "min_write_buffer_number_to_merge": _int,
    "level_zero_file_num_compaction_trigger": _int,
    "level_zero_slowdown_writes_trigger": _int,
    "level_zero_stop_writes_trigger": _int,
    "num_levels": _int,
    "target_file_size_base": _size,
    "max_bytes_for_level_base": _size,
    "max_bytes_for_level_multiplier": _float,
    "max_total_wal_size": _size,
    "db_write_buffer_size": _size,
    "bytes_per_sync": _size,
    "wal_bytes_per_sync": _size,
    "compaction_readahead_size": _size,
    "max_log_file_size": _size,
    "keep_log_file_num": _int,
    "use_fsync": _bool,
    "paranoid_checks": _bool,
    "disable_auto_compactions": _bool,
    "level_compaction_dynamic_level_bytes": _bool,
    "optimize_filters_for_hits": _bool,
    "memtable_prefix_bloom_ratio": _float,
    "memtable_whole_key_filtering": _bool,
    "advise_random_on_open": _bool,
    "use_direct_reads": _bool,
    "use_direct_io_for_flush_and_compaction": _bool,
    "allow_concurrent_memtable_write": _bool,
    "enable_pipelined_write": _bool,
    "enable_write_thread_adaptive_yield": _bool,
    "unordered_write": _bool,
    "atomic_flush": _bool,
}


def check_backend_options(store: str, options: dict[str, Any], prefix: str = "") -> None:
    """Validate and normalise the ``rocksdb`` pass-through table in place.

    Problems are reported at ``stores.<store>.<prefix>rocksdb.<key>``.
    """
    problems: list[ConfigProblem] = []
    raw: Mapping[str, Any] = options.get("rocksdb") or {}
    clean: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"stores.{store}.{prefix}rocksdb.{key}"
        check = ROCKSDB_PASSTHROUGH.get(key)
        if check is None:
            problems.append(ConfigProblem(path, "unknown or unsupported RocksDB option"
                                          + did_you_mean(key, list(ROCKSDB_PASSTHROUGH))
                                          + "; supported: " + ", ".join(sorted(ROCKSDB_PASSTHROUGH))))
            continue
        try:
            clean[key] = check(value)
        except ValueError as exc:
            problems.append(ConfigProblem(path, str(exc)))
    if problems:
        raise ConfigError(problems)
    options["rocksdb"] = clean
