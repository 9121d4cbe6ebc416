"""What both heap engines share: the inner key-value store that gives them local persistence,
changelog coalescing and atomic offsets, plus closed-store and serde error handling."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Iterable, Iterator, NoReturn

from localstate.core.changelog import ChangelogRecord
from localstate.core.engine import StorageEngine, StoreContext
from localstate.core.serdes import BytesSerde
from localstate.errors import InvalidValueError, LocalStateError, RestoreError, SerdeError, StoreClosedError

__all__ = ["HeapEngineBase", "LateEventError"]

log = logging.getLogger(__name__)


class LateEventError(InvalidValueError):
    """A reorder buffer received an event older than its watermark and ``late_policy = "error"``."""


class HeapEngineBase(StorageEngine):
    """Composes an inner :class:`~localstate.engines.kv.KeyValueEngine` (bytes keys and values) on the
    same directory and changelog. Subclasses keep their in-memory order, put changed entries into the
    inner store at :meth:`flush`, and rebuild the order from it on open and from records on restore."""

    def __init__(self, context: StoreContext) -> None:
        super().__init__(context)
        from localstate.engines.heap.factory import inner_kv_options
        from localstate.engines.kv import KeyValueEngineFactory  # lazy: kv is a sibling plugin

        inner = replace(context, options=inner_kv_options(context.store, context.options),
                        key_serde=BytesSerde(), value_serde=BytesSerde())
        self._kv = KeyValueEngineFactory().create(inner)
        self._closed = False
        self._kser = context.key_serde.serialize
        self._kdes = context.key_serde.deserialize
        self._vser = context.value_serde.serialize
        self._vdes = context.value_serde.deserialize

    # -- contract ------------------------------------------------------------------------------
    def local_offset(self) -> int | None:
        self._check_open()
        return self._kv.local_offset()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kv.close()
        self._drop_memory()

    def _drop_memory(self) -> None:
        """Release the in-memory order (subclasses)."""

    def _restore_into_kv(self, records: Iterable[ChangelogRecord], tap: Iterator[ChangelogRecord]) -> None:
        """Feed ``tap`` (a generator passing ``records`` through the in-memory update) to the inner
        store's bulk restore, and make sure every record went through the tap."""
        try:
            self._kv.restore(tap)
        except LocalStateError:
            raise
        except Exception as exc:  # a backend failure mid-restore
            raise RestoreError(f"restoring store {self.context.store!r} failed: {type(exc).__name__}: {exc}",
                               store=self.context.store, partition=self.context.partition,
                               hint="delete the store partition's local directory and restart to rebuild "
                                    "it from the changelog") from exc
        for _ in tap:  # the inner store stopped early (it must not); keep memory consistent anyway
            pass

    # -- helpers -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.context.store!r} is closed", store=self.context.store,
                                   partition=self.context.partition,
                                   hint="open the store again; do not keep references to it after close()")

    def _serde_error(self, exc: SerdeError, what: str) -> SerdeError:
        return SerdeError(f"store {self.context.store!r}: cannot use this {what}: {exc.message}",
                          hint=exc.hint or f"check the store's {what} serde", store=self.context.store,
                          partition=self.context.partition)

    def _corrupt(self, record: ChangelogRecord | None, reason: str) -> NoReturn:
        raise RestoreError(
            f"store {self.context.store!r}: undecodable heap record"
            f"{'' if record is None else f' key={record.key[:32]!r}'}: {reason}",
            store=self.context.store, partition=self.context.partition,
            offset=None if record is None else record.offset,
            hint="the changelog or local state was written by another engine or mode; check the store's "
                 "engine/mode settings, or delete the local directory and the changelog to start over")

    def _invalid(self, message: str, hint: str, **context: Any) -> InvalidValueError:
        return InvalidValueError(f"store {self.context.store!r}: {message}", hint=hint,
                                 store=self.context.store, partition=self.context.partition, **context)
