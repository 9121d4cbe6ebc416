"""backend.coalesce_sorted, the restore path's coalesce-and-sort for backends that bulk-write in key
order (RocksDB SST files, LMDB appends): changelog columns in, the last value of each key out, keys in
Python's bytes order, no duplicates, with the key-size range and byte count the backends check and
reserve by; and the restore's chunking must carry small results forward without reordering anything.
The C version (native/_sorting.c) against the Python reference: tests/native/test_differential.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.changelog.framing import decode_columns, py_encode_into
from localstate.core import backend
from localstate.core.backend import SortedRun, coalesce_sorted, has_deletes, sorted_items
from localstate.core.changelog import RecordColumns
from localstate.core.logged import _sorted_chunks

from native_support import coalesced_reference, run_columns  # tests/ is on sys.path (tests/conftest.py)

# Few distinct bytes and lengths around 8 after a shared prefix, so that ties on the radix bytes,
# zero padding, keys that are prefixes of others and repeated keys are all common.
KEYS = st.one_of(st.binary(max_size=12), st.lists(st.sampled_from([b"\x00", b"a", b"\xff"]), max_size=11)
                 .map(b"".join), st.binary(min_size=8, max_size=8).map(lambda k: k + b"\x00"))
PREFIXED = st.tuples(st.sampled_from([b"", b"user-", b"user-0000"]), KEYS).map(b"".join)
VALUES = st.one_of(st.none(), st.binary(max_size=4))
RUNS = st.lists(st.lists(st.tuples(PREFIXED, VALUES), max_size=25), max_size=6)


def test_the_latest_of_many_equal_keys_wins_over_a_big_run() -> None:
    """100k records over 1,000 keys spread across runs: only the last write of each key survives."""
    runs = [[(b"user-%06d" % ((r * 7919 + i) % 1000), b"%d:%d" % (r, i)) for i in range(10_000)] for r in range(10)]
    runs[-1].append((b"user-000007", None))  # a tombstone last: kept as the key's final state
    keys, values, sizes, nbytes = coalesced_reference(runs)
    run = coalesce_sorted(*run_columns(runs))
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


def _read(run: list[tuple[bytes, bytes | None]]) -> RecordColumns:
    """``run`` in the changelog framing, read back as the restore reads a segment (framed, spans into the
    bytes read, when the C framing is in use; else decoded into columns)."""
    buf = bytearray()
    py_encode_into(buf, run, 0, 0)
    columns, end, expected = decode_columns(bytes(buf), 0, len(buf), 0, 1 << 64)
    assert (len(columns), end, expected) == (len(run), len(buf), len(run))
    return columns


@settings(max_examples=200, deadline=None)
@given(RUNS, st.lists(st.booleans(), min_size=6, max_size=6))
def test_restore_chunks_of_read_runs_replay_to_the_same_state(runs, read) -> None:
    """Runs as read from a changelog, mixed with plain column runs (as a carried-over chunk is)."""
    chunks = list(_sorted_chunks([_read(r) if read[i] else c for i, (r, c) in
                                  enumerate(zip(runs, _record_columns(runs)))], 4))
    state: dict[bytes, bytes | None] = {}
    for chunk in chunks:
        assert chunk.key_column == sorted(set(chunk.key_column))
        state.update(chunk.items())
    assert state == dict(kv for run in runs for kv in run)
