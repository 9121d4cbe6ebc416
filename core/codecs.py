"""Fast paths for the built-in serdes on every engine's hot path (one implementation for all engines).

:func:`fast_codec` returns a ``(serialize, deserialize)`` pair that gives exactly the serde's bytes and
objects for every input the serde accepts, but with no serde method frame (builtins, or one small
function). Where the serde would raise :class:`~localstate.errors.SerdeError`, the fast functions raise
a plain ``TypeError``, ``ValueError``, ``UnicodeError`` or ``struct.error`` instead (see
:data:`FAST_ERRORS`): callers then call the serde itself, which raises the proper error (or, for odd
inputs the fast path refuses, such as ``int`` subclasses, succeeds).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable

from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, Serde, StringSerde, ensure_bytes
from localstate.errors import SerdeError

__all__ = ["fast_codec", "FAST_ERRORS", "INT_PACK", "INT_BIAS", "INT_MIN", "INT_MAX", "inline_int_class",
           "native_class", "many_encoder"]

#: What a fast function raises instead of SerdeError (SerdeError included for custom serdes).
FAST_ERRORS = (SerdeError, TypeError, ValueError, UnicodeError, struct.error)

_Q = struct.Struct(">Q")
_SIGN = 1 << 63


#: The built-in int serde's encoding, for callers that inline it (no function frame per value):
#: ``INT_PACK(obj + INT_BIAS)`` is IntSerde's bytes for an exact ``int`` obj; struct.error out of range.
INT_PACK: Callable[[int], bytes] = _Q.pack
INT_BIAS = _SIGN
#: The range of the built-in int serde (signed 64-bit): a range check is cheaper than packing.
INT_MIN, INT_MAX = -_SIGN, _SIGN - 1


def inline_int_class(serde: Serde) -> type | None:
    """``int`` when ``serde`` is exactly the built-in int serde (values of class ``int`` may then be
    encoded inline with :data:`INT_PACK`/:data:`INT_BIAS`), else None."""
    return int if type(serde) is IntSerde else None


def _int_serialize(obj: Any, pack: Callable[[int], bytes] = _Q.pack, sign: int = _SIGN) -> bytes:
    # IntSerde writes ``obj ^ 2**63`` for obj >= 0 and ``obj + 2**63`` below: both equal obj + 2**63
    # in range, and pack(">Q") raises struct.error out of range. bool and int subclasses take the
    # serde's path (it rejects bool).
    if obj.__class__ is int:
        return pack(obj + sign)
    raise TypeError("not an exact int")


def _int_deserialize(data: bytes, unpack: Callable[[bytes], tuple[int]] = _Q.unpack, sign: int = _SIGN) -> int:
    return unpack(data)[0] - sign  # struct.error unless exactly 8 bytes


#: JsonSerde's encoder, built once: ``json.dumps`` with arguments builds a new one per call.
_JSON_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False).encode


def _json_serialize(obj: Any, encode: Callable[[Any], str] = _JSON_ENCODE) -> bytes:
    try:
        return encode(obj).encode("utf-8")  # TypeError/ValueError where the serde raises SerdeError
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc  # the caller then calls the serde (its SerdeError)


def fast_codec(serde: Serde) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """``(serialize, deserialize)`` for the hot path: fast versions for the built-in ``string`` and
    ``int`` serdes, the serde's own methods for any other serde (subclasses included)."""
    kind = type(serde)
    if kind is StringSerde:
        return str.encode, bytes.decode
    if kind is IntSerde:
        return _int_serialize, _int_deserialize
    if kind is JsonSerde:
        return _json_serialize, serde.deserialize
    return serde.serialize, serde.deserialize


def native_class(serde: Serde) -> type | None:
    """The class whose exact instances ``serde`` encodes such that equal objects always give equal
    bytes and vice versa (``str`` for the built-in string serde, ``int`` for int, ``bytes`` for bytes),
    or None for any other serde (json: ``1 == 1.0 == True`` encode differently; custom serdes: unknown).
    Objects of that exact class may stand for their encoding, e.g. as cache keys, and their natural
    order is the order of their encodings (UTF-8 byte order is code-point order; the int serde is
    order-preserving)."""
    kind = type(serde)
    if kind is StringSerde:
        return str
    if kind is IntSerde:
        return int
    if kind is BytesSerde:
        return bytes
    return None


def many_encoder(serde: Serde) -> Callable[[list[Any]], list[bytes]]:
    """A function encoding a list of objects in one call: a C-level ``map`` for the built-in string,
    int and bytes serdes (for objects their serialize accepts: the caller checked them), else the
    serde's ``serialize`` per object (raising SerdeError for an object it refuses, e.g. a json value
    mutated after it was put)."""
    kind = type(serde)
    if kind is StringSerde:
        return lambda objs: list(map(str.encode, objs))
    if kind is IntSerde:
        return lambda objs: list(map(INT_PACK, map(INT_BIAS.__add__, objs)))
    if kind is BytesSerde:
        return list
    serialize = serde.serialize
    return lambda objs: [ensure_bytes(serialize(obj), serde) for obj in objs]
