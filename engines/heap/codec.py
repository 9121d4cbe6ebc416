"""Byte encodings of the heap engine's changelog records and the checks on scores and timestamps.

Top-N record:   key = the item's serialized bytes,
                value = float64 score (big-endian) + 1 flag byte (1: payload present) + payload bytes.
Reorder record: key = order-preserving float64 timestamp (8 bytes) + sequence number (8 bytes, big-endian),
                value = 1 kind byte (0: int timestamp, 1: float timestamp) + event bytes.
Reorder meta:   key = ``META_KEY`` (not 16 bytes long, so it never collides with an event key),
                value = next sequence (u64) + drained watermark (f64) + max timestamp seen (f64).
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any

__all__ = [
    "SCORE_HEADER",
    "encode_score_value",
    "decode_score_value",
    "encode_ts",
    "decode_ts",
    "event_key",
    "decode_event_stamps",
    "EVENT_KEY_LEN",
    "META_KEY",
    "encode_meta",
    "decode_meta",
    "check_number",
    "MAX_EXACT_INT",
]

SCORE_HEADER = struct.Struct(">dB")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_META = struct.Struct(">Qdd")
_EVENT_KEY = struct.Struct(">QQ")
_SIGN = 1 << 63
_ALL = (1 << 64) - 1

EVENT_KEY_LEN = 16
META_KEY = b"\x00meta"  # 5 bytes: any length but 16 keeps it apart from event keys
MAX_EXACT_INT = 1 << 53
"""Integer timestamps beyond +-2**53 cannot round-trip through float64 and are rejected."""


def encode_score_value(score: float, payload: bytes | None) -> bytes:
    """Changelog value of one top-N entry."""
    if payload is None:
        return SCORE_HEADER.pack(score, 0)
    return SCORE_HEADER.pack(score, 1) + payload


def decode_score_value(value: bytes) -> tuple[float, bytes | None]:
    """Inverse of :func:`encode_score_value`; raises ValueError on malformed bytes."""
    if len(value) < SCORE_HEADER.size:
        raise ValueError(f"value of {len(value)} bytes is shorter than the 9-byte score header")
    score, flag = SCORE_HEADER.unpack_from(value)
    if flag == 0:
        if len(value) != SCORE_HEADER.size:
            raise ValueError("value has trailing bytes but its flag says there is no payload")
        payload = None
    elif flag == 1:
        payload = bytes(value[SCORE_HEADER.size:])
    else:
        raise ValueError(f"unknown payload flag {flag}")
    if score != score:
        raise ValueError("score is NaN")
    return score, payload


def encode_ts(ts: float) -> bytes:
    """8 bytes whose unsigned byte order equals the numeric order of ``ts`` (-0.0 must be normalized)."""
    bits = _U64.unpack(_F64.pack(ts))[0]
    return _U64.pack(bits ^ _ALL if bits & _SIGN else bits | _SIGN)


def decode_ts(data: bytes) -> float:
    """Inverse of :func:`encode_ts` (reads the first 8 bytes)."""
    bits = _U64.unpack_from(data)[0]
    return _F64.unpack(_U64.pack(bits ^ _SIGN if bits & _SIGN else bits ^ _ALL))[0]


def decode_event_stamps(keys: list[bytes]) -> list[float]:
    """:func:`decode_ts` of many 16-byte event keys at once (a few C calls instead of three per key)."""
    count = len(keys)
    bits = [b ^ _SIGN if b & _SIGN else b ^ _ALL for b, _ in _EVENT_KEY.iter_unpack(b"".join(keys))]
    return list(struct.unpack(f">{count}d", struct.pack(f">{count}Q", *bits)))


def event_key(ts: float, seq: int) -> bytes:
    """Key of one buffered event: sorts by timestamp, then by arrival (sequence number).
    Equal to ``encode_ts(ts) + seq as u64``, packed in one call (it is on the push hot path)."""
    bits = _U64.unpack(_F64.pack(ts))[0]
    return _EVENT_KEY.pack(bits ^ _ALL if bits & _SIGN else bits | _SIGN, seq)


def encode_meta(next_seq: int, watermark: float, max_ts: float) -> bytes:
    return _META.pack(next_seq, watermark, max_ts)


def decode_meta(value: bytes) -> tuple[int, float, float]:
    if len(value) != _META.size:
        raise ValueError(f"meta record has {len(value)} bytes, expected {_META.size}")
    return _META.unpack(value)


def check_number(value: Any) -> float:
    """Return ``value`` as a float64, or raise ValueError/TypeError saying why it is not a usable number.

    Accepts int, float and any ``numbers.Real`` (numpy scalars, Fraction); refuses bool, NaN and
    non-numbers. Infinities are accepted (callers decide whether they make sense).
    """
    kind = type(value)
    if kind is float:
        if value != value:
            raise ValueError("NaN is not a valid number here")
        return value
    if kind is int:
        return float(value)  # OverflowError for ints beyond float range
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"expected a number, got {kind.__name__} {value!r:.80}")
    result = float(value)
    if math.isnan(result):
        raise ValueError("NaN is not a valid number here")
    return result
