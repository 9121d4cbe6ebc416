"""One conformance suite, run against the rocksdb, lmdb and memory backends (see conftest)."""

from __future__ import annotations

import gc
import random

import pytest

from localstate.core.serdes import BytesSerde, IntSerde
from localstate.engines.kv import KeyValueEngine


def fill(kv: KeyValueEngine, keys: list[str], flush_half: bool) -> None:
    """Put ``keys`` (value = key); when ``flush_half`` the first half is flushed and the rest pending,
    so reads go through the merged view of pending writes and backend."""
    half = len(keys) // 2 if flush_half else len(keys)
    for k in keys[:half]:
        kv.put(k, k)
    if flush_half:
        kv.flush()
    for k in keys[half:]:
        kv.put(k, k)


KEYS = ["a", "ab", "abc", "abd", "b", "ba", "c", "\u00e9t\u00e9", "\u65e5\u672c", "\U0001f600", "z"]


def test_get_put_delete_read_own_writes(kv: KeyValueEngine) -> None:
    assert kv.get("x") is None
    kv.put("x", {"n": 1})
    assert kv.get("x") == {"n": 1}
    kv.delete("x")
    assert kv.get("x") is None
    kv.put("y", [1, 2])
    kv.flush()
    assert kv.get("y") == [1, 2]
    kv.put_all({"p": 1, "q": 2})
    kv.put_all([("r", 3)])
    assert kv.get_all(["p", "q", "r", "missing", "y"]) == {"p": 1, "q": 2, "r": 3, "y": [1, 2]}
    kv.delete_all(["p", "q"])
    assert kv.get_all(["p", "q", "r"]) == {"r": 3}


@pytest.mark.parametrize("flush_half", [False, True])
def test_range_edge_cases(kv: KeyValueEngine, flush_half: bool) -> None:
    assert list(kv.all()) == []
    assert list(kv.range("a", "z")) == []
    fill(kv, KEYS, flush_half)
    expected = sorted(KEYS, key=lambda s: s.encode())
    assert [k for k, _ in kv.all()] == expected
    assert [k for k, _ in kv.all(reverse=True)] == expected[::-1]
    assert list(kv.range("b", "b")) == []                     # start == end
    assert list(kv.range("c", "a")) == []                     # start > end
    assert list(kv.range("c", "a", reverse=True)) == []
    assert [k for k, _ in kv.range("ab", "b")] == ["ab", "abc", "abd"]   # start inclusive, end exclusive
    assert [k for k, _ in kv.range("ab", "b", reverse=True)] == ["abd", "abc", "ab"]
    assert [k for k, _ in kv.range("ab", "abc")] == ["ab"]   # a key that is a prefix of others
    assert [k for k, _ in kv.prefix("ab")] == ["ab", "abc", "abd"]
    assert [k for k, _ in kv.prefix("ab", reverse=True)] == ["abd", "abc", "ab"]
    assert [k for k, _ in kv.prefix("a")] == ["a", "ab", "abc", "abd"]
    assert [k for k, _ in kv.prefix("q")] == []
    assert [k for k, _ in kv.range("z", "\U0001f600")] == ["z", "\u00e9t\u00e9", "\u65e5\u672c"]
    assert [k for k, _ in kv.range("\u65e5", None)] == ["\u65e5\u672c", "\U0001f600"]
    assert [k for k, _ in kv.range(None, "ab")] == ["a"]
    assert all(k == v for k, v in kv.all())


def test_prefix_with_ff_bytes(bkv: KeyValueEngine) -> None:
    keys = [b"\x01", b"\x01\xff", b"\x01\xff\xff", b"\x02", b"\xff", b"\xff\x00", b"\xff\xff"]
    for k in keys:
        bkv.put(k, k)
    bkv.flush()
    assert [k for k, _ in bkv.prefix(b"\x01\xff")] == [b"\x01\xff", b"\x01\xff\xff"]
    assert [k for k, _ in bkv.prefix(b"\xff")] == [b"\xff", b"\xff\x00", b"\xff\xff"]
    assert [k for k, _ in bkv.prefix(b"\xff\xff", reverse=True)] == [b"\xff\xff"]


