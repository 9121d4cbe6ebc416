"""Serdes: turn keys and values into bytes and back.

Built-ins: ``bytes``, ``string`` (UTF-8), ``int`` (8-byte order-preserving, so range scans sort
numerically, negatives included), ``json``, and ``pickle`` (refused unless the job sets
``allow_pickle = true``: unpickling changelog or input data runs arbitrary code).
Serdes are plugins under ``localstate.serdes``.
"""

from __future__ import annotations

import json
import pickle
import struct
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from localstate.core.changelog import PLUGIN_API_VERSION
from localstate.errors import SerdeError

__all__ = ["Serde", "BytesSerde", "StringSerde", "IntSerde", "JsonSerde", "PickleSerde", "STRICT_JSON",
           "MAX_JSON_DEPTH", "json_problem", "ensure_bytes"]

T = TypeVar("T")


#: Deepest nesting of arrays/objects accepted from data: deeper values are refused at decoding, because
#: encoding them again (a store put, an output) would hit Python's recursion limit later, at a point
#: where the record can no longer be skipped or dead-lettered.
MAX_JSON_DEPTH = 256


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value - value:  # inf - inf is nan (truthy); a finite number gives 0.0
        raise ValueError(f"number {text[:40]} is out of the range of a double")
    return value


STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
"""The json serde's decoder: refuses what :class:`JsonSerde` cannot encode again, NaN, Infinity and
numbers beyond a double's range (1e400), at the point of reading. The C scanner still does all the
parsing; a float literal costs one small Python call. See :func:`json_problem` for the rest."""


def json_problem(data: bytes, value: Any) -> str | None:
    """Why ``value``, decoded by :data:`STRICT_JSON` from ``data``, still cannot be encoded again as
    JSON in UTF-8 (a lone surrogate, nesting deeper than :data:`MAX_JSON_DEPTH`), or None.

    Cheap for the usual record: ``value`` is only examined when ``data`` holds a ``\\u`` escape (the
    only way to write a lone surrogate in valid UTF-8) or more brackets than the depth limit."""
    if len(data) > 2 * MAX_JSON_DEPTH and data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH \
            and _depth_over(value, MAX_JSON_DEPTH):
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if b"\\u" in data:
        try:
            json.dumps(value, ensure_ascii=False, check_circular=False).encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone surrogate (\\ud800-\\udfff) that UTF-8 cannot encode"
    return None


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/dicts deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def ensure_bytes(data: Any, serde: "Serde[Any]") -> bytes:
    """``data`` if a serde returned bytes; a SerdeError otherwise (a custom serde returning None or
    str must fail at the call, not later at a flush after its changelog record was written)."""
    if type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise SerdeError(f"serde {serde.name or type(serde).__name__!r} returned {type(data).__name__}, not bytes",
                     hint="fix the serde's serialize() to return bytes")


class Serde(ABC, Generic[T]):
    """Converts objects of one type to bytes and back. ``unsafe`` serdes need the job's opt-in."""

    plugin_api: ClassVar[int] = PLUGIN_API_VERSION
    name: ClassVar[str] = ""
    unsafe: ClassVar[bool] = False
    holds: ClassVar[tuple[type, ...] | None] = None
    """The Python types this serde encodes and decodes back to an equal value (``object``: any);
    None (the default of a serde that does not say): not declared, so no use of it is refused.
    Validation compares it with what a store puts through the serde (:class:`~localstate.core.engine.SerdeUse`)."""
    keeps_prefixes: ClassVar[bool] = False
    """Whether the bytes of a text are a prefix of the bytes of every text that starts with it, so a
    prefix scan of the encoded keys finds the texts with that prefix (``string`` does; ``json`` closes
    its quotes, so it does not)."""

    @abstractmethod
    def serialize(self, obj: T) -> bytes:
        """Return the bytes of ``obj``; raise SerdeError for objects of the wrong type."""

    @abstractmethod
    def deserialize(self, data: bytes) -> T:
        """Return the object encoded by ``data``; raise SerdeError when it cannot be decoded."""

    def _wrong_type(self, obj: object, expected: str) -> SerdeError:
        return SerdeError(f"serde {self.name!r} expects {expected}, got {type(obj).__name__} {obj!r:.80}",
                          hint=f"convert the value to {expected} or configure another serde")

    def _undecodable(self, data: bytes, exc: Exception) -> SerdeError:
        return SerdeError(f"serde {self.name!r} cannot decode {len(data)} bytes {data[:32]!r}: {exc}",
                          hint="check that the store's serde matches what was written")


