"""Former module of the backend contract, kept as an alias: see :mod:`localstate.core.backend`."""

from localstate.core.backend import RESOURCE_ERRNOS, BackendIterator, Item, KVBackend

__all__ = ["KVBackend", "BackendIterator", "Item", "RESOURCE_ERRNOS"]
