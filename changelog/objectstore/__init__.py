"""The ``objectstore`` changelog: durable state on shared storage without shared appends (immutable
delta and snapshot objects named by the checkpoint's manifest). See docs/durable.md."""

from __future__ import annotations

from .chain import Chain, ChainObject
from .partition import ObjectStoreChangelogPartition
from .storage import ObjectStore, open_object_store
from .system import ObjectCheckpoints, ObjectStoreChangelogSystem

__all__ = ["ObjectStoreChangelogSystem", "ObjectStoreChangelogPartition", "ObjectCheckpoints", "ObjectStore",
           "open_object_store", "Chain", "ChainObject"]
