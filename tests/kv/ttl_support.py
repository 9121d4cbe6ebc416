"""Shared by the ttl durability tests: a kv store with ttl on a given changelog partition, on a
hand-moved clock, and the keys every read path shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localstate.core.changelog import ChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import JsonSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory, TtlKeyValueEngine
from localstate.testing.time import ManualTime


def open_ttl_store(directory: Path, changelog: ChangelogPartition, time: ManualTime, **options: Any
                   ) -> TtlKeyValueEngine:
    directory.mkdir(parents=True, exist_ok=True)
    factory = KeyValueEngineFactory()
    validated = factory.validate_options("sessions", {"ttl": "10s", **options})
    engine = factory.create(StoreContext(job="job", store="sessions", partition=0, directory=directory,
                                         options=validated, key_serde=StringSerde(), value_serde=JsonSerde(),
                                         changelog=changelog, time=time))
    assert isinstance(engine, TtlKeyValueEngine)
    return engine


def visible_keys(kv: TtlKeyValueEngine, keys: list[str]) -> set[str]:
    """The keys every read path shows (they must agree)."""
    by_get = {key for key in keys if kv.get(key) is not None}
    views = [set(kv.get_all(keys)), {k for k, v in zip(keys, kv.get_many(keys)) if v is not None},
             {key for key, _ in kv.all()} & set(keys), {key for key, _ in kv.range(None, None)} & set(keys)]
    assert all(view == by_get for view in views), (by_get, views)
    return by_get


def write_history(kv: TtlKeyValueEngine, time: ManualTime) -> None:
    """``old*`` written (twice: compaction has records to drop) at 1000, expiring at 1010, ``new*`` at
    1006, expiring at 1016, committed in several flushes; the clock ends at 1006, nothing expired."""
    for version in range(2):
        for i in range(5):
            kv.put(f"old{i}", {"n": i, "version": version})
            kv.flush()
    time.advance_processing_time(6)
    kv.flush()
    for i in range(5):
        kv.put(f"new{i}", {"n": i})
        kv.flush()


OLD = [f"old{i}" for i in range(5)]
NEW = [f"new{i}" for i in range(5)]
