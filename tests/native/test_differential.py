"""Every C extension (``localstate.native``) against its Python reference twin, in one suite.

The same input goes to the C module and to the Python code it replaces, and the results (or the error
types) must be identical: hypothesis generates records, keys and values, including hostile ones (empty
buffers and keys, huge length fields, truncated buffers, corrupt crcs, garbage, keys built to tie on
the radix bytes, keys and values of the wrong types).

- ``_framing`` against ``localstate.changelog.framing`` (py_encode_into, py_walk, py_decode_columns,
  py_decode) and ``localstate.core.changelog.py_split_spans`` for its framed runs;
- ``_sorting`` against ``localstate.core.backend``'s Python sorted_items/coalesce_sorted paths;
- ``_hotpath`` against the ``KeyValueEngine`` reference methods get/put.

The extensions are optional at install (no C compiler: pure Python). Here each must be built unless
LOCALSTATE_PURE_PYTHON asks for the Python code (then the comparisons skip), so a broken build cannot
pass unnoticed (``native_support.native_module``).
"""

from __future__ import annotations

import ast
import functools
import os
import struct
import subprocess
import sys
import zlib
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import localstate.native
from localstate.changelog import framing
from localstate.changelog.framing import HEADER, HEADER_SIZE, py_encode_into
from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core import backend, changelog
from localstate.core.backend import coalesce_sorted, has_deletes, key_sizes, payload_bytes, sorted_items
from localstate.core.changelog import ChangelogRecord, RecordColumns, py_split_spans
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory
from localstate.engines.kv import engine as engine_module
from localstate.errors import LocalStateError
from localstate.native import pure_python_requested
from native_support import coalesced_reference, native_module, run_columns

PURE = pure_python_requested()


def _framing():
    return native_module("localstate.native._framing")


def _sorting():
    return native_module("localstate.native._sorting")


def _hotpath():
    return native_module("localstate.native._hotpath")


# -- the loader ---------------------------------------------------------------------------------------

def test_the_extensions_are_built_and_in_use() -> None:
    if PURE:
        assert framing.NATIVE is None and framing.encode_into is framing.py_encode_into
        assert framing.decode_columns is framing.py_decode_columns and framing.decode_records is framing.py_decode
        assert backend._SORTING is None and changelog._SORTING is None and engine_module._HOTPATH is None
        return
    assert framing.NATIVE is _framing()  # a failure here: the C extension did not build (see setup.py)
    assert framing.encode_into is _framing().encode_into and framing.walk is _framing().walk
    assert framing.decode_columns is framing._native_decode_columns
    assert framing.decode_records is framing._native_decode
    assert backend._SORTING is _sorting() and changelog._SORTING is _sorting()
    assert engine_module._HOTPATH is _hotpath()
    assert localstate.native.status() == dict.fromkeys(localstate.native.MODULES, "in use")