class BytesSerde(Serde[bytes]):
    """Identity for ``bytes`` (bytearray and memoryview are accepted and copied)."""

    name = "bytes"
    holds = (bytes,)
    keeps_prefixes = True

    def serialize(self, obj: bytes) -> bytes:
        if type(obj) is bytes:
            return obj
        if isinstance(obj, (bytearray, memoryview)):
            return bytes(obj)
        raise self._wrong_type(obj, "bytes")

    def deserialize(self, data: bytes) -> bytes:
        return bytes(data)


class StringSerde(Serde[str]):
    """UTF-8 text. Byte order of UTF-8 equals code-point order, so ranges sort like strings."""

    name = "string"
    holds = (str,)
    keeps_prefixes = True

    def serialize(self, obj: str) -> bytes:
        if not isinstance(obj, str):
            raise self._wrong_type(obj, "str")
        try:
            return obj.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise SerdeError(f"serde 'string' cannot encode {obj!r:.80}: {exc}",
                             hint="remove unpaired surrogates from the text") from exc

    def deserialize(self, data: bytes) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._undecodable(data, exc) from exc


_INT = struct.Struct(">Q")
_SIGN = 1 << 63


class IntSerde(Serde[int]):
    """Signed 64-bit integers as 8 big-endian bytes with the sign bit flipped.

    Byte order equals numeric order (-2**63 sorts first), so ``range()`` over int keys is numeric.
    """

    name = "int"
    holds = (int,)

    def serialize(self, obj: int) -> bytes:
        if not isinstance(obj, int) or isinstance(obj, bool):
            raise self._wrong_type(obj, "int")
        if not -_SIGN <= obj < _SIGN:
            raise SerdeError(f"serde 'int' holds signed 64-bit integers; {obj} is out of range",
                             hint="use the json or string serde for larger integers")
        return _INT.pack(obj ^ _SIGN if obj >= 0 else obj + _SIGN)

    def deserialize(self, data: bytes) -> int:
        if len(data) != 8:
            raise self._undecodable(data, ValueError("expected exactly 8 bytes"))
        raw = _INT.unpack(data)[0]
        return raw ^ _SIGN if raw >= _SIGN else raw - _SIGN


class JsonSerde(Serde[Any]):
    """Compact JSON in UTF-8 (keys of objects sorted, so equal objects give equal bytes)."""

    name = "json"
    holds = (str, int, float, bool, type(None), list, dict)

    def serialize(self, obj: Any) -> bytes:
        try:
            return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                              allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerdeError(f"serde 'json' cannot encode {type(obj).__name__} {obj!r:.80}: {exc}",
                             hint="store JSON-compatible values (dict, list, str, int, float, bool, None)"
                             ) from exc

    def deserialize(self, data: bytes) -> Any:
        """Decode; refuses (SerdeError) what :meth:`serialize` would refuse, so bad data is caught
        where it is read (an input's ``on_error`` can then skip or dead-letter it)."""
        data = bytes(data)
        try:
            value = STRICT_JSON.decode(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise self._undecodable(data, exc) from exc
        problem = json_problem(data, value)
        if problem is not None:
            raise self._undecodable(data, ValueError(problem))
        return value


class PickleSerde(Serde[Any]):
    """Python pickle. Unsafe: decoding runs arbitrary code from the data, so it needs
    ``allow_pickle = true`` in the job config."""

    name = "pickle"
    holds = (object,)
    unsafe = True

    def serialize(self, obj: Any) -> bytes:
        try:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickling can raise almost anything
            raise SerdeError(f"serde 'pickle' cannot encode {type(obj).__name__}: {exc}") from exc

    def deserialize(self, data: bytes) -> Any:
        try:
            return pickle.loads(data)  # noqa: S301 - only reachable with allow_pickle = true
        except Exception as exc:
            raise self._undecodable(data, exc) from exc
