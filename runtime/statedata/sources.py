"""A savepoint's records as a job's stores take them in: checked against the job's store, migrated,
re-encoded.

A store of the savepoint is taken by the job's store of the same name when both are the same engine
kind with the same stored layout (:class:`~localstate.core.engine.StateFormat`: ``kv`` vs ``kv+ttl``).
On the way in, each record may be transformed by the store's *migration*, a Python function over
``(key, value) -> (key, value)`` or None (dropped): for a kv store the key and value decoded with the
savepoint's serdes and encoded back with the job's (so changing a serde or a value's layout is a
migration; with new serdes and no migration the values are decoded and encoded as they are), a ttl
value keeping its expiry; for the other kinds the record's raw bytes (their engine's format).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterator

from localstate.core.text import a
from localstate.core.config import JobConfig, StoreConfig
from localstate.core.task import add_task_paths
from localstate.errors import ConfigError, SavepointMismatchError, SerdeError
from localstate.runtime.driver.views import value_splitter
from localstate.runtime.statedata.saved import SavedState
from localstate.core.tracebacks import raise_task_error

__all__ = ["Migration", "StoreSource", "load_function"]

Migration = Callable[[Any, Any], "tuple[Any, Any] | None"]
"""A store's migration: ``(key, value) -> (key, value)``, or None to drop the record."""


def load_function(job: JobConfig, spec: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` (a module next to the job file or on its ``pythonpath``),
    or a ConfigError at ``what`` saying why not."""
    module_name, _, attr = spec.partition(":")
    add_task_paths(job)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - user code can fail to import in any way
        raise ConfigError.at(what, f"cannot load {spec!r}: {type(exc).__name__}: {exc}",
                             hint="give 'module:function' of a module next to the job file or on its pythonpath") \
            from exc
    if not callable(obj):
        raise ConfigError.at(what, f"{spec!r} is not a function")
    return obj


class StoreSource:
    """One savepoint store's records for the job's store ``target`` (see the module docstring)."""

    def __init__(self, savepoint: SavedState, target: StoreConfig, job: JobConfig, target_format: str | None,
                 migration: Migration | None = None) -> None:
        self.savepoint = savepoint
        self.name = target.name
        self.migration = migration
        entry = savepoint.manifest.stores[self.name]
        source = savepoint.store_config(self.name)
        if entry.engine != target.engine:
            raise SavepointMismatchError(f"store {self.name!r} is {a(entry.engine)} store in the savepoint but "
                                         f"{a(target.engine)} store in job {job.name!r}", store=self.name,
                                         hint="keep the engine kind, or give the new store another name")
        if entry.state_format and target_format and entry.state_format != target_format:
            raise SavepointMismatchError(
                f"store {self.name!r} was saved in the {entry.state_format!r} layout, but the job's options give "
                f"{target_format!r} (ttl added or removed)", store=self.name,
                hint="put the store's options back as they were in the savepoint, or start the store empty under a "
                     "new name")
        serdes_changed = (entry.key_serde, entry.value_serde) != (target.key_serde, target.value_serde)
        self.moved: list[tuple[Any, bytes, bytes]] = []
        self.convert: Callable[[bytes, bytes], tuple[bytes, bytes] | None] | None = None
        if target.engine == "kv" and (migration is not None or serdes_changed):
            self.convert = self._kv_converter(job, source, target)
        elif migration is not None:
            self.convert = self._raw_converter()
        elif serdes_changed:
            raise SavepointMismatchError(
                f"store {self.name!r} ({target.engine}) was saved with serdes {entry.key_serde}/{entry.value_serde}, "
                f"the job's are {target.key_serde}/{target.value_serde}; {a(target.engine)} store's records are not "
                "re-encoded by themselves", store=self.name,
                hint="keep the serdes, or give a migration for the store (docs/state-as-data.md, Migrations)")

    def chunks(self, partition: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """Old partition ``partition``'s records, a file at a time, converted for the job's store;
        the records a migration gave another key are in :attr:`moved` afterwards."""
        for keys, values in self.savepoint.records(self.name, partition):
            if self.convert is None:
                yield keys, values
                continue
            out_keys, out_values = [], []
            for key, value in zip(keys, values):
                converted = self.convert(key, value)
                if converted is not None:
                    out_keys.append(converted[0])
                    out_values.append(converted[1])
            yield out_keys, out_values

    def take_moved(self) -> list[tuple[Any, bytes, bytes]]:
        """``(new key, key bytes, value bytes)`` of the records a migration gave another key since the
        last call: they go to the partition of their new key, wherever they were."""
        moved, self.moved = self.moved, []
        return moved

    def _kv_converter(self, job: JobConfig, source: StoreConfig, target: StoreConfig
                      ) -> Callable[[bytes, bytes], tuple[bytes, bytes] | None]:
        registry = job.registry
        old_key = registry.serde(source.key_serde, allow_pickle=job.allow_pickle)
        old_value = registry.serde(source.value_serde, allow_pickle=job.allow_pickle)
        new_key = registry.serde(target.key_serde, allow_pickle=job.allow_pickle)
        new_value = registry.serde(target.value_serde, allow_pickle=job.allow_pickle)
        split = value_splitter(job, source)
        migration, name = self.migration, self.name

        def convert(key: bytes, value: bytes) -> tuple[bytes, bytes] | None:
            data = value if split is None else split(value)[0]
            stamp = value[:len(value) - len(data)]
            try:
                pair = (old_key.deserialize(key), old_value.deserialize(data))
            except Exception as exc:  # noqa: BLE001 - any serde failure is reported the same way
                raise SerdeError(f"store {name!r}: a saved record does not decode with its serdes: {exc}",
                                 store=name, key=key[:64], hint="check the savepoint's serdes") from exc
            original = pair[0]
            if migration is not None:
                pair = _migrated(migration, name, pair)
                if pair is None:
                    return None
            try:
                encoded = new_key.serialize(pair[0]), stamp + new_value.serialize(pair[1])
            except Exception as exc:  # noqa: BLE001
                raise SerdeError(f"store {name!r}: the record {pair!r:.120} does not encode with the job's serdes "
                                 f"{target.key_serde}/{target.value_serde}: {exc}", store=name,
                                 hint="give a migration that turns the saved records into the new layout") from exc
            if pair[0] != original:  # a new key: it goes where the new key routes
                self.moved.append((pair[0], *encoded))
                return None
            return encoded
        return convert

    def _raw_converter(self) -> Callable[[bytes, bytes], tuple[bytes, bytes] | None]:
        migration, name = self.migration, self.name

        def convert(key: bytes, value: bytes) -> tuple[bytes, bytes] | None:
            pair = _migrated(migration, name, (key, value))  # type: ignore[arg-type]
            if pair is not None and not (isinstance(pair[0], bytes) and isinstance(pair[1], bytes)):
                raise SerdeError(f"store {name!r}: the migration of a raw record must return (bytes, bytes), got "
                                 f"{pair!r:.120}", store=name, hint="return the record's key and value bytes")
            return pair
        return convert


def _migrated(migration: Migration, store: str, pair: tuple[Any, Any]) -> tuple[Any, Any] | None:
    try:
        result = migration(*pair)
    except Exception as exc:  # noqa: BLE001 - the user's function
        raise_task_error(exc, f"the migration of store {store!r}", store=store,
                         hint="fix the migration function; nothing of the new state was switched to")
    if result is not None and not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError.at(f"migration of {store}", f"a migration returns (key, value) or None, got {result!r:.80}")
    return result
