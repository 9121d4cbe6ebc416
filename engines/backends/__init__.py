"""The built-in storage backends (``rocksdb``, ``lmdb``, ``memory``): plugins of the entry-point group
``localstate.backends``, registered in pyproject.toml exactly as a third-party backend would be, and
opened by name through :func:`localstate.core.registry.open_backend`. Each backend is one module here;
its library (rocksdict, lmdb) is imported only when a store uses it. Shared tuning options live in
:mod:`localstate.engines.backends.options`.
"""

from __future__ import annotations

from localstate.core.backend import BackendIterator, Item, KVBackend
from localstate.core.registry import backend_names, open_backend

__all__ = ["KVBackend", "BackendIterator", "Item", "open_backend", "backend_names"]
