"""Index schema of a search store: validation of the ``fields`` table and of documents.

The schema comes from the store's config (``fields = { title = { type = "text", ... } }``). This
module turns that table into :class:`FieldSpec` objects (every problem reported at
``stores.<store>.fields.<field>.<attr>``), and checks and normalises documents against it so the
changelog holds exactly what the index holds (dates as ISO-8601 UTC strings in the JSON).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import tantivy

from localstate.core.options import did_you_mean
from localstate.errors import ConfigError, ConfigProblem, InvalidValueError

__all__ = [
    "FIELD_TYPES",
    "TOKENIZERS",
    "RESERVED_PREFIX",
    "FieldSpec",
    "parse_fields",
    "parse_default_fields",
    "normalize_document",
    "encode_document",
    "decode_document",
]

FIELD_TYPES = ("text", "string", "int", "float", "date")

#: Tokenizers tantivy-py registers on every index (checked by experiment with tantivy 0.27):
#: an unknown name is only noticed by tantivy when the first document is indexed, so we check early.
TOKENIZERS = ("default", "raw", "en_stem", "whitespace") + tuple(
    f"{lang}_stem" for lang in "ar da de el es fi fr hu it nl no pt ro ru sv ta tr".split()
)

#: Field names starting with this are the engine's own hidden fields.
RESERVED_PREFIX = "__"

_ATTRS = ("type", "stored", "indexed", "tokenizer", "fast", "required")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class FieldSpec:
    """One user field of the index."""

    name: str
    type: str
    stored: bool = False
    """Returned in search hits (``get()`` always returns the whole document)."""
    indexed: bool = True
    tokenizer: str = "default"
    fast: bool = False
    required: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = {"type": self.type, "stored": self.stored, "indexed": self.indexed, "fast": self.fast,
               "required": self.required}
        if self.type == "text":
            out["tokenizer"] = self.tokenizer
        return out


def parse_fields(store: str, raw: Any) -> dict[str, FieldSpec]:
    """Validate the ``fields`` table; raise one ConfigError listing every problem."""
    base = f"stores.{store}.fields"
    problems: list[ConfigProblem] = []
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError.at(base, "expected a non-empty table of fields, e.g. "
                                   "fields = { title = { type = \"text\", stored = true } }")
    specs: dict[str, FieldSpec] = {}
    for name, table in raw.items():
        path = f"{base}.{name}"
        if not isinstance(name, str) or not tantivy.SchemaBuilder.is_valid_field_name(name):
            problems.append(ConfigProblem(path, "invalid field name: use letters, digits and '_' "
                                                "(not starting with '-')"))
            continue
        if name.startswith(RESERVED_PREFIX):
            problems.append(ConfigProblem(path, f"field names starting with {RESERVED_PREFIX!r} are "
                                                "reserved for the engine"))
            continue
        if isinstance(table, FieldSpec):
            specs[name] = table
            continue
        if not isinstance(table, Mapping):
            problems.append(ConfigProblem(path, f"expected a table such as {{ type = \"text\" }}, "
                                                f"got {type(table).__name__} {table!r}"))
            continue
        before = len(problems)
        for attr in table:
            if attr not in _ATTRS:
                problems.append(ConfigProblem(f"{path}.{attr}", "unknown attribute" + did_you_mean(attr, _ATTRS)
                                              + f"; known attributes: {', '.join(_ATTRS)}"))
        ftype = table.get("type")
        if ftype is None:
            problems.append(ConfigProblem(f"{path}.type", f"required: one of {', '.join(FIELD_TYPES)}"))
        elif ftype not in FIELD_TYPES:
            problems.append(ConfigProblem(f"{path}.type", f"unknown type {ftype!r}"
                                          + did_you_mean(str(ftype), FIELD_TYPES)
                                          + f"; known types: {', '.join(FIELD_TYPES)}"))
        flags: dict[str, bool] = {}
        for attr, default in (("stored", False), ("indexed", True), ("fast", False), ("required", False)):
            value = table.get(attr, default)
            if not isinstance(value, bool):
                problems.append(ConfigProblem(f"{path}.{attr}", f"expected true or false, got {value!r}"))
            flags[attr] = bool(value)
        tokenizer = table.get("tokenizer")
        if tokenizer is not None:
            if ftype != "text":
                problems.append(ConfigProblem(f"{path}.tokenizer", "only text fields have a tokenizer "
                                              "(string fields are indexed untokenized)"))
            elif tokenizer not in TOKENIZERS:
                problems.append(ConfigProblem(f"{path}.tokenizer", f"unknown tokenizer {tokenizer!r}"
                                              + did_you_mean(str(tokenizer), TOKENIZERS)
                                              + f"; known tokenizers: {', '.join(TOKENIZERS)}"))
        if ftype in ("text", "string") and not flags["indexed"]:
            problems.append(ConfigProblem(f"{path}.indexed", f"{ftype} fields are always indexed; "
                                          "remove 'indexed = false'"))
        if len(problems) == before:
            specs[name] = FieldSpec(name, ftype, flags["stored"], flags["indexed"],
                                    tokenizer or ("raw" if ftype == "string" else "default"),
                                    flags["fast"], flags["required"])
    if problems:
        raise ConfigError(problems)
    return specs


def parse_default_fields(store: str, raw: Any, specs: Mapping[str, FieldSpec]) -> list[str]:
    """Validate ``default_fields``; empty means every text field (or every string field if none)."""
    path = f"stores.{store}.default_fields"
    if not raw:
        text = [n for n, s in specs.items() if s.type == "text"]
        return text or [n for n, s in specs.items() if s.type == "string"]
    problems = []
    for name in raw:
        if not isinstance(name, str) or name not in specs:
            problems.append(ConfigProblem(path, f"unknown field {name!r}" + did_you_mean(str(name), list(specs))
                                          + f"; fields: {', '.join(specs)}"))
        elif specs[name].type not in ("text", "string"):
            problems.append(ConfigProblem(path, f"field {name!r} is {specs[name].type}; default fields "
                                                "must be text or string fields"))
    if problems:
        raise ConfigError(problems)
    return list(raw)


def _bad(store: str, partition: int, field: str, message: str, hint: str) -> InvalidValueError:
    return InvalidValueError(message, hint=hint, store=store, partition=partition, field=field)


def _normalize_value(spec: FieldSpec, value: Any, store: str, partition: int) -> Any:
    kind = spec.type
    if kind in ("text", "string"):
        if isinstance(value, str):
            return value
        expected = "a string"
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            if _I64_MIN <= value <= _I64_MAX:
                return value
            raise _bad(store, partition, spec.name, f"field {spec.name!r}: {value} does not fit in 64 bits",
                       "int fields hold signed 64-bit integers; use a float or string field")
        expected = "an integer"
    elif kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            if math.isfinite(value):
                return value
            raise _bad(store, partition, spec.name, f"field {spec.name!r}: {value} is not finite",
                       "NaN and infinity cannot be indexed; drop the field or use a sentinel")
        expected = "a number"
    else:  # date
        try:
            return _to_utc(value).isoformat()
        except (TypeError, ValueError, OverflowError, OSError):
            expected = "a datetime, date, ISO-8601 string or epoch seconds"
    raise _bad(store, partition, spec.name,
               f"field {spec.name!r} ({kind}) expects {expected}, got {type(value).__name__} {value!r:.80}",
               f"convert the value to {expected} or change the field's type in stores.{store}.fields")


def _to_utc(value: Any) -> _dt.datetime:
    """Dates are kept in UTC; a naive datetime is taken to be UTC already."""
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, str):
        value = _dt.datetime.fromisoformat(value)
    elif isinstance(value, (int, float)):
        value = _dt.datetime.fromtimestamp(value, _dt.timezone.utc)
    elif isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, _dt.datetime):
        raise TypeError(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    return value.astimezone(_dt.timezone.utc)


def normalize_document(specs: Mapping[str, FieldSpec], doc: Any, store: str, partition: int) -> dict[str, Any]:
    """Check ``doc`` against the schema and return its JSON-ready form.

    Values may be single values or lists (multi-valued fields); None means absent. Dates become
    ISO-8601 UTC strings. Raises InvalidValueError naming the store and the field at fault.
    """
    if not isinstance(doc, Mapping):
        raise InvalidValueError(f"a document must be a dict of field -> value, got {type(doc).__name__}",
                                hint="pass a dict such as {'title': 'Hello'}", store=store, partition=partition)
    out: dict[str, Any] = {}
    for name, value in doc.items():
        spec = specs.get(name) if isinstance(name, str) else None
        if spec is None:
            raise _bad(store, partition, str(name), f"unknown field {name!r}" + did_you_mean(str(name), list(specs)),
                       f"declare it in stores.{store}.fields or remove it; fields: {', '.join(specs)}")
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            values = [_normalize_value(spec, v, store, partition) for v in value if v is not None]
            if values:
                out[name] = values
        else:
            out[name] = _normalize_value(spec, value, store, partition)
    for spec in specs.values():
        if spec.required and spec.name not in out:
            raise _bad(store, partition, spec.name, f"required field {spec.name!r} is missing",
                       "add the field to the document or set required = false in "
                       f"stores.{store}.fields.{spec.name}")
    return out


def encode_document(normalized: Mapping[str, Any]) -> bytes:
    """The changelog value of a normalised document: compact, key-sorted UTF-8 JSON."""
    return json.dumps(normalized, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def decode_document(specs: Mapping[str, FieldSpec], normalized: Mapping[str, Any]) -> dict[str, Any]:
    """The user's view of a stored document: ISO date strings become aware UTC datetimes."""
    out: dict[str, Any] = {}
    for name, value in normalized.items():
        spec = specs.get(name)
        if spec is not None and spec.type == "date":
            value = ([_dt.datetime.fromisoformat(v) for v in value] if isinstance(value, list)
                     else _dt.datetime.fromisoformat(value))
        out[name] = value
    return out


def values_of(value: Any) -> Sequence[Any]:
    """A field value as a list (multi-valued fields are lists in the normalised form)."""
    return value if isinstance(value, list) else (value,)