def test_pure_python_switch_turns_them_all_off() -> None:
    code = ("from localstate.changelog import framing; from localstate.core import backend, changelog; "
            "from localstate.engines.kv import engine; import localstate.native as n; "
            "assert framing.NATIVE is None and framing.encode_into is framing.py_encode_into; "
            "assert framing.decode_columns is framing.py_decode_columns; "
            "assert backend._SORTING is None and changelog._SORTING is None and engine._HOTPATH is None; "
            "assert set(n.status().values()) == {'off (LOCALSTATE_PURE_PYTHON)'}; print('pure')")
    env = {**os.environ, "LOCALSTATE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


def test_the_loader_knows_only_its_modules() -> None:
    with pytest.raises(ValueError, match="not one of"):
        localstate.native.load("localstate.core._sorting")
    assert localstate.native.load("_sorting") is localstate.native.load("localstate.native._sorting")


def test_native_is_the_bottom_layer() -> None:
    """localstate.native imports nothing of localstate but localstate.errors."""
    source = Path(localstate.native.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    ours = {name for name in imported if name.startswith(("localstate", "."))}
    assert ours <= {"localstate.errors"}, ours


def test_version_reports_the_c_extensions(capsys) -> None:
    from localstate.tools.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    state = "off (LOCALSTATE_PURE_PYTHON)" if PURE else "in use"
    assert f"framing {state}" in printed and f"hotpath {state}" in printed and f"sorting {state}" in printed
    assert printed.startswith("localstate ") and printed.count("\n") == 1  # one line, never wrapped


# -- _framing: encode -----------------------------------------------------------------------------------

blobs = st.one_of(st.binary(max_size=40), st.just(b""), st.binary(min_size=300, max_size=2000))
records_strategy = st.lists(st.tuples(blobs, st.one_of(st.none(), blobs)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(records=records_strategy, offset=st.integers(0, 2**64 - 40), ts=st.integers(-2**63, 2**63 - 1),
       prefix=st.binary(max_size=5), as_views=st.booleans())
def test_encode_matches_the_reference(records, offset, ts, prefix, as_views) -> None:
    if as_views:  # other bytes-like objects frame the same bytes
        records = [(bytearray(k), None if v is None else memoryview(v)) for k, v in records]
    ours, reference = bytearray(prefix), bytearray(prefix)
    assert _framing().encode_into(ours, iter(records), offset, ts) == py_encode_into(reference, records, offset, ts)
    assert ours == reference
    assert framing.count_records(ours, len(prefix)) == len(records)


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.tuples(blobs, st.one_of(st.none(), blobs)), min_size=1, max_size=30),
       offset=st.integers(0, 2**40), data=st.data())
def test_split_point_matches_the_reference(records, offset, data) -> None:
    """Where a changelog flush cuts a run that does not fit its segment: the same byte position and
    next offset in C and in Python, from any record's start and for any room."""
    buf = bytearray()
    py_encode_into(buf, records, offset, 1234)
    starts = [0]
    while starts[-1] < len(buf):
        _crc, _off, _ts, klen, vlen = HEADER.unpack_from(buf, starts[-1])
        starts.append(starts[-1] + HEADER_SIZE + klen + max(vlen, 0))
    pos = data.draw(st.sampled_from(starts[:-1]))
    room = data.draw(st.integers(1, len(buf) + 10))
    cut, next_offset = framing.py_split_point(buf, pos, room)
    assert cut in starts and cut > pos and (cut - pos >= room or cut == len(buf))
    assert next_offset == offset + starts.index(cut)
    assert _framing().split_point(buf, pos, room) == (cut, next_offset)


BAD_ITEMS = [
    ("key", b"v"),                 # a str key
    (b"k", 7),                     # an int value
    (b"k", "v"),                   # a str value
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
        _framing().encode_into(ours, records, 10, 0)
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
        _framing().encode_into(ours, records(), 0, 0)
    with pytest.raises(RuntimeError, match="input broke"):
        py_encode_into(reference, records(), 0, 0)
    assert ours == reference and framing.count_records(ours) == 2


def test_offsets_and_timestamps_out_of_range_are_refused_alike() -> None:
    for offset, ts in ((-1, 0), (2**64, 0), (0, 2**63), (0, -2**63 - 1)):
        with pytest.raises((OverflowError, struct.error)):
            py_encode_into(bytearray(), [(b"k", b"v")], offset, ts)
        with pytest.raises(OverflowError):
            _framing().encode_into(bytearray(), [(b"k", b"v")], offset, ts)
    ours, reference = bytearray(), bytearray()
    with pytest.raises(OverflowError):  # the u64 offset field would wrap within the batch
        _framing().encode_into(ours, [(b"k", b"v"), (b"l", b"w")], 2**64 - 1, 0)
    with pytest.raises((OverflowError, struct.error)):
        py_encode_into(reference, [(b"k", b"v"), (b"l", b"w")], 2**64 - 1, 0)
    assert ours == reference and framing.count_records(ours) == 1
    with pytest.raises(TypeError):
        _framing().encode_into(b"not a bytearray", [], 0, 0)


# -- _framing: decode and walk --------------------------------------------------------------------------

def _frame(records, offset=0) -> bytes:
    buf = bytearray()
    py_encode_into(buf, records, offset, 1234)
    return bytes(buf)


def _assert_same(buf: bytes, i: int, limit: int, expected: int, stop: int) -> None:
    """Every decoder and the walk, in C and in Python, on the same bytes: the same records, end and
    next offset (they all stop at exactly the same record)."""
    native = _framing()
    columns, end, next_expected = framing.py_decode_columns(buf, i, limit, expected, stop)
    assert native.decode_columns(buf, i, limit, expected, stop) == (columns.keys, columns.values, end, next_expected)
    assert columns.end == next_expected and columns.nbytes == end - i
    # From bytes the run is framed (decode_frames: spans, no objects); its columns, split in C or by
    # the Python reference, are the reference decoder's.
    spans, count, frames_end, frames_expected = native.decode_frames(buf, i, limit, expected, stop)
    assert (count, frames_end, frames_expected) == (len(columns.keys), end, next_expected)
    assert py_split_spans(buf, spans) == _sorting().split_spans(buf, spans) == (columns.keys, columns.values)
    if framing.NATIVE is not None:  # the library's C path (not with LOCALSTATE_PURE_PYTHON)
        run = framing._native_decode_columns(buf, i, limit, expected, stop)
        assert run[0].framed is not None and len(run[0]) == len(columns.keys)
        assert run == (columns, end, next_expected)
    # the record decoder: the same stopping rule, one ChangelogRecord per record
    records, records_end, records_expected = framing.py_decode(buf, i, limit, expected, stop)
    assert (records_end, records_expected) == (end, next_expected)
    assert [(r.key, r.value) for r in records] == list(zip(columns.keys, columns.values))
    native_records = native.decode_records(buf, i, limit, expected, stop, ChangelogRecord, *framing._RECORD_SLOTS)
    assert native_records == (records, end, next_expected)
    assert all(type(r) is ChangelogRecord for r in native_records[0])
    assert framing.decode_records(buf, i, limit, expected, stop) == (records, end, next_expected)
    assert framing.decode_columns(buf, i, limit, expected, stop) == (columns, end, next_expected)
    # the validating walk from the same position
    assert native.walk(buf, i, expected) == framing.py_walk(buf, i, expected)


def _damaged(data, buf: bytearray) -> bytearray:
    damage = data.draw(st.sampled_from(["none", "flip", "crc", "truncate", "zero_tail", "garbage_tail",
                                        "length", "huge_length"]))
    if buf and damage == "flip":
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] ^= 1 << data.draw(st.integers(0, 7))
    elif len(buf) >= HEADER_SIZE and damage == "crc":  # a corrupt crc on a record that is otherwise whole
        buf[0:4] = (int.from_bytes(buf[0:4], "little") ^ data.draw(st.integers(1, 2**32 - 1))).to_bytes(4, "little")
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
    elif damage == "huge_length":
        # a whole header of its own, crc matching its fields, with lengths up to the format's maxima
        klen = data.draw(st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1]))
        vlen = data.draw(st.sampled_from([-2**31, -2, -1, 0, 2**31 - 1]))
        head = bytearray(HEADER.pack(0, data.draw(st.integers(0, 2**64 - 1)), 0, klen, vlen))
        head[0:4] = zlib.crc32(bytes(head[4:])).to_bytes(4, "little")
        buf += head + data.draw(st.binary(max_size=20))
    return buf


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=records_strategy, base=st.integers(0, 2**40), data=st.data())
def test_decode_matches_the_reference_on_damaged_runs(records, base, data) -> None:
    buf = bytes(_damaged(data, bytearray(_frame(records, base))))
    last = len(buf) - HEADER_SIZE + 1
    # limits past the last whole header too (callers pass len(buf)): clamped, never a struct.error
    limit = data.draw(st.integers(min(0, last), max(last, 0) + 40))
    start = data.draw(st.sampled_from([0, 0, 1, HEADER_SIZE, len(buf)]))
    expected = data.draw(st.sampled_from([0, base, base + 1, base + len(records)]))
    stop = data.draw(st.sampled_from([1 << 64, base + len(records) // 2, base, 0, 2**70]))
    _assert_same(buf, min(start, len(buf)), limit, expected, stop)


@settings(max_examples=300, deadline=None)
@given(buf=st.binary(max_size=200), expected=st.integers(0, 2**64 - 1))
def test_arbitrary_bytes_decode_and_walk_alike(buf, expected) -> None:
    _assert_same(buf, 0, len(buf), 0, 1 << 64)
    assert _framing().walk(buf, 0, expected) == framing.py_walk(buf, 0, expected)


def test_empty_and_header_only_buffers() -> None:
    for buf in (b"", bytes(HEADER_SIZE - 1), bytes(HEADER_SIZE), _frame([(b"", b"")]), _frame([(b"", None)])):
        _assert_same(buf, 0, len(buf), 0, 1 << 64)
        _assert_same(buf, 0, len(buf) + 100, 0, 1 << 64)


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
    keys, values, end, expected = _framing().decode_columns(buf, 0, len(buf) - HEADER_SIZE + 1, 0, 1 << 64)
    assert keys == [b"k", b"e", b"v", b"z"] and values == [None, b"", b"xyz", None]
    assert end == len(buf) and expected == 4


def test_a_tail_shorter_than_a_header_stops_every_decoder() -> None:
    """A run that ends in a few stray bytes (a damaged or truncated tail) with the limit at its end, as
    the objectstore passes it: every decoder stops before the tail, in Python too."""
    good = _frame([(b"k", b"v"), (b"l", None)])
    for tail in (b"\x00", b"\xff" * 27, bytes(range(13))):
        buf = good + tail
        records, end, expected = framing.py_decode(buf, 0, len(buf), 0, 1 << 62)
        assert (len(records), end, expected) == (2, len(good), 2)
        columns, end, expected = framing.py_decode_columns(buf, 0, len(buf), 0, 1 << 62)
        assert (len(columns), end, expected) == (2, len(good), 2)
        _assert_same(buf, 0, len(buf), 0, 1 << 62)


def test_decode_never_reads_past_the_buffer() -> None:
    buf = _frame([(b"k" * 10, b"v" * 10)] * 3)
    for cut in range(len(buf) + 1):
        piece = buf[:cut]
        # a limit beyond the last whole header is clamped, not trusted
        keys, _values, end, _expected = _framing().decode_columns(piece, 0, len(piece) + 100, 0, 1 << 64)
        assert end <= cut and len(keys) == cut // (HEADER_SIZE + 20)
        _assert_same(piece, 0, len(piece) + 100, 0, 1 << 64)


# -- _sorting -------------------------------------------------------------------------------------------

# Few distinct bytes and lengths around 8, so that ties on the 8-byte prefix, zero padding and
# prefix-of-another keys are common; empty keys and long shared prefixes too.
KEYS = st.one_of(st.binary(max_size=12), st.lists(st.sampled_from([b"\x00", b"a", b"\xff"]), max_size=11)
                 .map(b"".join), st.binary(min_size=8, max_size=8).map(lambda k: k + b"\x00"))
PREFIXED = st.tuples(st.sampled_from([b"", b"user-", b"user-0000", b"\x00" * 40]), KEYS).map(b"".join)
VALUES = st.one_of(st.none(), st.binary(max_size=4))
RUNS = st.lists(st.lists(st.tuples(PREFIXED, VALUES), max_size=25), max_size=6)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, st.one_of(st.none(), st.binary(max_size=3)), max_size=60))
def test_sorted_items_is_bytes_order(run) -> None:
    expected = sorted(run.items(), key=itemgetter(0))
    assert _sorting().sorted_items(run) == expected
    assert sorted_items(run) == expected
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "_SORTING", None)
        assert list(sorted_items(run)) == expected


