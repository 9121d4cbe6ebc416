"""The optional C extensions in tests: each comparison test imports the module through
:func:`native_module`, which fails the test when the extension did not build at install (so a broken
build cannot pass unnoticed) unless LOCALSTATE_PURE_PYTHON is set (then it skips)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from localstate.native import pure_python_requested

__all__ = ["native_module"]


def native_module(name: str) -> ModuleType:
    """The C extension ``name`` (e.g. ``localstate.native._sorting``), imported directly: the tests
    compare it with the Python code even when LOCALSTATE_PURE_PYTHON keeps the library off it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if pure_python_requested():
            pytest.skip(f"LOCALSTATE_PURE_PYTHON is set and {name} is not built")
        pytest.fail(f"the C extension {name} did not build at install ({exc}); see setup.py")
