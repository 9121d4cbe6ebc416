"""The optional C extensions in tests: each comparison test imports the module through
:func:`native_module`, which fails the test when the extension did not build at install (so a broken
build cannot pass unnoticed) unless LOCALSTATE_PURE_PYTHON is set (then it skips)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from localstate.native import pure_python_requested

__all__ = ["native_module", "coalesced_reference", "run_columns"]


def native_module(name: str) -> ModuleType:
    """The C extension ``name`` (e.g. ``localstate.native._sorting``), imported directly: the tests
    compare it with the Python code even when LOCALSTATE_PURE_PYTHON keeps the library off it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if pure_python_requested():
            pytest.skip(f"LOCALSTATE_PURE_PYTHON is set and {name} is not built")
        pytest.fail(f"the C extension {name} did not build at install ({exc}); see setup.py")


def coalesced_reference(runs: list[list[tuple[bytes, bytes | None]]]) -> tuple[list[bytes], list, tuple[int, int], int]:
    """What coalescing sorted ``runs`` (later runs win) must give: keys, values, (min, max) key size,
    payload bytes."""
    merged: dict[bytes, bytes | None] = {}
    for run in runs:
        merged.update(run)
    keys = sorted(merged)
    values = [merged[k] for k in keys]
    sizes = [len(k) for k in keys] or [0]
    nbytes = sum(sizes) + sum(len(v) for v in values if v is not None)
    return keys, values, (min(sizes), max(sizes)), nbytes


def run_columns(runs: list[list[tuple[bytes, bytes | None]]]) -> tuple[list[list[bytes]], list[list]]:
    """``runs`` as coalesce_sorted's arguments: the keys and the values of each run."""
    return [[k for k, _ in run] for run in runs], [[v for _, v in run] for run in runs]
