"""Fast paths for the built-in serdes on every engine's hot path (one implementation for all engines).

:func:`fast_codec` returns a ``(serialize, deserialize)`` pair that gives exactly the serde's bytes and
objects for every input the serde accepts, but with no serde method frame (builtins, or one small
function). Where the serde would raise :class:`~localstate.errors.SerdeError`, the fast functions raise
a plain ``TypeError``, ``ValueError``, ``UnicodeError`` or ``struct.error`` instead (see
:data:`FAST_ERRORS`): callers then call the serde itself, which raises the proper error (or, for odd
inputs the fast path refuses, such as ``int`` subclasses, succeeds).
"""

from __future__ import annotations

import struct
from typing import Any, Callable

from localstate.core.serdes import IntSerde, Serde, StringSerde
from localstate.errors import SerdeError

__all__ = ["fast_codec", "FAST_ERRORS", "INT_PACK", "INT_BIAS", "inline_int_class"]

#: What a fast function raises instead of SerdeError (SerdeError included for custom serdes).
FAST_ERRORS = (SerdeError, TypeError, ValueError, UnicodeError, struct.error)

_Q = struct.Struct(">Q")
_SIGN = 1 << 63


#: The built-in int serde's encoding, for callers that inline it (no function frame per value):
#: ``INT_PACK(obj + INT_BIAS)`` is IntSerde's bytes for an exact ``int`` obj; struct.error out of range.
INT_PACK: Callable[[int], bytes] = _Q.pack
INT_BIAS = _SIGN


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


def fast_codec(serde: Serde) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    """``(serialize, deserialize)`` for the hot path: fast versions for the built-in ``string`` and
    ``int`` serdes, the serde's own methods for any other serde (subclasses included)."""
    kind = type(serde)
    if kind is StringSerde:
        return str.encode, bytes.decode
    if kind is IntSerde:
        return _int_serialize, _int_deserialize
    return serde.serialize, serde.deserialize
