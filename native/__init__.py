"""localstate's C extensions, in one place, and the one loader for them.

The hot loops have C versions, built at install by setup.py where a C compiler exists:

- ``localstate.native._framing``: changelog record framing and decoding (the Python reference:
  ``localstate.changelog.framing``);
- ``localstate.native._hotpath``: the kv engine's get/put fast paths (the reference: the
  ``KeyValueEngine`` methods, ``localstate.engines.kv.engine``);
- ``localstate.native._sorting``: bulk loads sorted by key (the reference: ``localstate.core.backend``
  ``sorted_items``/``coalesce_sorted``, ``localstate.core.changelog.py_split_spans``).

Each is optional: the Python code it replaces stays the reference, behaves identically, and runs when
the module is missing or when the environment variable ``LOCALSTATE_PURE_PYTHON`` is set to a non-empty
value other than ``0`` (to compare, or to rule the C code out while debugging). :func:`status` says
which are in use. ``tests/native/test_differential.py`` runs each C module and its Python twin on the
same (also hostile) input.

This is the bottom layer: it imports nothing else of localstate (core, engines and changelog import it).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

__all__ = ["MODULES", "PURE_PYTHON_ENV", "pure_python_requested", "load", "status"]

log = logging.getLogger(__name__)

PURE_PYTHON_ENV = "LOCALSTATE_PURE_PYTHON"
#: Every C extension setup.py builds.
MODULES = ("localstate.native._framing", "localstate.native._hotpath", "localstate.native._sorting")


def pure_python_requested() -> bool:
    """Whether ``LOCALSTATE_PURE_PYTHON`` asks for the Python code instead of the C extensions."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The C extension module ``name`` (one of :data:`MODULES`; the short name ``"_framing"`` works
    too), or None when it was not built or pure Python was requested. A module that is missing only
    costs speed: the caller falls back to its Python reference."""
    if "." not in name:
        name = f"{__name__}.{name}"
    if name not in MODULES:
        raise ValueError(f"{name!r} is not one of localstate's C extensions {MODULES}")
    if pure_python_requested():
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        log.debug("C extension %s not available (%s): using the pure-Python code", name, exc)
        return None


def status() -> dict[str, str]:
    """Each C extension and whether it is in use: ``"in use"``, ``"off (LOCALSTATE_PURE_PYTHON)"``
    or ``"not built"``."""
    result = {}
    for name in MODULES:
        if pure_python_requested():
            result[name] = f"off ({PURE_PYTHON_ENV})"
        else:
            result[name] = "in use" if load(name) is not None else "not built"
    return result
