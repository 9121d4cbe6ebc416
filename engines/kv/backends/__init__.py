"""Former home of the storage backends, kept so existing imports work: the contract is
:mod:`localstate.core.backend`, the built-in backends are in :mod:`localstate.engines.backends`."""

from __future__ import annotations

from localstate.core.backend import BackendIterator, Item, KVBackend, backend_names, open_backend

__all__ = ["KVBackend", "BackendIterator", "Item", "open_backend", "backend_names"]
