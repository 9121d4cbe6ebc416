"""The C record framing (changelog/file/_framing.c) against the Python reference in format.py and
partition.py: the same bytes out, the same records in, the same errors, on arbitrary and damaged input.

The extension is optional at install (no C compiler: pure Python). Here it must be built unless
LOCALSTATE_PURE_PYTHON asks for the Python framing, so a broken build cannot pass unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.file import format as framing
from localstate.changelog.file import partition
from localstate.changelog.file.format import HEADER, HEADER_SIZE, py_encode_into
from localstate.core.changelog import ChangelogRecord, py_split_spans
from native_support import native_module

PURE = os.environ.get("LOCALSTATE_PURE_PYTHON", "") not in ("", "0")


def _native():
    return native_module("localstate.changelog.file._framing")


def test_the_extension_is_built_and_in_use() -> None:
    if PURE:
        assert framing.NATIVE is None
        assert framing.encode_into is py_encode_into
        return
    module = _native()  # ImportError here: the C extension did not build (see setup.py)
    assert framing.NATIVE is module
    assert framing.encode_into is module.encode_into
    assert partition._decode_columns is partition._native_decode_columns


def test_pure_python_switch_turns_it_off() -> None:
    code = ("from localstate.changelog.file import format, partition; "
            "assert format.NATIVE is None and format.encode_into is format.py_encode_into; "
            "assert partition._decode_columns is partition.py_decode_columns; print('pure')")
    env = {**os.environ, "LOCALSTATE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


blobs = st.binary(max_size=40)
records_strategy = st.lists(st.tuples(blobs, st.one_of(st.none(), blobs)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(records=records_strategy, offset=st.integers(0, 2**64 - 40), ts=st.integers(-2**63, 2**63 - 1),
       prefix=st.binary(max_size=5), as_views=st.booleans())
def test_encode_matches_the_reference(records, offset, ts, prefix, as_views) -> None:
    if as_views:  # other bytes-like objects frame the same bytes
        records = [(bytearray(k), None if v is None else memoryview(v)) for k, v in records]
    ours, reference = bytearray(prefix), bytearray(prefix)
    assert _native().encode_into(ours, iter(records), offset, ts) == py_encode_into(reference, records, offset, ts)
    assert ours == reference
    assert framing.count_records(ours, len(prefix)) == len(records)


BAD_ITEMS = [
    ("key", b"v"),                 # a str key
    (b"k", 7),                     # an int value
    (b"k", b"v", b"x"),            # not a pair
    (b"k",),                       # not a pair
    None,                          # not a sequence
    42,
]


@pytest.mark.parametrize("bad", BAD_ITEMS, ids=repr)
@pytest.mark.parametrize("position", [0, 1, 3])
def test_a_bad_record_leaves_the_records_before_it_whole(bad, position) -> None:
    good = [(b"a", b"1"), (b"b", None), (b"c", b"333")]
    records = good[:position] + [bad] + good[position:]
    ours, reference = bytearray(b"p"), bytearray(b"p")
    with pytest.raises((TypeError, ValueError)) as native_error:
        _native().encode_into(ours, records, 10, 0)
    with pytest.raises((TypeError, ValueError)) as python_error:
        py_encode_into(reference, records, 10, 0)
    assert type(native_error.value) is type(python_error.value) or isinstance(native_error.value, TypeError)
    assert ours == reference
    assert framing.count_records(ours, 1) == position


def test_an_iterator_that_fails_leaves_the_records_before_it() -> None:
    def records():
        yield b"a", b"1"
        yield b"b", b"2"
        raise RuntimeError("input broke")

    ours, reference = bytearray(), bytearray()
    with pytest.raises(RuntimeError, match="input broke"):
        _native().encode_into(ours, records(), 0, 0)
    with pytest.raises(RuntimeError, match="input broke"):
        py_encode_into(reference, records(), 0, 0)
    assert ours == reference and framing.count_records(ours) == 2


def test_offsets_out_of_range_are_refused() -> None:
    for offset in (-1, 2**64):
        with pytest.raises(OverflowError):
            _native().encode_into(bytearray(), [(b"k", b"v")], offset, 0)
    buf = bytearray()
    with pytest.raises(OverflowError):  # the u64 offset field would wrap within the batch
        _native().encode_into(buf, [(b"k", b"v"), (b"l", b"w")], 2**64 - 1, 0)
    assert framing.count_records(buf) == 1
    with pytest.raises(TypeError):
        _native().encode_into(b"not a bytearray", [], 0, 0)


def _frame(records, offset=0) -> bytes:
    buf = bytearray()
    py_encode_into(buf, records, offset, 1234)
    return bytes(buf)


def _both(buf: bytes, i: int, limit: int, expected: int, stop: int):
    theirs = partition.py_decode_columns(buf, i, limit, expected, stop)
    keys, values, end, next_expected = _native().decode_columns(buf, i, limit, expected, stop)
    return theirs, (keys, values, end, next_expected)


def _assert_same(buf: bytes, i: int, limit: int, expected: int, stop: int) -> None:
    (columns, end, next_expected), ours = _both(buf, i, limit, expected, stop)
    assert ours == (columns.keys, columns.values, end, next_expected)
    assert columns.end == next_expected and columns.nbytes == end - i
    (native_columns, native_end, native_expected) = partition._decode_columns(buf, i, limit, expected, stop)
    # From bytes the run is framed (decode_frames: spans, no objects); its columns, made on first use
    # in C or by the Python reference, are the reference decoder's.
    if partition._decode_columns is partition._native_decode_columns:  # not with LOCALSTATE_PURE_PYTHON
        assert native_columns.framed is not None and len(native_columns) == len(columns.keys)
        assert py_split_spans(*native_columns.framed) == (columns.keys, columns.values)
    assert (native_columns, native_end, native_expected) == (columns, end, next_expected)
    assert native_columns.framed is None  # split once, the buffer let go
    # the record decoder: the same stopping rule, one ChangelogRecord per record
    records, records_end, records_expected = partition.py_decode(buf, i, limit, expected, stop)
    assert (records_end, records_expected) == (end, next_expected)
    assert [(r.key, r.value) for r in records] == list(zip(columns.keys, columns.values))
    native_records = _native().decode_records(buf, i, limit, expected, stop, ChangelogRecord, *partition._RECORD_SLOTS)
    assert native_records == (records, end, next_expected)
    assert all(type(r) is ChangelogRecord for r in native_records[0])
    assert partition._decode(buf, i, limit, expected, stop) == (records, end, next_expected)
    # the validating walk from the same position
    assert _native().walk(buf, i, expected) == framing.py_walk(buf, i, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=records_strategy, base=st.integers(0, 2**40), data=st.data())
def test_decode_matches_the_reference_on_damaged_segments(records, base, data) -> None:
    buf = bytearray(_frame(records, base))
    damage = data.draw(st.sampled_from(["none", "flip", "truncate", "zero_tail", "garbage_tail", "length"]))
    if buf and damage == "flip":
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] ^= 1 << data.draw(st.integers(0, 7))
    elif buf and damage == "truncate":
        del buf[data.draw(st.integers(0, len(buf) - 1)):]
    elif damage == "zero_tail":
        buf += bytes(data.draw(st.integers(1, 60)))
    elif damage == "garbage_tail":
        buf += data.draw(st.binary(min_size=1, max_size=60))
    elif buf and damage == "length":  # a length field that points past the end, or a negative one
        at = data.draw(st.sampled_from([20, 24]))  # the first record's klen or vlen field
        if at + 4 <= len(buf):
            buf[at:at + 4] = data.draw(st.sampled_from([b"\xff\xff\xff\xff", b"\xfe\xff\xff\xff", b"\x00\x00\x01\x00"]))
    buf = bytes(buf)
    last = len(buf) - HEADER_SIZE + 1
    # limits past the last whole header too (callers pass len(buf)): clamped, never a struct.error
    limit = data.draw(st.integers(min(0, last), max(last, 0) + 40))
    expected = data.draw(st.sampled_from([0, base, base + 1, base + len(records)]))
    stop = data.draw(st.sampled_from([1 << 64, base + len(records) // 2, base, 0, 2**70]))
    _assert_same(buf, 0, limit, expected, stop)


def test_decode_reads_tombstones_empty_values_and_negative_lengths_as_the_reference() -> None:
    buf = bytearray(_frame([(b"k", None), (b"e", b""), (b"v", b"xyz")]))
    # A record whose value length is -2 and whose crc matches: the Python reader takes it as a
    # tombstone with no value bytes; the C one must agree (the segment reader relies on both
    # stopping at exactly the same records).
    odd = bytearray(HEADER.pack(0, 3, 0, 1, -2) + b"z")
    odd[0:4] = zlib.crc32(bytes(odd[4:])).to_bytes(4, "little")
    buf += odd
    buf = bytes(buf)
    _assert_same(buf, 0, len(buf) - HEADER_SIZE + 1, 0, 1 << 64)
    keys, values, end, expected = _native().decode_columns(buf, 0, len(buf) - HEADER_SIZE + 1, 0, 1 << 64)
    assert keys == [b"k", b"e", b"v", b"z"] and values == [None, b"", b"xyz", None]
    assert end == len(buf) and expected == 4


def test_a_tail_shorter_than_a_header_stops_every_decoder() -> None:
    """An object or segment that ends in a few stray bytes (a damaged or truncated tail) with the
    limit at its end, as the objectstore passes it: every decoder stops before the tail, in Python
    too (it raised struct.error there, which the object reader did not turn into its typed error)."""
    good = _frame([(b"k", b"v"), (b"l", None)])
    for tail in (b"\x00", b"\xff" * 27, bytes(range(13))):
        buf = good + tail
        records, end, expected = partition.py_decode(buf, 0, len(buf), 0, 1 << 62)
        assert (len(records), end, expected) == (2, len(good), 2)
        columns, end, expected = partition.py_decode_columns(buf, 0, len(buf), 0, 1 << 62)
        assert (len(columns), end, expected) == (2, len(good), 2)
        _assert_same(buf, 0, len(buf), 0, 1 << 62)


def test_decode_never_reads_past_the_buffer() -> None:
    buf = _frame([(b"k" * 10, b"v" * 10)] * 3)
    for cut in range(len(buf) + 1):
        piece = buf[:cut]
        # a limit beyond the last whole header is clamped, not trusted
        keys, _values, end, _expected = _native().decode_columns(piece, 0, len(piece) + 100, 0, 1 << 64)
        assert end <= cut and len(keys) == cut // (HEADER_SIZE + 20)


def test_version_reports_the_c_extensions(capsys) -> None:
    from localstate.tools.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    state = "off (LOCALSTATE_PURE_PYTHON)" if PURE else "in use"
    assert f"framing {state}" in printed and f"hotpath {state}" in printed and f"sorting {state}" in printed
    assert printed.startswith("localstate ") and printed.count("\n") == 1  # one line, never wrapped