def test_int_keys_range_numerically(opener) -> None:
    kv = opener(IntSerde(), IntSerde())
    nums = [-(2**40), -5, -1, 0, 1, 7, 2**40]
    for n in reversed(nums):
        kv.put(n, n * 2)
    kv.flush()
    assert [k for k, _ in kv.range(-5, 7)] == [-5, -1, 0, 1]
    assert [v for _, v in kv.all()] == [n * 2 for n in nums]


@pytest.mark.parametrize("flush", [False, True])
def test_deletes_inside_an_open_range(kv: KeyValueEngine, flush: bool) -> None:
    keys = [f"k{i:03d}" for i in range(300)]
    for k in keys:
        kv.put(k, k)
    kv.flush()
    it = kv.range("k000", "k300")
    head = [next(it)[0] for _ in range(10)]
    kv.delete_all(keys[5:200])          # behind and ahead of the cursor
    kv.put("k150x", "new")
    if flush:
        kv.flush()
    rest = [k for k, _ in it]
    assert head + rest == keys            # the snapshot is unaffected
    assert [k for k, _ in kv.range("k000", "k300")] == keys[:5] + ["k150x"] + keys[200:]


def test_snapshot_semantics_random(opener) -> None:
    """Random interleaving of writes, spills, flushes and restores with open iterators: every
    iterator yields exactly the model's state at the moment it opened."""
    rng = random.Random(1234)
    kv = opener(write_batch_size=7, cache_size=5)
    model: dict[str, int] = {}
    open_iters: list[tuple[object, list[tuple[str, int]]]] = []
    for step in range(1500):
        op = rng.random()
        key = f"k{rng.randrange(60):02d}"
        if op < 0.5:
            model[key] = step
            kv.put(key, step)
        elif op < 0.7:
            model.pop(key, None)
            kv.delete(key)
        elif op < 0.75:
            kv.flush()
        elif op < 0.85 and len(open_iters) < 6:
            lo, hi = sorted(f"k{rng.randrange(61):02d}" for _ in range(2))
            reverse = rng.random() < 0.5
            snap = sorted(((k, v) for k, v in model.items() if lo <= k < hi), reverse=reverse)
            open_iters.append((kv.range(lo, hi, reverse=reverse), snap))
        elif open_iters:
            # advance a random iterator a little, or finish it
            index = rng.randrange(len(open_iters))
            it, snap = open_iters[index]
            take = rng.randrange(1, 6)
            got = []
            for _ in range(take):
                try:
                    got.append(next(it))
                except StopIteration:
                    break
            assert got == snap[:len(got)]
            del snap[:len(got)]
            if len(got) < take:
                assert not snap
                open_iters.pop(index)
    for it, snap in open_iters:
        assert list(it) == snap
    assert dict(kv.all()) == model
    assert kv.spills > 0


def test_large_and_empty_values(bkv: KeyValueEngine) -> None:
    big = random.Random(7).randbytes(10 * 1024 * 1024)
    bkv.put(b"big", big)
    bkv.put(b"empty", b"")
    assert bkv.get(b"empty") == b""
    bkv.flush()
    bkv._cache.clear()  # force backend reads
    assert bkv.get(b"big") == big
    assert bkv.get(b"empty") == b""
    assert dict(bkv.all()) == {b"big": big, b"empty": b""}
    bkv.put(b"big", b"small")
    bkv.flush()
    assert bkv.get(b"big") == b"small"


def test_cache_size_zero_is_write_through_cache(opener) -> None:
    kv = opener(cache_size=0, write_batch_size=3)
    for i in range(10):
        kv.put(f"k{i}", i)
        assert kv.get(f"k{i}") == i
    assert len(kv._cache) == 0
    assert kv.get_all([f"k{i}" for i in range(10)]) == {f"k{i}": i for i in range(10)}
    kv.flush()
    assert dict(kv.all()) == {f"k{i}": i for i in range(10)}