def test_sorted_items_of_a_large_run_with_shared_prefixes() -> None:
    run = {b"user-%08d" % ((i * 7919) % 100_003): i for i in range(50_000)}
    run.update({b"": 0, b"user-": 1, b"user-\x00": 2, b"user-000": 3})
    assert _sorting().sorted_items(run) == sorted(run.items())


def test_other_keys_and_mappings_take_pythons_sort() -> None:
    assert sorted_items({"b": 1, "a": 2}) == [("a", 2), ("b", 1)]          # str keys: not bytes

    class Key(bytes):
        pass

    assert sorted_items({Key(b"b"): 1, b"a": 2}) == [(b"a", 2), (b"b", 1)]  # a bytes subclass
    with pytest.raises(TypeError):
        _sorting().sorted_items({"a": 1})
    with pytest.raises(TypeError):
        _sorting().sorted_items([(b"a", 1)])

    class Run(dict):
        pass

    assert sorted_items(Run({b"b": 1, b"a": 2})) == [(b"a", 2), (b"b", 1)]


def _framed(run: list[tuple[bytes, bytes | None]]) -> RecordColumns:
    """``run`` in the changelog framing, read back framed (decode_frames: spans into the bytes read, no
    object per record), as the restore reads a segment."""
    buf = bytes(_frame(run))
    spans, count, end, expected = _framing().decode_frames(buf, 0, len(buf), 0, 1 << 64)
    assert (count, end, expected) == (len(run), len(buf), len(run))
    return RecordColumns.from_frames(buf, spans, count, expected, end)


