"""Property tests of the memory backend's ordered access (a dict plus a lazily built, lazily merged
sorted key index) against a reference model: a dict whose keys are sorted at every check. Mixed
puts, deletes and scans in any interleaving must give exactly the model's order, forward and reverse,
for full, range and prefix scans, also while a snapshot iterator is open across writes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.backend import prefix_end
from localstate.engines.backends.memory import MemoryBackend

KEYS = st.binary(min_size=0, max_size=3)
VALUES = st.binary(min_size=0, max_size=2)
WRITE = st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), max_size=12)
OP = st.one_of(
    st.tuples(st.just("write"), WRITE),
    st.tuples(st.just("scan"), st.tuples(st.one_of(st.none(), KEYS), st.one_of(st.none(), KEYS), st.booleans())),
    st.tuples(st.just("prefix"), st.tuples(KEYS, st.booleans())),
    st.tuples(st.just("clear"), st.none()),
)


def model_scan(model: dict[bytes, bytes], start: bytes | None, end: bytes | None,
               reverse: bool) -> list[tuple[bytes, bytes]]:
    keys = sorted(k for k in model if (start is None or k >= start) and (end is None or k < end))
    return [(k, model[k]) for k in (reversed(keys) if reverse else keys)]


def apply(model: dict[bytes, bytes], items: list[tuple[bytes, bytes | None]]) -> None:
    for key, value in items:
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OP, max_size=30))
def test_scans_match_a_sorted_dict(ops: list) -> None:
    backend = MemoryBackend()
    model: dict[bytes, bytes] = {}
    for kind, arg in ops:
        if kind == "write":
            backend.write(arg, {b"offset": b"1"}, deletes=any(v is None for _, v in arg))
            apply(model, arg)
        elif kind == "scan":
            start, end, reverse = arg
            assert list(backend.iterate(start, end, reverse)) == model_scan(model, start, end, reverse)
        elif kind == "prefix":
            prefix, reverse = arg
            got = list(backend.iterate(prefix or None, prefix_end(prefix), reverse))
            assert got == [(k, v) for k, v in model_scan(model, None, None, reverse) if k.startswith(prefix)]
        else:
            backend.clear()
            model.clear()
        assert backend.approximate_count() == len(model)
        assert all(backend.get(k) == v for k, v in model.items())
    assert list(backend.iterate(None, None)) == model_scan(model, None, None, False)
    backend.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=40), st.lists(WRITE, max_size=6), st.booleans())
def test_open_iterator_keeps_its_snapshot_across_writes(initial: list, writes: list, reverse: bool) -> None:
    """Small chunks force many scans between writes: each scan must see the merged index."""
    backend = MemoryBackend()
    backend.write(initial, {}, deletes=False)
    model = dict(initial)
    expected = model_scan(model, None, None, reverse)
    iterator = backend.iterate(None, None, reverse)
    got = []
    for items in writes:
        got.extend(item for _, item in zip(range(3), iterator))
        backend.write(items, {}, deletes=True)
        apply(model, items)
    got.extend(iterator)
    assert got == expected
    assert list(backend.iterate(None, None, reverse)) == model_scan(model, None, None, reverse)
    backend.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(KEYS, VALUES), max_size=20), st.lists(WRITE, min_size=1, max_size=5), st.booleans())
def test_bulk_load_after_a_scan_keeps_the_index_exact(initial: list, chunks: list, scan_first: bool) -> None:
    """Restore (bulk_load) may run after a scan built the key index: restored keys must be scanned."""
    backend = MemoryBackend()
    backend.write(initial, {}, deletes=False)
    model = dict(initial)
    if scan_first:
        assert list(backend.iterate(None, None)) == model_scan(model, None, None, False)
    backend.bulk_load([dict(chunk) for chunk in chunks])
    for chunk in chunks:
        apply(model, list(dict(chunk).items()))
    assert list(backend.iterate(None, None)) == model_scan(model, None, None, False)
    assert list(backend.iterate(None, None, True)) == model_scan(model, None, None, True)
    backend.close()
