"""The in-memory sketch algorithms: accuracy, datasketch compatibility, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from datasketch import HyperLogLog as DatasketchHLL

from localstate.engines.sketch import BloomFilter, HyperLogLog, KllSketch, bloom_size, encode_item, rank_error
from localstate.engines.sketch.hashing import encode_items, fast_hash64, fast_hash64_many
from localstate.engines.sketch.hll import hash32_function
from localstate.errors import InvalidValueError


def _mixed_items(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out: list = []
    for i, choice in enumerate(rng.integers(0, 4, n)):
        if choice == 0:
            out.append(f"user-{i}")
        elif choice == 1:
            out.append(int(rng.integers(-2**63, 2**63 - 1)))
        elif choice == 2:
            out.append(rng.bytes(int(rng.integers(0, 40))))
        else:
            out.append("ünï-" + "x" * int(rng.integers(0, 30)) + str(i))
    return out


# -- encoding and hashing ------------------------------------------------------------------------

def test_encoding_is_documented_canonical_bytes() -> None:
    assert encode_item("é") == "é".encode("utf-8")
    assert encode_item(b"\x00a") == b"\x00a"
    assert encode_item(bytearray(b"ab")) == b"ab"
    assert encode_item(-2) == (-2).to_bytes(8, "little", signed=True)
    assert encode_item(np.int32(7)) == (7).to_bytes(8, "little", signed=True)
    for bad in (1.5, True, None, 2**63, object()):
        with pytest.raises(InvalidValueError):
            encode_item(bad)


def test_fast_hash_vectorised_equals_scalar_and_separates_lengths() -> None:
    items = _mixed_items(3000, seed=1) + [b"", b"a", b"a\x00", b"a" * 8, b"a" * 8 + b"\x00", 0, -1]
    vector = fast_hash64_many(items)
    scalar = np.array([fast_hash64(b) for b in encode_items(items)], dtype=np.uint64)
    assert np.array_equal(vector, scalar)
    assert len({fast_hash64(b) for b in (b"", b"\x00", b"a", b"a\x00", b"a" * 8, b"a" * 8 + b"\x00")}) == 6
    ints = np.arange(-1000, 1000, dtype=np.int64)
    assert np.array_equal(fast_hash64_many(ints), fast_hash64_many([int(x) for x in ints]))
    assert np.array_equal(fast_hash64_many(ints), fast_hash64_many(encode_items([int(x) for x in ints])))


# -- HyperLogLog ----------------------------------------------------------------------------------

@pytest.mark.parametrize("hash_name", ["datasketch", "fast"])
@pytest.mark.parametrize("p", [4, 9, 12, 16])
def test_hll_registers_equal_datasketch(hash_name: str, p: int) -> None:
    items = _mixed_items(20_000, seed=p)
    ours = HyperLogLog(p, hash_name)
    ours.add_many(items)
    theirs = DatasketchHLL(p=p, hashfunc=hash32_function(hash_name))
    for item in items:
        theirs.update(encode_item(item))
    assert np.array_equal(ours.reg, theirs.reg)
    assert ours.reg.dtype == theirs.reg.dtype
    assert ours.count() == pytest.approx(theirs.count(), rel=1e-12)


@pytest.mark.parametrize("hash_name", ["datasketch", "fast"])
def test_hll_add_equals_add_many(hash_name: str) -> None:
    items = _mixed_items(5000, seed=3)
    one, many = HyperLogLog(10, hash_name), HyperLogLog(10, hash_name)
    for item in items:
        one.add(item)
    many.add_many(items[:1234])
    many.add_many(np.array([5, 6, 7]))
    one.add_many([5, 6, 7])
    many.add_many(items[1234:])
    assert np.array_equal(one.reg, many.reg)


@pytest.mark.parametrize("hash_name", ["datasketch", "fast"])
def test_hll_error_on_1m_distinct_within_three_standard_errors(hash_name: str) -> None:
    n = 1_000_000
    hll = HyperLogLog(12, hash_name)
    for start in range(0, n, 250_000):
        hll.add_many([f"item-{i}" for i in range(start, start + 250_000)])
    error = abs(hll.count() - n) / n
    assert error <= 3 * hll.standard_error(), (error, hll.standard_error())
    # Duplicates do not move the estimate: the registers are a max.
    before = hll.reg.copy()
    hll.add_many([f"item-{i}" for i in range(0, 100_000)])
    assert np.array_equal(before, hll.reg)


def test_hll_integer_array_fast_path_1m() -> None:
    hll = HyperLogLog(14, "fast")
    hll.add_many(np.arange(1_000_000, dtype=np.int64))
    assert abs(hll.count() - 1_000_000) / 1_000_000 <= 3 * hll.standard_error()


def test_hll_precision_bounds() -> None:
    for p in (3, 17):
        with pytest.raises(ValueError):
            HyperLogLog(p)


# -- Bloom filter ---------------------------------------------------------------------------------

def test_bloom_sizing_is_optimal() -> None:
    bits, hashes = bloom_size(1_000_000, 0.01)
    assert bits % 64 == 0 and 9_585_058 <= bits < 9_585_058 + 64  # -n ln p / ln2^2
    assert hashes == 7


@pytest.mark.parametrize("hash_name", ["fast", "datasketch"])
@pytest.mark.parametrize("rate", [0.01, 0.001])
def test_bloom_false_positive_rate_at_capacity(hash_name: str, rate: float) -> None:
    capacity = 200_000
    bits, hashes = bloom_size(capacity, rate)
    bloom = BloomFilter(bits, hashes, hash_name)
    members = [f"member-{i}" for i in range(capacity)]
    bloom.add_many(members)
    assert bloom.contains_many(members).all(), "false negative"
    probes = [f"stranger-{i}" for i in range(400_000)]
    measured = float(bloom.contains_many(probes).mean())
    assert measured <= 1.5 * rate, (measured, rate)
    assert measured > 0  # the probe set is big enough to see false positives at all
    # scalar paths agree with the vectorised ones
    assert all(bloom.contains(m) for m in members[:500])
    assert [bloom.contains(p) for p in probes[:3000]] == bloom.contains_many(probes[:3000]).tolist()


def test_bloom_add_equals_add_many() -> None:
    bits, hashes = bloom_size(10_000, 0.01)
    items = _mixed_items(3000, seed=5)
    one, many = BloomFilter(bits, hashes), BloomFilter(bits, hashes)
    for item in items:
        one.add(item)
    many.add_many(items)
    assert np.array_equal(one.words, many.words)


# -- KLL ------------------------------------------------------------------------------------------

def _max_rank_error(sketch: KllSketch, data: np.ndarray) -> float:
    ordered = np.sort(data)
    points = ordered[:: max(1, data.size // 2000)]
    truth = np.searchsorted(ordered, points, side="right") / data.size
    rank_err = float(np.abs(sketch.cdf(points) - truth).max())
    qs = np.linspace(0.0, 1.0, 2001)
    values = sketch.quantiles(qs)
    lo = np.searchsorted(ordered, values, side="left") / data.size
    hi = np.searchsorted(ordered, values, side="right") / data.size
    # the true rank interval of the returned value must be within eps of q
    quantile_err = float(np.maximum(np.maximum(lo - qs, qs - hi), 0).max())
    return max(rank_err, quantile_err)


@pytest.mark.parametrize("order", ["random", "ascending", "descending", "few-distinct"])
def test_kll_rank_error_within_published_bound_on_1m(order: str) -> None:
    rng = np.random.default_rng(11)
    data = rng.lognormal(size=1_000_000)
    if order == "ascending":
        data.sort()
    elif order == "descending":
        data = -np.sort(-data)
    elif order == "few-distinct":
        data = np.round(rng.normal(size=1_000_000) * 3)
    sketch = KllSketch(200, seed=42)
    sketch.add_many(data)
    assert sketch.n == data.size
    assert sketch.min == data.min() and sketch.max == data.max()
    assert sketch.retained < 3 * 200 + 8 * sketch.num_levels  # bounded size
    assert _max_rank_error(sketch, data) <= rank_error(200)


def test_kll_smaller_k_has_larger_bound_and_meets_it() -> None:
    data = np.random.default_rng(2).normal(size=300_000)
    sketch = KllSketch(50, seed=1)
    sketch.add_many(data)
    assert rank_error(50) > rank_error(200)
    assert _max_rank_error(sketch, data) <= rank_error(50)


def test_kll_deterministic_add_equals_add_many_and_serialisation_is_exact() -> None:
    data = np.random.default_rng(4).normal(size=30_000)
    one, many = KllSketch(32, seed=9), KllSketch(32, seed=9)
    for value in data[:20_000]:
        one.add(value)
    many.add_many(data[:3])
    many.add_many(data[3:20_000])
    assert one.to_bytes() == many.to_bytes()
    copy = KllSketch.from_bytes(one.to_bytes())
    assert copy.to_bytes() == one.to_bytes()
    copy.add_many(data[20_000:])
    one.add_many(data[20_000:])
    assert copy.to_bytes() == one.to_bytes()  # a restored sketch continues exactly like the original
    other_seed = KllSketch(32, seed=10)
    other_seed.add_many(data)
    assert other_seed.to_bytes() != one.to_bytes()


def test_kll_merge_keeps_weight_and_accuracy() -> None:
    data = np.random.default_rng(6).uniform(size=600_000)
    parts = [KllSketch(200, seed=s) for s in range(3)]
    for part, chunk in zip(parts, np.array_split(data, 3)):
        part.add_many(chunk)
    merged = KllSketch(200, seed=99)
    for part in parts:
        merged.merge(part)
    assert merged.n == data.size
    assert merged.retained < merged._total_cap
    assert _max_rank_error(merged, data) <= rank_error(200)


def test_kll_edges() -> None:
    empty = KllSketch(200)
    assert np.isnan(empty.quantile(0.5)) and np.isnan(empty.rank(1.0))
    sketch = KllSketch(200)
    sketch.add_many([3.0, float("nan"), 1.0, 2.0])
    assert sketch.n == 3
    assert sketch.quantile(0.0) == 1.0 and sketch.quantile(1.0) == 3.0 and sketch.quantile(0.5) == 2.0
    assert sketch.rank(2.0) == pytest.approx(2 / 3) and sketch.rank(0.0) == 0.0
    with pytest.raises(ValueError):
        sketch.quantile(1.5)
    with pytest.raises(ValueError):
        KllSketch.from_bytes(sketch.to_bytes()[:-3])