def _assert_coalesced(key_runs, value_runs, runs) -> None:
    keys, values, sizes, nbytes = coalesced_reference(runs)
    c_keys, c_values, shortest, longest, c_bytes, c_deletes = _sorting().coalesce_sorted(key_runs, value_runs)
    assert (c_keys, c_values, (shortest, longest), c_bytes, c_deletes) == (keys, values, sizes, nbytes,
                                                                           values.count(None))
    assert all(type(k) is bytes for k in c_keys) and all(v is None or type(v) is bytes for v in c_values)
    for sorting in (_sorting(), None):  # the library's function, on the C code and on the Python fallback
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(backend, "_SORTING", sorting)
            patch.setattr(changelog, "_SORTING", sorting)  # split_spans of framed runs too
            run = coalesce_sorted(key_runs, value_runs)
        assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == (keys, values, sizes, nbytes)
        assert run.deletes == values.count(None) and has_deletes(run) == (None in values)
        if keys:
            assert key_sizes(run) == key_sizes(dict(zip(keys, values))) == sizes
        assert payload_bytes(run) == payload_bytes(dict(zip(keys, values))) == nbytes


@settings(max_examples=300, deadline=None)
@given(RUNS)
def test_coalesce_to_the_last_value_in_bytes_order(runs) -> None:
    _assert_coalesced(*run_columns(runs), runs)


@settings(max_examples=200, deadline=None)
@given(RUNS, st.lists(st.booleans(), min_size=6, max_size=6))
def test_framed_runs_coalesce_like_their_columns(runs, framed) -> None:
    """Runs still framed in their bytes, mixed with plain column runs (as a carried-over chunk is)."""
    key_runs, value_runs = run_columns(runs)
    for index, run in enumerate(runs):
        if framed[index]:
            key_runs[index], value_runs[index] = _framed(run).framed, None
    _assert_coalesced(key_runs, value_runs, runs)


def test_split_spans_in_c_and_python_and_framed_columns_made_on_first_use() -> None:
    records = [(b"a", b"1"), (b"", b""), (b"b", None), (b"a", b"22")]
    columns = _framed(records)
    buffer, spans = columns.framed
    expected = ([k for k, _ in records], [v for _, v in records])
    assert _sorting().split_spans(buffer, spans) == expected
    assert py_split_spans(buffer, spans) == expected
    assert _sorting().split_spans(b"", b"") == py_split_spans(b"", b"") == ([], [])
    assert len(columns) == 4 and columns.framed is not None  # len() does not make the columns
    assert (columns.keys, columns.values) == expected and columns.framed is None
    assert columns == RecordColumns(*expected, columns.end, columns.nbytes)


def test_coalesce_refuses_malformed_columns() -> None:
    """Malformed columns (which the library never passes): refused in C; the Python fallback checks the
    same where it can."""
    sorting = _sorting()
    with pytest.raises(ValueError, match="run 1 has 2 keys and 1 values"):
        sorting.coalesce_sorted([[b"a"], [b"b", b"c"]], [[1], [2]])
    with pytest.raises(ValueError, match="as many value runs"):
        sorting.coalesce_sorted([[b"a"]], [])
    with pytest.raises(TypeError):
        sorting.coalesce_sorted([(b"a",)], [[1]])
    with pytest.raises(TypeError, match="str, not bytes"):
        sorting.coalesce_sorted([[b"a", "b"]], [[1, 2]])
    with pytest.raises(ValueError):
        coalesce_sorted([["a", "b"]], [[1]])


def test_c_refuses_spans_outside_their_buffer() -> None:
    """Spans are checked against their buffer before a byte is read: a span past its end, a negative
    length or position, a partial span, or a framed run that is not (bytes, bytes) is refused (the
    Python reference trusts its caller, decode_frames, whose spans are always inside)."""
    sorting = _sorting()
    buffer, spans = _framed([(b"key", b"value")]).framed
    fields = list(struct.unpack("=qqqq", spans))
    for index, bad in [(0, len(buffer)), (1, len(buffer) + 1), (0, -1), (3, -2), (2, len(buffer)), (1, -1),
                       (1, 2**62), (3, 2**62)]:
        broken = fields.copy()
        broken[index] = bad
        packed = struct.pack("=qqqq", *broken)
        with pytest.raises(ValueError, match="outside its buffer"):
            sorting.split_spans(buffer, packed)
        with pytest.raises(ValueError, match="outside its buffer"):
            sorting.coalesce_sorted([(buffer, packed)], [None])
    with pytest.raises(ValueError, match="whole number"):
        sorting.split_spans(buffer, spans[:-1])
    with pytest.raises(TypeError):
        sorting.coalesce_sorted([(bytearray(buffer), spans)], [None])
    with pytest.raises(TypeError):
        sorting.coalesce_sorted([(buffer,)], [None])


# -- _hotpath -------------------------------------------------------------------------------------------

SERDES = {"string": StringSerde, "int": IntSerde, "bytes": BytesSerde, "json": JsonSerde}


def _open(directory: Path, key_serde: str, value_serde: str, *, native: bool, cache_size: int = 4,
          write_batch_size: int = 3, time: Any = None, backend: str = "memory", **extra: Any) -> Any:
    """A kv store (memory backend unless ``backend``) whose get/put and flush are the C ones
    (``native``) or the reference methods (``extra``: more options, e.g. ``ttl``, with ``time`` the
    store's time source)."""
    saved = engine_module._HOTPATH, engine_module._SORTING
    engine_module._HOTPATH = _hotpath() if native else None
    engine_module._SORTING = _sorting() if native else None
    try:
        options = KeyValueEngineFactory().validate_options(
            "s", {"backend": backend, "cache_size": cache_size, "write_batch_size": write_batch_size, **extra})
        ctx = StoreContext(job="job", store="s", partition=0, directory=directory, options=options,
                           key_serde=SERDES[key_serde](), value_serde=SERDES[value_serde](),
                           changelog=MemoryChangelogPartition("hot", 0), **({"time": time} if time else {}))
        store = KeyValueEngineFactory().create(ctx)
        store._bulk_misses = native  # the reference reads a batch's misses key by key
        return store
    finally:
        engine_module._HOTPATH, engine_module._SORTING = saved


