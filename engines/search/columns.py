"""The search engine's typed columns for the state reader (docs/state-reader.md): one row per
document, ``doc_id`` (the key serde), one column per declared field, typed by the field's type, and
``document``, the whole document as the changelog holds it (JSON text)."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Iterator, Mapping

from localstate.core.engine import SerdeColumn, StateColumns
from localstate.engines.search.schema import parse_fields

__all__ = ["search_columns", "FIELD_COLUMN_TYPES", "RESERVED_COLUMNS"]

FIELD_COLUMN_TYPES = {"text": "string", "string": "string", "int": "bigint", "float": "double", "date": "timestamp"}
"""The Spark type of a field's column, by the field's ``type``."""
RESERVED_COLUMNS = ("partition", "doc_id", "document")
"""Columns the reader itself names: a field of one of these names is shown as ``field_<name>``."""


def column_name(field: str) -> str:
    """The column of ``field``: its own name unless the reader uses that name (``field_<name>``)."""
    return f"field_{field}" if field.lower() in RESERVED_COLUMNS else field


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def search_columns(store: str, options: Mapping[str, Any], key: SerdeColumn) -> StateColumns:
    """``doc_id``, a column per field in the order of the ``fields`` table, then ``document``. A field
    holding one value has it in its column (dates as UTC timestamps); a multi-valued field (a list)
    leaves its column null and is read from ``document``."""
    specs = parse_fields(store, options["fields"])
    names = list(specs)
    types = {name: specs[name].type for name in names}
    schema = ", ".join([f"doc_id {key.type}"] + [f"{_quoted(column_name(name))} {FIELD_COLUMN_TYPES[types[name]]}"
                                                  for name in names] + ["document string"])

    def value_of(name: str, value: Any) -> Any:
        if value is None or isinstance(value, list):
            return None
        if types[name] == "date":
            return _dt.datetime.fromisoformat(value).astimezone(_dt.timezone.utc)
        if types[name] == "float":
            return float(value)
        return value

    def rows(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
        for doc_id, source in entries:
            document = json.loads(source.decode("utf-8"))
            yield (key.decode(doc_id), *(value_of(name, document.get(name)) for name in names),
                   json.dumps(document, sort_keys=True, ensure_ascii=False))

    return StateColumns(schema, rows)
