"""backend.coalesce_sorted, the restore path's coalesce-and-sort for backends that bulk-write in key
order (RocksDB SST files, LMDB appends): changelog columns in, the last value of each key out, keys in
Python's bytes order, no duplicates, with the key-size range and byte count the backends check and
reserve by. The C version (core/_sorting.c: a stable radix sort of all records, then the last of each
key) must equal the Python reference on keys built to tie, on tombstones and on empty runs; and the
restore's chunking must carry small results forward without reordering anything."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.changelog.file.format import py_encode_into
from localstate.core import backend, changelog
from localstate.core.backend import SortedRun, coalesce_sorted, has_deletes, key_sizes, payload_bytes, sorted_items
from localstate.core.changelog import RecordColumns
from localstate.core.logged import _sorted_chunks
from native_support import native_module

# Few distinct bytes and lengths around 8 after a shared prefix, so that ties on the radix bytes,
# zero padding, keys that are prefixes of others and repeated keys are all common.
KEYS = st.one_of(st.binary(max_size=12), st.lists(st.sampled_from([b"\x00", b"a", b"\xff"]), max_size=11)
                 .map(b"".join), st.binary(min_size=8, max_size=8).map(lambda k: k + b"\x00"))
PREFIXED = st.tuples(st.sampled_from([b"", b"user-", b"user-0000"]), KEYS).map(b"".join)
VALUES = st.one_of(st.none(), st.binary(max_size=4))
RUNS = st.lists(st.lists(st.tuples(PREFIXED, VALUES), max_size=25), max_size=6)


def _reference(runs: list[list[tuple[bytes, bytes | None]]]) -> tuple[list[bytes], list, tuple[int, int], int]:
    merged: dict[bytes, bytes | None] = {}
    for run in runs:
        merged.update(run)
    keys = sorted(merged)
    values = [merged[k] for k in keys]
    sizes = [len(k) for k in keys] or [0]
    nbytes = sum(sizes) + sum(len(v) for v in values if v is not None)
    return keys, values, (min(sizes), max(sizes)), nbytes


def _columns(runs: list[list[tuple[bytes, bytes | None]]]) -> tuple[list[list[bytes]], list[list]]:
    return [[k for k, _ in run] for run in runs], [[v for _, v in run] for run in runs]


@settings(max_examples=300, deadline=None)
@given(RUNS)
def test_c_and_python_coalesce_to_the_last_value_in_bytes_order(runs) -> None:
    keys, values, sizes, nbytes = _reference(runs)
    key_runs, value_runs = _columns(runs)
    c_keys, c_values, shortest, longest, c_bytes, c_deletes = native_module("localstate.core._sorting").coalesce_sorted(
        key_runs, value_runs)
    assert (c_keys, c_values, (shortest, longest), c_bytes) == (keys, values, sizes, nbytes)
    assert c_deletes == values.count(None)
    run = coalesce_sorted(key_runs, value_runs)
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == (keys, values, sizes, nbytes)
    assert run.deletes == values.count(None) and has_deletes(run) == (None in values)
    if keys:
        assert key_sizes(run) == key_sizes(dict(zip(keys, values))) == sizes
    assert payload_bytes(run) == payload_bytes(dict(zip(keys, values))) == nbytes


def test_the_latest_of_many_equal_keys_wins_over_a_big_run() -> None:
    """100k records over 1,000 keys spread across runs: only the last write of each key survives."""
    runs = [[(b"user-%06d" % ((r * 7919 + i) % 1000), b"%d:%d" % (r, i)) for i in range(10_000)] for r in range(10)]
    runs[-1].append((b"user-000007", None))  # a tombstone last: kept as the key's final state
    keys, values, sizes, nbytes = _reference(runs)
    run = coalesce_sorted(*_columns(runs))
    assert len(run) == 1000
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == (keys, values, sizes, nbytes)
    assert run.deletes == values.count(None) and has_deletes(run) == (None in values)


def test_python_fallback_for_keys_that_are_not_exactly_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    class Key(bytes):
        pass

    run = coalesce_sorted([[Key(b"b"), b"a"], [b"b"]], [[1, 2], [3]])  # the C code refuses a bytes subclass
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == ([b"a", b"b"], [2, 3], (1, 1), 2)
    monkeypatch.setattr(backend, "_SORTING", None)  # as without the extension
    run = coalesce_sorted([[b"bb", b"a"], [b"bb"]], [[b"1", b"22"], [None]])
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == ([b"a", b"bb"], [b"22", None], (1, 2), 5)


def test_c_refuses_malformed_columns() -> None:
    sorting = native_module("localstate.core._sorting")
    with pytest.raises(ValueError, match="run 1 has 2 keys and 1 values"):
        sorting.coalesce_sorted([[b"a"], [b"b", b"c"]], [[1], [2]])
    with pytest.raises(ValueError, match="as many value runs"):
        sorting.coalesce_sorted([[b"a"]], [])
    with pytest.raises(TypeError):
        sorting.coalesce_sorted([(b"a",)], [[1]])
    with pytest.raises(TypeError, match="str, not bytes"):
        sorting.coalesce_sorted([[b"a", "b"]], [[1, 2]])
    with pytest.raises(ValueError):  # the Python fallback checks the same
        coalesce_sorted([["a", "b"]], [[1]])


def test_sorted_run_is_a_read_only_mapping_in_key_order() -> None:
    run = coalesce_sorted([[b"c", b"a", b"b"], [b"a"]], [[b"3", b"1", None], [b"4"]])
    assert isinstance(run, SortedRun)
    assert list(run) == [b"a", b"b", b"c"] and len(run) == 3
    assert run[b"a"] == b"4" and run[b"b"] is None and b"c" in run and b"d" not in run
    with pytest.raises(KeyError):
        run[b"0"]
    assert None in run.values()
    items = run.items()
    assert list(items) == list(items) == [(b"a", b"4"), (b"b", None), (b"c", b"3")]  # re-iterable
    assert len(items) == 3 and (b"a", b"4") in items and (b"a", b"1") not in items
    assert sorted_items(run) is not None and list(sorted_items(run)) == list(items)
    assert dict(run) == {b"a": b"4", b"b": None, b"c": b"3"}


def _record_columns(runs: list[list[tuple[bytes, bytes | None]]]) -> list[RecordColumns]:
    out, end = [], 0
    for run in runs:
        end += len(run)
        out.append(RecordColumns([k for k, _ in run], [v for _, v in run], end))
    return out


@settings(max_examples=200, deadline=None)
@given(RUNS, st.integers(min_value=1, max_value=12))
def test_restore_chunks_replay_to_the_same_state(runs, limit) -> None:
    """Applying the chunks in order gives the state of all the records; each chunk but the last holds
    at least ``limit // 2`` keys (small results are carried into the next chunk, not written)."""
    chunks = list(_sorted_chunks(_record_columns(runs), limit))
    state: dict[bytes, bytes | None] = {}
    for chunk in chunks:
        assert chunk.key_column == sorted(set(chunk.key_column))
        state.update(chunk.items())
    assert state == dict(kv for run in runs for kv in run)
    assert all(len(chunk) >= limit // 2 for chunk in chunks[:-1])
    assert sum(len(chunk) for chunk in chunks) <= sum(map(len, runs))


def test_a_log_of_few_hot_keys_makes_one_chunk_not_many() -> None:
    """50,000 records over 100 keys with runs of 1,000 records and chunks of 4,096: results of ~100 keys
    are carried, so the backend gets one chunk (one SST file), not one per 4,096 records."""
    runs = [[(b"k%03d" % ((r * 31 + i) % 100), b"%d" % i) for i in range(1000)] for r in range(50)]
    chunks = list(_sorted_chunks(_record_columns(runs), 4096))
    assert len(chunks) == 1 and len(chunks[0]) == 100
    assert dict(chunks[0].items()) == dict(kv for run in runs for kv in run)


def _framed(run: list[tuple[bytes, bytes | None]]) -> RecordColumns:
    """``run`` written in the file changelog's framing and read back framed (decode_frames: spans
    into the bytes read, no object per record), as the restore reads a segment."""
    buf = bytearray()
    py_encode_into(buf, run, 0, 0)
    spans, count, end, expected = native_module("localstate.changelog.file._framing").decode_frames(
        bytes(buf), 0, len(buf), 0, 1 << 64)
    assert (count, end, expected) == (len(run), len(buf), len(run))
    return RecordColumns.from_frames(bytes(buf), spans, count, expected, end)


@settings(max_examples=200, deadline=None)
@given(RUNS, st.lists(st.booleans(), min_size=6, max_size=6))
def test_framed_runs_coalesce_like_their_columns(runs, framed) -> None:
    """Runs still framed in their bytes (mixed with plain column runs, as a carried-over chunk is)
    coalesce to the reference, in C and in the Python fallback; their kept records become new bytes
    objects (None for a tombstone)."""
    key_runs, value_runs = _columns(runs)
    for index, run in enumerate(runs):
        if framed[index]:
            key_runs[index], value_runs[index] = _framed(run).framed, None
    keys, values, sizes, nbytes = _reference(runs)
    c_keys, c_values, shortest, longest, c_bytes, c_deletes = native_module("localstate.core._sorting").coalesce_sorted(
        key_runs, value_runs)
    assert (c_keys, c_values, (shortest, longest), c_bytes) == (keys, values, sizes, nbytes)
    assert c_deletes == values.count(None)
    assert all(type(k) is bytes for k in c_keys) and all(v is None or type(v) is bytes for v in c_values)
    run = coalesce_sorted(key_runs, value_runs)
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == (keys, values, sizes, nbytes)
    assert run.deletes == values.count(None) and has_deletes(run) == (None in values)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "_SORTING", None)
        patch.setattr(changelog, "_SORTING", None)  # split_spans in Python too
        run = coalesce_sorted(key_runs, value_runs)
    assert (run.key_column, run.value_column, run.key_sizes, run.nbytes) == (keys, values, sizes, nbytes)
    assert run.deletes == values.count(None) and has_deletes(run) == (None in values)
    # the restore's chunking reads framed runs the same way
    chunks = list(_sorted_chunks([_framed(r) if framed[i] else c for i, (r, c) in
                                  enumerate(zip(runs, _record_columns(runs)))], 4))
    state: dict[bytes, bytes | None] = {}
    for chunk in chunks:
        state.update(chunk.items())
    assert state == dict(kv for run in runs for kv in run)


def test_split_spans_in_c_and_python_and_framed_columns_made_on_first_use() -> None:
    records = [(b"a", b"1"), (b"", b""), (b"b", None), (b"a", b"22")]
    columns = _framed(records)
    buffer, spans = columns.framed
    expected = ([k for k, _ in records], [v for _, v in records])
    assert native_module("localstate.core._sorting").split_spans(buffer, spans) == expected
    assert changelog.py_split_spans(buffer, spans) == expected
    assert len(columns) == 4 and columns.framed is not None  # len() does not make the columns
    assert (columns.keys, columns.values) == expected and columns.framed is None
    assert columns == RecordColumns(*expected, columns.end, columns.nbytes)


def test_c_refuses_spans_outside_their_buffer() -> None:
    """Spans are checked against their buffer before a byte is read: a span past its end, a negative
    length or position, a partial span, or a framed run that is not (bytes, bytes) is refused."""
    sorting = native_module("localstate.core._sorting")
    buffer, spans = _framed([(b"key", b"value")]).framed
    fields = list(struct.unpack("=qqqq", spans))
    for index, bad in [(0, len(buffer)), (1, len(buffer) + 1), (0, -1), (3, -2), (2, len(buffer)), (1, -1)]:
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