def test_the_c_hot_path_is_installed_unless_pure_python_is_requested(tmp_path: Path) -> None:
    store = _open(tmp_path, "string", "int", native=engine_module._HOTPATH is not None)
    if PURE:
        assert store.get.__func__ is engine_module.KeyValueEngine.get  # the reference method
    else:
        assert type(store.get.__self__).__name__ == "HotPath"
    store.close()


# Keys and values of the right kind and of wrong kinds (a bool for an int, a str for bytes, ...): the
# fast paths must hand every case they do not own to the reference path, which raises the typed error.
ANY_KEY = st.one_of(st.sampled_from(["a", "b", "c", "d", "e", "f", ""]), st.integers(-3, 3), st.booleans(),
                    st.sampled_from([b"a", b"b", b"c", b"", 2**64, -2**63 - 1, 1.0, None]))
ANY_VALUE = st.one_of(st.integers(-3, 3), st.sampled_from([2**63 - 1, -2**63, 2**63, -2**63 - 1, True, None]),
                      st.binary(max_size=3), st.text(max_size=2), st.lists(st.integers(0, 2), max_size=2))
OPS = st.lists(st.one_of(
    st.tuples(st.just("get"), ANY_KEY),
    st.tuples(st.just("put"), st.tuples(ANY_KEY, ANY_VALUE)),
    st.tuples(st.just("delete"), ANY_KEY),
    st.tuples(st.just("flush"), st.none()),
    st.tuples(st.just("get_kw"), ANY_KEY),
    st.tuples(st.just("put_args"), st.integers(0, 3)),
), max_size=60)


def _run(store: Any, ops: list[tuple[str, Any]]) -> list[Any]:
    """Every operation's result or error type (and message)."""
    out: list[Any] = []
    for op, arg in ops:
        try:
            if op == "get":
                result = store.get(arg)
            elif op == "get_kw":
                result = store.get(key=arg)
            elif op == "put":
                result = store.put(*arg)
            elif op == "put_args":  # a wrong number of arguments: the same TypeError either way
                result = store.put(*(["a"] * arg))
            elif op == "delete":
                result = store.delete(arg)
            elif op == "get_many":
                result = store.get_many(arg)
            elif op == "put_many":
                result = store.put_many(*arg)
            elif op == "merge_many":
                keys, deltas, how, results = arg
                result = store.merge_many(keys, deltas, how, results=results)
            elif op == "tick":  # the clock moves; the store reads it (as at a commit)
                store.context.time.advance_processing_time(arg)
                result = store.refresh_time()
            else:
                result = store.flush()
            out.append(("ok", result))
        except (LocalStateError, TypeError, ValueError) as exc:
            out.append((type(exc).__name__, str(exc).replace("KeyValueEngine.", "")))
    return out


def _normalise(results: list[Any]) -> list[Any]:
    # A TypeError about the call's arity names the function; the C method and the reference method
    # name it differently but both reject the same calls.
    return [(kind, "arity" if kind == "TypeError" and "argument" in message else message)
            if kind != "ok" else (kind, message) for kind, message in results]


@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "int"), ("bytes", "bytes"),
                                                   ("string", "json"), ("string", "bytes"), ("json", "int")])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=OPS)
def test_c_and_reference_get_put_behave_alike(tmp_path_factory, key_serde, value_serde, ops) -> None:
    stores = [_open(tmp_path_factory.mktemp("native"), key_serde, value_serde, native=True),
              _open(tmp_path_factory.mktemp("python"), key_serde, value_serde, native=False)]
    try:
        _assert_alike(stores, ops)
    finally:
        for store in stores:
            store.close()


def _assert_alike(stores: list[Any], ops: list[tuple[str, Any]]) -> None:
    """The C store and the reference store answer ``ops`` alike and end alike: results, logged
    records, contents, spills, and the cache (with ttl, the cached expiries too)."""
    results = [_run(store, ops) for store in stores]
    assert _normalise(results[0]) == _normalise(results[1])
    _assert_same_state(stores)


def _assert_same_state(stores: list[Any]) -> None:
    """The two stores hold alike: logged records, contents, spills and the cache (with ttl, the
    cached expiries too)."""
    for store in stores:
        store.flush()
    logged = [[(r.key, r.value) for r in store._logged.changelog.read(0)] for store in stores]
    assert logged[0] == logged[1]
    states = [sorted(store.all(), key=repr) for store in stores]  # json keys mix types
    assert states[0] == states[1]
    assert stores[0].spills == stores[1].spills
    assert (stores[0]._cache.young, stores[0]._cache.old) == (stores[1]._cache.young, stores[1]._cache.old)
    assert getattr(stores[0]._cache, "expiry", None) == getattr(stores[1]._cache, "expiry", None)


@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "int"), ("bytes", "bytes"),
                                                   ("string", "json")])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=st.lists(st.one_of(st.tuples(st.just("tick"), st.sampled_from([0.5, 2, 6])),
                              st.tuples(st.just("get"), ANY_KEY), st.tuples(st.just("put"), st.tuples(ANY_KEY, ANY_VALUE)),
                              st.tuples(st.just("delete"), ANY_KEY), st.tuples(st.just("flush"), st.none())),
                    max_size=60))
def test_c_and_reference_get_put_behave_alike_with_ttl(tmp_path_factory, key_serde, value_serde, ops) -> None:
    """The ttl store's C get/put (the plain ``HotPath``: its cache holds only live values) against its
    reference methods, with time moving."""
    from localstate.testing.time import ManualTime
    stores = [_open(tmp_path_factory.mktemp(kind), key_serde, value_serde, native=kind == "native", ttl="5s",
                    time=ManualTime(100.0)) for kind in ("native", "python")]
    try:
        if not PURE:
            assert type(stores[0].get.__self__).__name__ == "HotPath"
        _assert_alike(stores, ops)
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("native", [True, False], ids=["c", "reference"])
def test_spill_and_rotation(tmp_path: Path, native: bool) -> None:
    """The counting pattern (get + put of the same key) over more keys than the cache holds and more
    changes than a spill allows: exact counts after a flush, from the cache and from the backend."""
    store = _open(tmp_path, "string", "int", native=native, cache_size=8, write_batch_size=5)
    expected: dict[str, int] = {}
    for i in range(2_000):
        key = f"k{(i * 7919) % 37}"
        store.put(key, (store.get(key) or 0) + 1)
        expected[key] = expected.get(key, 0) + 1
        if i % 250 == 0:
            store.flush()
    store.flush()
    assert store.spills > 0
    assert {k: store.get(k) for k in expected} == expected
    store._cache.clear()
    assert dict(store.all()) == expected
    store.close()