def test_lru_is_bounded(opener) -> None:
    kv = opener(cache_size=100, write_batch_size=50)
    for i in range(1000):
        kv.put(f"k{i:04d}", i)
        assert len(kv._cache) <= 100
    kv.flush()
    for i in range(1000):
        assert kv.get(f"k{i:04d}") == i
    assert 50 <= len(kv._cache) <= 100  # two generations: full until an eviction halves it


def test_approximate_count(kv: KeyValueEngine) -> None:
    kv.put_all((f"k{i}", i) for i in range(1000))
    kv.flush()
    count = kv.approximate_count()
    assert 500 <= count <= 2000


def test_iterators_close_and_do_not_leak(kv: KeyValueEngine) -> None:
    for i in range(200):
        kv.put(f"k{i:03d}", i)
    kv.flush()
    with kv.all() as it:
        assert next(it)[0] == "k000"
    assert list(it) == []                          # closed by the context manager
    abandoned = kv.range("k010", "k100")
    next(abandoned)
    del abandoned
    gc.collect()
    assert len(kv.backend._iterators) == 0        # garbage-collected iterators release everything
    dangling = kv.all()
    next(dangling)
    kv.close()
    with pytest.raises(Exception) as info:
        next(dangling)
    assert type(info.value).__name__ == "StoreClosedError"


def test_restore_flush_reopen(opener, backend: str) -> None:
    kv = opener()
    for i in range(50):
        kv.put(f"k{i:02d}", i)
    kv.delete("k07")
    kv.flush()
    offset = kv.local_offset()
    assert offset == len(opener.changelog.records) == 50  # put+delete of k07 coalesce
    kv.close()
    fresh = opener(backend=backend) if backend != "memory" else opener()
    if backend == "memory":
        assert fresh.local_offset() is None    # memory persists nothing: restored from the changelog
    else:
        assert fresh.local_offset() == offset
        fresh.close()
        # rebuild a persistent store from scratch too
        import shutil
        shutil.rmtree(opener.directory)
        opener.directory.mkdir()
        fresh = opener()
        assert fresh.local_offset() is None
    fresh.restore(opener.changelog.read(0))
    fresh.flush()
    assert fresh.local_offset() == offset
    assert opener.changelog.end_offset() == offset     # restore logs nothing
    expected = {f"k{i:02d}": i for i in range(50) if i != 7}
    assert dict(fresh.all()) == expected
    fresh.close()
    again = opener()
    if backend != "memory":
        assert again.local_offset() == offset
        assert dict(again.all()) == expected


def test_restore_last_record_wins_and_tombstones(bkv: KeyValueEngine) -> None:
    from localstate.core.changelog import ChangelogRecord as R
    bkv.put(b"pre", b"dirty")
    records = [R(b"a", b"1", 0), R(b"b", b"1", 1), R(b"a", b"2", 2), R(b"b", None, 3), R(b"pre", b"restored", 4)]
    bkv.restore(records)
    assert bkv.get(b"a") == b"2" and bkv.get(b"b") is None and bkv.get(b"pre") == b"restored"
    bkv.flush()
    assert dict(bkv.all()) == {b"a": b"2", b"pre": b"restored"}


@pytest.mark.slow
def test_one_million_keys(opener) -> None:
    kv = opener(IntSerde(), BytesSerde(), write_batch_size=100_000, cache_size=1000)
    kv.put_all((i, b"v") for i in range(1_000_000))
    kv.flush()
    assert kv.local_offset() == 1_000_000
    assert sum(1 for _ in kv.all()) == 1_000_000
    assert [k for k, _ in kv.range(499_998, 500_002)] == [499_998, 499_999, 500_000, 500_001]
    assert next(iter(kv.all(reverse=True)))[0] == 999_999
