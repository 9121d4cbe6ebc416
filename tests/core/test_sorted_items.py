"""backend.sorted_items, the key order of every sorted bulk write (RocksDB SST files, LMDB appends,
sorted write batches): in C (core/_sorting.c, radix sort on each key's first 8 bytes, then memcmp
within ties) it must give exactly Python's bytes order, including keys that are prefixes of one
another, that share their first 8 bytes, that are empty or hold zero bytes."""

from __future__ import annotations

from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.core import backend
from localstate.core.backend import sorted_items
from localstate.core.native import pure_python_requested
from native_support import native_module


def _sorting_module():
    return native_module("localstate.core._sorting")


# Few distinct bytes and lengths around 8, so that ties on the 8-byte prefix, zero padding and
# prefix-of-another keys are common.
KEYS = st.one_of(st.binary(max_size=12), st.lists(st.sampled_from([b"\x00", b"a", b"\xff"]), max_size=11)
                 .map(b"".join), st.binary(min_size=8, max_size=8).map(lambda k: k + b"\x00"))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, st.one_of(st.none(), st.binary(max_size=3)), max_size=60))
def test_c_sort_is_bytes_order(run) -> None:
    expected = sorted(run.items(), key=itemgetter(0))
    assert _sorting_module().sorted_items(run) == expected
    assert sorted_items(run) == expected


def test_large_run_with_shared_prefixes() -> None:
    run = {b"user-%08d" % ((i * 7919) % 100_003): i for i in range(50_000)}
    run.update({b"": 0, b"user-": 1, b"user-\x00": 2, b"user-000": 3})
    assert _sorting_module().sorted_items(run) == sorted(run.items())


def test_other_keys_and_mappings_take_pythons_sort() -> None:
    assert sorted_items({"b": 1, "a": 2}) == [("a", 2), ("b", 1)]          # str keys: not bytes

    class Key(bytes):
        pass

    assert sorted_items({Key(b"b"): 1, b"a": 2}) == [(b"a", 2), (b"b", 1)]  # a bytes subclass
    with pytest.raises(TypeError):
        _sorting_module().sorted_items({"a": 1})
    with pytest.raises(TypeError):
        _sorting_module().sorted_items([(b"a", 1)])

    class Run(dict):
        pass

    assert sorted_items(Run({b"b": 1, b"a": 2})) == [(b"a", 2), (b"b", 1)]


def test_in_use_unless_pure_python_is_requested() -> None:
    if pure_python_requested():
        assert backend._SORTING is None
    else:
        assert backend._SORTING is _sorting_module()