def test_a_hot_path_made_without_init_refuses_to_run() -> None:
    hot_path = _hotpath().HotPath
    blank = hot_path.__new__(hot_path)
    with pytest.raises(RuntimeError, match="before __init__"):
        blank.get("a")
    with pytest.raises(RuntimeError, match="before __init__"):
        blank.put("a", 1)


@given(data=st.binary(max_size=70))
def test_murmur2_is_kafkas_as_the_reference_computes_it(data: bytes) -> None:
    """``_hotpath.murmur2`` (every key's partition, checked as inputs are read) against
    ``core/partitioner.py``'s ``py_murmur2``, on every length modulo 4 and every byte value."""
    from localstate.core.partitioner import py_murmur2
    assert _hotpath().murmur2(data) == py_murmur2(data)


def test_murmur2_known_values_and_refusals() -> None:
    """Values of Kafka's Java client (``Utils.murmur2``), and what is not bytes."""
    murmur2 = _hotpath().murmur2
    assert murmur2(b"21") == -973932308 and murmur2(b"") == 275646681 and murmur2(b"foobar") == -790332482
    for bad in ("21", bytearray(b"21"), None, 21):
        with pytest.raises(TypeError, match="murmur2"):
            murmur2(bad)


# -- the C flush (_sorting.pending_items) ----------------------------------------------------------------

class _Int(int):
    """An int subclass: the int serde holds it as it is (the C flush leaves such a map to the reference)."""


def _model_pending(dirty: dict[Any, Any], kind: int, int_values: bool, prefix: bytes) -> tuple[list[Any], list[Any]]:
    """What the kv flush gives for a pending map, written out independently: each cache key's stored
    key (bytes as they are, str as UTF-8, int as the int serde's 8 bytes), each held value after
    ``prefix`` (an int packed by the int serde; None: a delete), in stored-key order."""
    rows = []
    for key, value in dirty.items():
        kb = key if kind == 0 else key.encode() if kind == 1 else struct.pack(">Q", key + 2**63)
        vb = None if value is None else prefix + (struct.pack(">Q", value + 2**63) if int_values else value)
        rows.append((kb, vb, key))
    rows.sort(key=itemgetter(0))
    return [key for _, _, key in rows], [(kb, vb) for kb, vb, _ in rows]


_LONE_SURROGATE = "a\udc80"
CACHE_KEYS = {0: st.one_of(st.binary(max_size=12), st.sampled_from([b"", b"\x00", b"\xff" * 9]),
                           st.just("not bytes")),
              1: st.one_of(st.text(max_size=12), st.sampled_from(["", "\x00", "é", "\U0001f600", "user-0001"]),
                           st.just(_LONE_SURROGATE), st.just(b"not str")),
              2: st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1, -2**63]),
                           st.sampled_from([2**63, -2**63 - 1, 1.5]), st.builds(_Int, st.integers(0, 9)))}
HELD_VALUES = {True: st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.sampled_from([2**63, -2**63 - 1]),
                               st.builds(_Int, st.integers(0, 9)), st.just(2.5)),
               False: st.one_of(st.none(), st.binary(max_size=10), st.builds(bytearray, st.binary(max_size=2)),
                                st.just("text"))}


def _supported(dirty: dict[Any, Any], kind: int, int_values: bool) -> bool:
    """Whether every entry is what the kinds promise (else the C flush answers NotImplemented)."""
    key_class = (bytes, str, int)[kind]
    for key, value in dirty.items():
        if type(key) is not key_class or (kind == 1 and key == _LONE_SURROGATE) or (
                kind == 2 and not -2**63 <= key < 2**63):
            return False
        if value is not None and (type(value) is not int or not -2**63 <= value < 2**63 if int_values
                                  else type(value) is not bytes):
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(data=st.data(), kind=st.sampled_from([0, 1, 2]), int_values=st.booleans(),
       prefix=st.one_of(st.just(b""), st.binary(min_size=1, max_size=8)), with_keys=st.booleans())
def test_pending_items_encodes_and_sorts_as_the_model(data, kind, int_values, prefix, with_keys) -> None:
    """``_sorting.pending_items`` (the kv flush in C) on hostile pending maps: keys of the wrong class,
    lone surrogates, ints past the int serde's range, int subclasses, values of the wrong kind. Each
    supported map gives exactly the model's stored keys and values, in stored-key order; any other map
    gives NotImplemented (the engine's reference code then encodes, raising its own errors)."""
    dirty = data.draw(st.dictionaries(CACHE_KEYS[kind], HELD_VALUES[int_values], max_size=40))
    result = _sorting().pending_items(dirty, kind, int_values, prefix, with_keys)
    if not _supported(dirty, kind, int_values):
        assert result is NotImplemented
        return
    keys, items = _model_pending(dirty, kind, int_values, prefix)
    assert result == (keys if with_keys else None, items)
    assert all(type(kb) is bytes and (vb is None or type(vb) is bytes) for kb, vb in result[1])


def test_pending_items_refuses_malformed_calls() -> None:
    pending = _sorting().pending_items
    with pytest.raises(TypeError):
        pending([("a", 1)], 1, True, b"", True)
    with pytest.raises(TypeError):
        pending({"a": 1}, 1, True, "prefix", True)
    with pytest.raises(ValueError, match="key_kind"):
        pending({"a": 1}, 3, True, b"", True)
    with pytest.raises(TypeError):
        pending({"a": 1}, 1, True, b"")
    assert pending({}, 1, True, b"", True) == ([], [])


