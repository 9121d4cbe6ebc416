"""Job files written from tables of plain values (``{"job": {...}, "stores.counts": {...}}``), so a
test states its job's options as data instead of a block of TOML text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

__all__ = ["toml_text"]


def _value(value: Any) -> str:
    """A TOML value: strings, numbers, booleans and lists of them are written as JSON (valid TOML
    for these); paths as strings."""
    if isinstance(value, Path):
        value = str(value)
    elif isinstance(value, (list, tuple)):
        value = [str(v) if isinstance(v, Path) else v for v in value]
    return json.dumps(value)


def _table(name: str, values: Mapping[str, Any]) -> str:
    return "\n".join([f"[{name}]", *(f"{key} = {_value(value)}" for key, value in values.items())])


def toml_text(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """The TOML text of ``tables`` (a table's dotted name -> its options), one table after another."""
    return "\n\n".join(_table(table, values) for table, values in tables.items()) + "\n"