FLUSH_SERDES = [("string", "int"), ("int", "int"), ("bytes", "bytes"), ("string", "json"), ("string", "string"),
                ("json", "int"), ("int", "bytes")]
WRITE_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.tuples(ANY_KEY, ANY_VALUE)),
    st.tuples(st.just("delete"), ANY_KEY),
    st.tuples(st.just("get"), ANY_KEY),
    st.tuples(st.just("flush"), st.none()),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 2, 6])),
), max_size=50)


def _stored(store: Any) -> list[tuple[bytes, bytes]]:
    """Every entry the store's backend holds, as bytes (what a restart reads)."""
    store.flush()
    return store.backend.scan(None, None, 10_000)


def _assert_same_flushes(directories: list[Path], key_serde: str, value_serde: str, backend: str, ttl: str | None,
                         ops: list[tuple[str, Any]]) -> None:
    """A store with the C flush (and the C get/put) and one with the reference flush, each in its own
    directory, given ``ops``: the same results and errors, and byte for byte the same changelog records
    (keys, values, offsets) and stored keys and values."""
    from localstate.testing.time import ManualTime
    if ttl is None:
        ops = [op for op in ops if op[0] != "tick"]  # only a ttl store reads the clock
    stores = [_open(directory, key_serde, value_serde, native=native, backend=backend, cache_size=6,
                    write_batch_size=4, **({} if ttl is None else {"ttl": ttl, "time": ManualTime(100.0)}))
              for directory, native in zip(directories, (True, False))]
    try:
        if not PURE:
            assert stores[0]._native_flush is not None and stores[1]._native_flush is None
        results = [_run(store, ops) for store in stores]
        assert _normalise(results[0]) == _normalise(results[1])
        logged = [[(r.key, r.value, r.offset) for r in store._logged.changelog.read(0)] for store in stores]
        stored = [_stored(store) for store in stores]
        assert logged[0] == logged[1]
        assert stored[0] == stored[1]
        assert stores[0].spills == stores[1].spills
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("key_serde,value_serde", FLUSH_SERDES)
@pytest.mark.parametrize("ttl", [None, "5s"], ids=["plain", "ttl"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=WRITE_OPS)
def test_c_flush_and_reference_write_the_same_bytes(tmp_path_factory, key_serde, value_serde, ttl, ops) -> None:
    """The C flush against the reference flush for every built-in serde, with and without ttl (the
    memory backend: many examples)."""
    _assert_same_flushes([tmp_path_factory.mktemp("c"), tmp_path_factory.mktemp("py")], key_serde, value_serde,
                         "memory", ttl, ops)


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "json"), ("bytes", "bytes")])
@pytest.mark.parametrize("ttl", [None, "5s"], ids=["plain", "ttl"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(ops=WRITE_OPS)
def test_c_flush_writes_rocksdb_and_lmdb_as_the_reference(tmp_path_factory, backend, key_serde, value_serde, ttl,
                                                          ops) -> None:
    """The same comparison on the file backends (what they store is what a restart reads)."""
    _assert_same_flushes([tmp_path_factory.mktemp("c"), tmp_path_factory.mktemp("py")], key_serde, value_serde,
                         backend, ttl, ops)


# -- the batched operations' C passes (HotPath.lookup, put_many, missing with merge) ----------------------

BATCH_KEY = st.one_of(st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h"]), ANY_KEY)
BATCH_OPS = st.lists(st.one_of(
    st.tuples(st.just("get_many"), st.lists(BATCH_KEY, max_size=12)),
    st.tuples(st.just("put_many"), st.lists(st.tuples(BATCH_KEY, ANY_VALUE), max_size=12).map(
        lambda rows: ([k for k, _ in rows], [v for _, v in rows]))),
    st.tuples(st.just("put_many"), st.tuples(st.lists(BATCH_KEY, max_size=4), st.lists(ANY_VALUE, max_size=4))),
    st.tuples(st.just("merge_many"), st.tuples(
        st.lists(BATCH_KEY, min_size=0, max_size=12).flatmap(lambda keys: st.tuples(
            st.just(keys), st.lists(st.one_of(st.integers(-3, 3), st.sampled_from([2**63 - 1, True, 1.5])),
                                    min_size=len(keys), max_size=len(keys)))),
        st.sampled_from(["add", "min", "max"]), st.booleans()).map(lambda t: (t[0][0], t[0][1], t[1], t[2]))),
    st.tuples(st.just("get"), BATCH_KEY),
    st.tuples(st.just("put"), st.tuples(BATCH_KEY, ANY_VALUE)),
    st.tuples(st.just("delete"), BATCH_KEY),
    st.tuples(st.just("flush"), st.none()),
), max_size=25)


def _per_key_merge(store: Any, keys: list[Any], deltas: list[Any], op: str = "add", *,
                   results: bool = False) -> list[Any] | None:
    """merge_many as the loop of per-key read-modify-writes (``KeyValueEngine._merge_slow`` per row),
    after merge_many's own argument checks."""
    if op not in engine_module.MERGE_OPS or len(keys) != len(deltas):  # refused before any row
        return engine_module.KeyValueEngine.merge_many(store, keys, deltas, op, results=results)
    store._merge_op = op
    out = [store._merge_slow(key, delta) for key, delta in zip(keys, deltas)]
    return out if results else None


@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "int"), ("bytes", "bytes"),
                                                   ("string", "json"), ("string", "string"), ("json", "int")])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=BATCH_OPS, cache_size=st.sampled_from([0, 3, 16]))
def test_c_and_reference_batched_operations_behave_alike(tmp_path_factory, key_serde, value_serde, ops,
                                                         cache_size) -> None:
    """get_many, put_many and merge_many with their C passes (the cache lookups, a put of cached keys,
    the keys a merge must prefetch) against the reference methods, on hostile batches (keys and values
    of the wrong kinds, None values, unequal lengths, keys the cache does not hold): the same results
    and errors, the same changelog records, contents, spills and caches."""
    stores = [_open(tmp_path_factory.mktemp(kind), key_serde, value_serde, native=kind == "native",
                    cache_size=cache_size) for kind in ("native", "python")]
    if stores[0]._hot_merge is not None:
        # the C merge_many is the per-key loop (put(k, op(get(k), d)) row by row: spills between rows,
        # rows before a failing row applied), not the reference method's fold of the batch
        stores[1].merge_many = functools.partial(_per_key_merge, stores[1])
    try:
        for step in ops:
            outcomes = [_normalise(_run(store, [step])) for store in stores]
            if step[0] == "merge_many" and "ok" not in (outcomes[0][0][0], outcomes[1][0][0]):
                assert outcomes[0][0][0] == outcomes[1][0][0], step  # the same error (about another row)
            if step[0] == "merge_many" and (outcomes[0][0][0], outcomes[1][0][0]) != ("ok", "ok"):
                # merge_many in C checks each row as the per-key loop does (put(k, op(get(k), d))) and
                # applies the rows before a failing one; the reference folds the rows, checks the
                # values that survive and applies none on an error. Either way a failure fails the
                # task's batch, rolled back to the last commit: the states after it may differ.
                return
            assert outcomes[0] == outcomes[1], step
        _assert_same_state(stores)
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "json"), ("bytes", "bytes")])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=BATCH_OPS, cache_size=st.sampled_from([3, 16]))
def test_misses_read_rocksdb_and_lmdb_as_the_reference(tmp_path_factory, backend, key_serde, value_serde,
                                                               ops, cache_size) -> None:
    """Reads of keys neither cached nor pending: a batch's read column-wise (``_read_cold``: one
    encode, one backend read, one cache update) and get's read in C (``HotPath.cold_reads``) against
    the reference's key-by-key reads in Python, on the file backends, after a commit of every key and
    with the cache emptied (every read then misses, and finds stored values to decode; a cache of 3
    entries evicts): the same results, changelog records and stored bytes, the same cache."""
    # no spill (write_batch_size 64): a C merge_many spills between rows as the per-key loop would, the
    # reference after folding its batch, so their changelogs would differ in record order
    stores = [_open(tmp_path_factory.mktemp(kind), key_serde, value_serde, native=kind == "native", backend=backend,
                    cache_size=cache_size, write_batch_size=64) for kind in ("native", "python")]
    keys = {"string": ["a", "b", "c", "d", "e", "f", "g", "h"], "int": [-3, -1, 0, 1, 2, 3],
            "bytes": [b"a", b"b", b"c", b"d"]}[key_serde]
    value = {"int": 7, "json": {"n": [1]}, "bytes": b"v"}[value_serde]
    try:
        for store in stores:
            store.put_many(keys, [value] * len(keys))
            store.flush()
            store._cache.clear()
        first = [_run(store, [("get_many", keys[1:] + keys[:2])]) for store in stores]
        assert first[0] == first[1] == [("ok", [value] * (len(keys) + 1))]
        caches = [(store._cache.young, store._cache.old) for store in stores]
        assert caches[0] == caches[1] and sum(map(len, caches[0])) <= cache_size
        for store in stores:
            store._cache.clear()
        each = [_run(store, [("get", key) for key in keys + keys[:2]]) for store in stores]
        assert each[0] == each[1] == [("ok", value)] * (len(keys) + 2)
        caches = [(store._cache.young, store._cache.old) for store in stores]
        assert caches[0] == caches[1] and sum(map(len, caches[0])) <= cache_size
        # a merge whose first rows hit the cache and the next miss it (the C merge stops there, reads
        # the rest's misses at once and resumes)
        merged = [_run(store, [("merge_many", (keys[-2:] + keys, [1] * (len(keys) + 2), "add", False)),
                               ("get_many", keys)]) for store in stores]
        assert merged[0] == merged[1]
        for step in ops:
            outcomes = [_normalise(_run(store, [step])) for store in stores]
            if step[0] == "merge_many" and (outcomes[0][0][0], outcomes[1][0][0]) != ("ok", "ok"):
                return  # a failed merge_many: see test_c_and_reference_batched_operations_behave_alike
            assert outcomes[0] == outcomes[1], step
        assert _stored(stores[0]) == _stored(stores[1])
        # not the caches: after a merge_many under cache pressure the C merge (key by key) and the
        # reference (the batch's distinct keys first) leave different, equally valid, cache contents
        logged = [[(r.key, r.value, r.offset) for r in store._logged.changelog.read(0)] for store in stores]
        assert logged[0] == logged[1] and stores[0].spills == stores[1].spills
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb", "lmdb"])
@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "json"), ("bytes", "string")])
def test_a_stored_value_that_does_not_decode_fails_get_alike(tmp_path: Path, backend, key_serde, value_serde) -> None:
    """A stored value the fast decoders refuse (7 bytes for the int serde, bad UTF-8, bad json) read by
    get and get_many after a miss: the C read hands it to the reference, which raises the same typed
    SerdeError, and caches nothing."""
    stores = [_open(tmp_path / kind, key_serde, value_serde, native=kind == "native", backend=backend)
              for kind in ("native", "python")]
    key = {"string": "k", "int": 5, "bytes": b"k"}[key_serde]
    try:
        for store in stores:
            store.backend.write([(store._key_bytes(key), b"\xff" * 7)], deletes=False)
        outcomes = [_run(store, [("get", key), ("get_many", [key])]) for store in stores]
        assert outcomes[0] == outcomes[1]
        assert [kind for kind, _ in outcomes[0]] == ["SerdeError", "SerdeError"]
        assert not any(len(store._cache) for store in stores)
    finally:
        for store in stores:
            store.close()
