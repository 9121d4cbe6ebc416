"""State TTL on the kv engine (option ``ttl``, docs/time/ttl.md): expired entries are invisible to
every read path, purged with changelog tombstones by the bounded sweep, and never come back after a
restore; bad ttl configuration is a ConfigError naming the store and option. Time is moved by hand
(``ManualTime`` as ``StoreContext.time``), on all three backends."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import IntSerde, JsonSerde, Serde, StringSerde
from localstate.engines.kv import KeyValueEngine, KeyValueEngineFactory, TtlKeyValueEngine
from localstate.engines.kv.ttl import EXPIRY, WHOLE_SECONDS_TTL, pack_expiry, unpack_expiry
from localstate.errors import ConfigError
from localstate.testing.time import ManualTime

BACKENDS = ["rocksdb", "lmdb", "memory"]


class TtlOpener:
    """Opens one store partition (same directory, same in-memory changelog) with a hand-moved clock."""

    def __init__(self, directory: Path, backend: str) -> None:
        self.directory = directory
        self.backend = backend
        self.changelog = MemoryChangelogPartition("ttl-test", 0)
        self.time = ManualTime(processing_time=1_000.0)
        self.opened: list[KeyValueEngine] = []

    def __call__(self, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 **options: Any) -> KeyValueEngine:
        options.setdefault("backend", self.backend)
        options.setdefault("ttl", "10s")
        if options["ttl"] is None:
            del options["ttl"]
        validated = KeyValueEngineFactory().validate_options("events", options)
        ctx = StoreContext(job="job", store="events", partition=0, directory=self.directory, options=validated,
                           key_serde=key_serde or StringSerde(), value_serde=value_serde or JsonSerde(),
                           changelog=self.changelog, time=self.time)
        engine = KeyValueEngineFactory().create(ctx)
        self.opened.append(engine)
        return engine

    def restore_all(self, engine: KeyValueEngine) -> None:
        engine.restore(self.changelog.read(0))

    def records(self) -> list[tuple[bytes, bytes | None]]:
        return [(r.key, r.value) for r in self.changelog.read(0)]


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path):
    (tmp_path / "store").mkdir()
    o = TtlOpener(tmp_path / "store", request.param)
    yield o
    for engine in o.opened:
        engine.close()


def _visible(kv: KeyValueEngine, keys: list[str]) -> dict[str, Any]:
    """Every read path's view of ``keys``, each of which must agree."""
    views = {
        "get": {k: kv.get(k) for k in keys if kv.get(k) is not None},
        "get_all": kv.get_all(keys),
        "get_many": {k: v for k, v in zip(keys, kv.get_many(keys)) if v is not None},
        "all": dict(kv.all()),
        "all reversed": dict(kv.all(reverse=True)),
        "range": dict(kv.range(min(keys), None)),
        "prefix": {k: v for first in sorted({key[0] for key in keys}) for k, v in kv.prefix(first)},
    }
    first = views["get"]
    for name, view in views.items():
        assert view == first, f"{name} sees {view}, get sees {first}"
    return first


def test_the_plain_engine_without_ttl(opener: TtlOpener) -> None:
    kv = opener(ttl=None)
    assert type(kv) is KeyValueEngine
    kv.put("k", 1)
    kv.flush()
    assert opener.records() == [(b"k", b"1")]  # no expiry in the stored format


def _commit_at(kv: KeyValueEngine, opener: TtlOpener, seconds: float) -> None:
    """Move the clock ``seconds`` on and commit: the store reads its time at each flush."""
    opener.time.advance_processing_time(seconds)
    kv.flush()


def test_expired_entries_are_invisible(opener: TtlOpener) -> None:
    kv = opener()
    assert isinstance(kv, TtlKeyValueEngine)
    kv.put("k1", {"n": 1})
    _commit_at(kv, opener, 4)  # k1 expires at 1010
    kv.put("k2", 2)  # written at store time 1004: expires at 1014
    assert _visible(kv, ["k1", "k2"]) == {"k1": {"n": 1}, "k2": 2}
    _commit_at(kv, opener, 6)
    assert kv.store_time == 1_010.0
    assert _visible(kv, ["k1", "k2"]) == {"k2": 2}
    _commit_at(kv, opener, 4)
    assert _visible(kv, ["k1", "k2"]) == {}
    assert kv.merge_many(["k2"], [5], results=True) == [5]  # an expired value counts as absent


def test_time_stands_still_between_commits(opener: TtlOpener) -> None:
    kv = opener()
    kv.put("k", 1)
    opener.time.advance_processing_time(30)
    assert kv.get("k") == 1  # the store time is the last commit's until the next one
    kv.flush()
    assert kv.get("k") is None


def test_expiry_is_seen_past_the_object_cache_and_backend(opener: TtlOpener) -> None:
    kv = opener(cache_size=0)
    kv.put_all([(f"k{i}", i) for i in range(5)])
    kv.flush()
    assert _visible(kv, [f"k{i}" for i in range(5)]) == {f"k{i}": i for i in range(5)}
    opener.time.advance_processing_time(10)
    kv.refresh_time()  # without a flush: nothing swept, the backend still holds them
    assert _visible(kv, [f"k{i}" for i in range(5)]) == {}


def test_an_evicted_entry_is_checked_again_from_the_backend(opener: TtlOpener) -> None:
    kv = opener(cache_size=4, write_batch_size=2)  # spills, rotations: entries leave the cache
    for i in range(12):
        kv.put(f"k{i:02d}", i)
    _commit_at(kv, opener, 5)
    for i in range(12, 20):
        kv.put(f"k{i:02d}", i)
    _commit_at(kv, opener, 5)  # k00..k11 expired, k12..k19 live
    assert _visible(kv, [f"k{i:02d}" for i in range(20)]) == {f"k{i:02d}": i for i in range(12, 20)}
    assert len(kv._cache.expiry) <= 4  # the kept expiries are bounded with the cache


def test_a_write_restarts_the_ttl(opener: TtlOpener) -> None:
    kv = opener()
    kv.put("k", 1)
    _commit_at(kv, opener, 8)
    kv.put("k", 2)
    _commit_at(kv, opener, 8)
    assert kv.get("k") == 2
    kv.put_many(["k"], [3])
    _commit_at(kv, opener, 9.5)
    assert kv.get("k") == 3
    _commit_at(kv, opener, 0.5)
    assert kv.get("k") is None


def test_reads_refresh_with_on_read_and_write(opener: TtlOpener) -> None:
    kv = opener(ttl_update="on_read_and_write")
    kv.put("k", 1)
    for _ in range(3):
        _commit_at(kv, opener, 8)
        assert kv.get("k") == 1  # each read restarts the ttl (and logs the entry again)
    _commit_at(kv, opener, 8)
    assert kv.get_many(["k"]) == [1]
    _commit_at(kv, opener, 10)
    assert kv.get("k") is None


def test_sweep_purges_with_tombstones_and_is_bounded(opener: TtlOpener) -> None:
    kv = opener(ttl_sweep=3)
    kv.put_all([(f"k{i}", i) for i in range(7)])
    _commit_at(kv, opener, 5)
    kv.put("k9", 9)
    assert opener.records()[-1] == (b"k6", EXPIRY.pack(1_000.0 + 10) + b"6")  # the expiry travels
    _commit_at(kv, opener, 5)  # the store time becomes 1010: k0..k6 expired, k9 live
    flushed = len(opener.records())
    kv.flush()  # the first sweep with anything to find (the horizon, 1010, reached): 3 entries
    tombstones = [key for key, value in opener.records()[flushed:] if value is None]
    assert tombstones == [b"k0", b"k1", b"k2"]
    for _ in range(3):
        kv.flush()
    tombstones = sorted(key for key, value in opener.records()[flushed:] if value is None)
    assert tombstones == [f"k{i}".encode() for i in range(7)]
    assert kv.swept == 7
    assert kv.approximate_count() == 1
    assert dict(kv.all()) == {"k9": 9}


def test_the_sweep_examines_nothing_before_its_horizon(opener: TtlOpener) -> None:
    kv = opener(ttl_sweep=2)
    kv.put_all([(f"k{i}", i) for i in range(5)])
    kv.flush()  # written at 1000 into an empty store: nothing stored can expire before 1010
    for _ in range(5):
        _commit_at(kv, opener, 2)  # the sweeps at store time 1000..1008 examine nothing
    assert kv.examined == 0 and kv.store_time == 1_010.0
    for _ in range(3):
        kv.flush()  # a pass of 2 + 2 + 1 entries
    assert kv.swept == 5 and kv.examined == 5
    kv.put("k9", 9)
    for _ in range(3):
        _commit_at(kv, opener, 2)  # the new horizon: what was written since the pass began expires at 1020 or later
    assert kv.examined == 5


def test_a_pending_write_wins_over_the_sweep(opener: TtlOpener) -> None:
    kv = opener()
    kv.put("k", 1)
    _commit_at(kv, opener, 10)
    kv.put("k", 2)  # rewritten after it expired, before the sweep found it
    kv.flush()
    assert opener.records()[-1][0] == b"k" and opener.records()[-1][1] is not None
    assert kv.get("k") == 2


def test_no_comeback_after_restore_from_the_changelog(opener: TtlOpener, tmp_path: Path) -> None:
    kv = opener(ttl_sweep=1)
    kv.put_all([("old1", 1), ("old2", 2)])
    _commit_at(kv, opener, 6)
    kv.put("new", 3)
    kv.flush()
    kv.close()
    opener.time.advance_processing_time(5)  # old1, old2 expired; nothing swept
    shutil.rmtree(opener.directory)
    opener.directory.mkdir()  # local state lost: everything from the changelog
    restored = opener()
    opener.restore_all(restored)
    assert restored.backend.get(b"old1") is None  # expired records are not even restored
    restored.flush()
    assert _visible(restored, ["new", "old1", "old2"]) == {"new": 3}
    _commit_at(restored, opener, 10)
    assert _visible(restored, ["new", "old1", "old2"]) == {}


def test_no_comeback_from_local_state_after_reopen(opener: TtlOpener) -> None:
    if opener.backend == "memory":
        pytest.skip("the memory backend keeps no local state")
    kv = opener()
    kv.put("k", 1)
    kv.flush()
    kv.close()
    opener.time.advance_processing_time(10)
    reopened = opener()
    assert reopened.local_offset() == 1
    assert _visible(reopened, ["k"]) == {}


def test_event_time_ttl_follows_the_watermark(opener: TtlOpener) -> None:
    kv = opener(ttl_time="event", ttl="1m")
    kv.put("first", 1)  # no watermark yet: counts from the first one the store reads
    opener.time.advance_watermark(100.0)
    kv.flush()
    assert kv.store_time == 100.0
    kv.put("k", 2)
    opener.time.advance_processing_time(1_000_000)  # the clock does not matter
    kv.flush()
    assert _visible(kv, ["first", "k"]) == {"first": 1, "k": 2}
    opener.time.advance_watermark(160.0)
    kv.flush()
    assert _visible(kv, ["first", "k"]) == {}
    kv.flush()
    assert sorted(key for key, value in opener.records() if value is None) == [b"first", b"k"]


def test_int_values_and_keys(opener: TtlOpener) -> None:
    kv = opener(key_serde=IntSerde(), value_serde=IntSerde())
    for i in range(3):
        kv.put(i, (kv.get(i) or 0) + 1)
        kv.put(i, kv.get(i) + 1)
    assert kv.merge_many([0, 1, 5], [10, 10, 10], results=True) == [12, 12, 10]
    _commit_at(kv, opener, 9)
    assert kv.get_many([0, 1, 2, 5]) == [12, 12, 2, 10]
    _commit_at(kv, opener, 1)
    assert kv.get_many([0, 1, 2, 5]) == [None] * 4


@pytest.mark.parametrize("ttl, problem", [(0, "positive"), (-5, "negative"), ("0s", "positive"),
                                          ("-1d", "negative"), ("soon", "duration"), (True, "boolean")])
def test_bad_ttl_is_a_config_error_naming_store_and_option(ttl: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        KeyValueEngineFactory().validate_options("events", {"ttl": ttl})
    assert "stores.events.ttl" in str(err.value) and problem in str(err.value)


@pytest.mark.parametrize("option, value", [("ttl_time", "event"), ("ttl_update", "on_read_and_write"),
                                           ("ttl_sweep", 10)])
def test_ttl_options_without_ttl_are_config_errors(option: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        KeyValueEngineFactory().validate_options("events", {option: value})
    assert f"stores.events.{option}" in str(err.value)


def test_bad_ttl_time_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        KeyValueEngineFactory().validate_options("events", {"ttl": "1h", "ttl_time": "wall"})
    assert "stores.events.ttl_time" in str(err.value)


@pytest.mark.parametrize("engine, options", [("heap", {"kind": "topn"}), ("sketch", {"kind": "hll"}),
                                             ("search", {"fields": {"body": "text"}})])
def test_engines_without_ttl_refuse_it(engine: str, options: dict[str, Any]) -> None:
    from localstate.core.registry import Registry

    factory = Registry().engine_factory(engine)
    with pytest.raises(ConfigError) as err:
        factory.validate_options("recent", {**options, "ttl": "1d"})
    assert "stores.recent.ttl" in str(err.value) and "does not support" in str(err.value)


@pytest.mark.parametrize("value", [1, 123456789, "x", "a longer string", {"user": "ann"}, [1, 2, 3]])
def test_a_store_written_without_ttl_is_refused_with_ttl(opener: TtlOpener, value: Any) -> None:
    plain = opener(ttl=None)
    plain.put("k", value)
    plain.flush()
    plain.close()
    if opener.backend != "memory":  # its local state is refused at open
        with pytest.raises(ConfigError, match="written without ttl") as err:
            opener()
        assert "stores.events.ttl" in str(err.value)
    shutil.rmtree(opener.directory)
    opener.directory.mkdir()
    kv = opener()
    with pytest.raises(ConfigError, match="written without ttl"):  # and so are its changelog records
        opener.restore_all(kv)


def test_write_behind(opener: TtlOpener) -> None:
    """With the backend write of each commit on a background thread, reads of the in-flight commit
    see its expiries too, and the sweep settles before it scans."""
    kv = opener(write_behind=True, cache_size=0)
    kv.put_all([(f"k{i}", i) for i in range(4)])
    _commit_at(kv, opener, 5)
    kv.put("k9", 9)
    assert _visible(kv, ["k0", "k1", "k2", "k3", "k9"]) == {"k0": 0, "k1": 1, "k2": 2, "k3": 3, "k9": 9}
    _commit_at(kv, opener, 5)  # store time 1010: k0..k3 expired
    assert _visible(kv, ["k0", "k1", "k2", "k3", "k9"]) == {"k9": 9}
    kv.flush()
    assert sorted(key for key, value in opener.records() if value is None) == [b"k0", b"k1", b"k2", b"k3"]


def _check_against_a_model(opener: TtlOpener, seed: int, keys: list[Any], steps: list[float], *,
                           merges: bool = False, reopens: bool = False, ttl: float = 10.0,
                           **options: Any) -> None:
    """Random gets, puts (and ``merge_many`` of one key) of ``keys``, the clock moved by one of
    ``steps`` and a commit after each round (and, with ``reopens``, now and then the store closed and
    opened again: its cache empty, every value read back from local state or restored from the
    changelog with its own expiry): every read sees exactly a model's live entries. A ttl of an hour
    or more expires at the whole second, rounded up (stored compact)."""
    rng = random.Random(seed)
    options["ttl"] = ttl

    def expiry_after(now: float) -> float:
        return float(math.ceil(now + ttl)) if ttl >= WHOLE_SECONDS_TTL else now + ttl

    def reopen() -> KeyValueEngine:
        store = opener(value_serde=IntSerde(), **options)
        if opener.backend == "memory" and opener.records():
            opener.restore_all(store)
        return store

    kv = reopen()
    model: dict[Any, tuple[int, float]] = {}  # key -> (value, expiry)
    for step in range(150):
        now = kv.store_time
        assert now is not None
        for key in rng.sample(keys, 5):
            value, expiry = model.get(key, (None, 0.0))
            live = value if now < expiry else None
            if merges and rng.random() < 0.3:
                assert kv.merge_many([key], [1], results=True) == [(live or 0) + 1], f"step {step}: {key}"
                model[key] = ((live or 0) + 1, expiry_after(now))
                continue
            assert kv.get(key) == live, f"step {step}: {key} at {now}"
            if rng.random() < 0.5:
                kv.put(key, step)
                model[key] = (step, expiry_after(now))
        opener.time.advance_processing_time(rng.choice(steps))
        kv.flush()
        if reopens and rng.random() < 0.1:
            kv.close()
            kv = reopen()
        now = kv.store_time
        assert {k: v for k, v in zip(keys, kv.get_many(keys)) if v is not None} == \
               {k: v for k, (v, expiry) in model.items() if now < expiry}, f"after commit {step}"


@pytest.mark.parametrize("cache_size", [6, 1_000])
def test_cache_hits_agree_with_a_model_as_entries_expire_at_different_times(opener: TtlOpener,
                                                                            cache_size: int) -> None:
    """Cached values with different expiries (written in different commits, loaded back from the
    backend) expire one by one while the clock moves in uneven steps: every get (a cache hit, a
    rotated-out entry, a backend read) sees exactly the model's live entries. Exercises the cache's
    records of values read back that expire before its floor, their forgetting as their expiry comes,
    and the forgetting of the whole cache when the store time reaches the floor (no hit checks an
    expiry)."""
    _check_against_a_model(opener, 34, [f"k{i:02d}" for i in range(24)], [0.0, 0.5, 1.0, 3.0, 7.0],
                           cache_size=cache_size)


@pytest.mark.parametrize("cache_size", [4, 1_000])
def test_entries_read_back_after_a_reopen_agree_with_a_model(opener: TtlOpener, cache_size: int) -> None:
    """As above, with the store closed and opened again now and then, and int keys (the C get/put and
    merge)."""
    _check_against_a_model(opener, 341, list(range(20)), [0.0, 0.5, 1.0, 2.5, 6.0], merges=True, reopens=True,
                           key_serde=IntSerde(), cache_size=cache_size)

class SettableTime:
    """A processing-time source a test sets to any time, backwards included (a clock set back)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def processing_time(self) -> float:
        return self.now

    @property
    def watermark(self) -> float | None:
        return None


def test_an_entry_read_back_near_its_expiry_expires_while_cached(opener: TtlOpener) -> None:
    """A value read from local state (or the changelog) that expires before the cache's floor is
    recorded with its expiry and forgotten by the commit that reaches it, although each get between
    was a cache hit (which checks no expiry)."""
    kv = opener(value_serde=IntSerde())
    kv.put("near", 1)
    kv.flush()  # expires at 1010
    kv.close()
    opener.time.advance_processing_time(8)
    kv = opener(value_serde=IntSerde())  # store time 1008: the floor is 1018
    if opener.backend == "memory":
        opener.restore_all(kv)
    kv.put("far", 2)  # expires at 1018
    assert kv.get("near") == 1 and kv.get("near") == 1  # a miss, then a cache hit
    assert kv._cache.expiry == {"near": 1_010.0}  # the near value is recorded; the put one is not
    _commit_at(kv, opener, 1)
    assert _visible(kv, ["near", "far"]) == {"near": 1, "far": 2}
    _commit_at(kv, opener, 1)  # 1010: the near value's commit
    assert "near" not in kv._cache.expiry
    assert _visible(kv, ["near", "far"]) == {"far": 2}
    assert kv.cache_resets == 0


def test_the_whole_cache_is_forgotten_when_the_store_time_reaches_the_floor(opener: TtlOpener) -> None:
    """Every value cached without a record expires at the floor or later: when the store time reaches
    it the cache is forgotten, and the floor moves half a ttl on. Values written at different times
    stay visible exactly until their own expiry, read back from local state."""
    kv = opener(value_serde=IntSerde())  # opened at 1000: the floor is 1010
    kv.put("a", 1)  # expires at 1010
    _commit_at(kv, opener, 6)
    kv.put("b", 2)  # expires at 1016
    _commit_at(kv, opener, 4)  # 1010: the floor
    assert kv.cache_resets == 1
    assert len(kv._cache) == 0
    assert _visible(kv, ["a", "b"]) == {"b": 2}
    assert kv._cache.expiry == {}  # b, read back, expires after the new floor (1015): no record
    _commit_at(kv, opener, 5)  # 1015: the floor again (the next is 1020)
    assert kv.cache_resets == 2
    assert _visible(kv, ["a", "b"]) == {"b": 2}
    assert kv._cache.expiry == {"b": 1_016.0}  # read back, expiring before the floor: recorded
    _commit_at(kv, opener, 1)
    assert _visible(kv, ["a", "b"]) == {}
    assert kv.cache_resets == 2


def test_a_clock_set_back_lowers_the_floor(tmp_path: Path) -> None:
    """A value put while the clock is set back expires earlier than the cache's floor: the floor
    follows the write expiry down, so the commit that reaches it forgets the value from the cache."""
    time_source = SettableTime(1_000.0)
    options = KeyValueEngineFactory().validate_options("events", {"backend": "memory", "ttl": "10s"})
    ctx = StoreContext(job="job", store="events", partition=0, directory=tmp_path, options=options,
                       key_serde=StringSerde(), value_serde=IntSerde(),
                       changelog=MemoryChangelogPartition("ttl-test", 0), time=time_source)
    kv = KeyValueEngineFactory().create(ctx)
    try:
        kv.put("k", 1)  # expires at 1010
        kv.flush()
        time_source.now = 990.0
        kv.flush()
        kv.put("j", 2)  # expires at 1000
        time_source.now = 1_000.0
        kv.flush()
        assert _visible(kv, ["k", "j"]) == {"k": 1}
    finally:
        kv.close()


def test_reads_refresh_cached_entries_with_on_read_and_write(opener: TtlOpener) -> None:
    """With ``on_read_and_write`` a get writes (reference get/put, not the C fast path), also of a
    cached entry, and entries stay live across the forgetting of the cache as long as they are read."""
    kv = opener(ttl_update="on_read_and_write", value_serde=IntSerde())
    assert kv.get.__func__ is TtlKeyValueEngine._get_refreshing
    kv.put_all([("read", 1), ("unread", 2)])
    for _ in range(10):
        _commit_at(kv, opener, 3)
        assert kv.get("read") == 1 and kv.get("read") == 1  # a miss after a forgetting, then a hit
    assert kv.cache_resets >= 2
    assert _visible(kv, ["read", "unread"]) == {"read": 1}
    _commit_at(kv, opener, 10)
    assert _visible(kv, ["read", "unread"]) == {}


# -- the stored expiry: compact (4 bytes, whole seconds) and long (8 bytes) -------------------------------
#: a realistic processing time (past the compact form's base, 2020), a quarter second past a whole one
NOW = 1_700_000_000.25


@pytest.mark.parametrize("cache_size", [6, 1_000])
def test_whole_second_expiries_agree_with_a_model(opener: TtlOpener, cache_size: int) -> None:
    """The model test with a ttl of two hours at a realistic time: every expiry is stored compact,
    rounded up to the whole second, with steps that land just before and on those seconds."""
    opener.time = ManualTime(processing_time=NOW)
    _check_against_a_model(opener, 77, list(range(20)), [0.0, 0.5, 0.75, 1_800.0, 3_599.5, 4_200.0], merges=True,
                           reopens=True, key_serde=IntSerde(), cache_size=cache_size, ttl=7_200.0)


@pytest.mark.parametrize("value_serde, value, serde_bytes",
                         [(IntSerde(), 5, (5 + 2**63).to_bytes(8, "big")), (JsonSerde(), {"a": 1}, b'{"a":1}')])
def test_a_long_ttl_stores_whole_second_compact_expiries(opener: TtlOpener, value_serde: Serde, value: Any,
                                                         serde_bytes: bytes) -> None:
    opener.time = ManualTime(processing_time=NOW)
    kv = opener(value_serde=value_serde, ttl="1h")
    kv.put("k", value)
    kv.flush()
    [(key, stored)] = opener.records()
    assert stored == pack_expiry(1_700_003_601.0) + serde_bytes and len(stored) == 4 + len(serde_bytes)
    assert unpack_expiry(stored) == (1_700_003_601.0, 4)  # NOW + 3600 rounded up
    opener.time.advance_processing_time(3_600.5)  # 1_700_003_600.75: past ttl, before the whole second
    kv.flush()
    assert _visible(kv, ["k"]) == {"k": value}
    opener.time.advance_processing_time(0.25)
    kv.flush()
    assert _visible(kv, ["k"]) == {}


def test_a_short_ttl_keeps_exact_long_expiries(opener: TtlOpener) -> None:
    opener.time = ManualTime(processing_time=NOW)
    kv = opener(value_serde=IntSerde(), ttl=3_599)
    kv.put("k", 5)
    kv.flush()
    [(_, stored)] = opener.records()
    assert unpack_expiry(stored) == (NOW + 3_599, 8) and len(stored) == 16
    opener.time.advance_processing_time(3_598.75)
    kv.flush()
    assert _visible(kv, ["k"]) == {"k": 5}
    opener.time.advance_processing_time(0.25)  # on the dot
    kv.flush()
    assert _visible(kv, ["k"]) == {}


@pytest.mark.parametrize("value_serde", [IntSerde(), JsonSerde()])
def test_long_and_compact_expiries_live_side_by_side(opener: TtlOpener, value_serde: Serde) -> None:
    """A store written with long expiries (a short ttl, or a release before the compact form) and then
    with compact ones (its ttl raised past an hour) reads both, from the cache, local state and a
    restore of its changelog, and its sweep purges both."""
    opener.time = ManualTime(processing_time=NOW)
    kv = opener(value_serde=value_serde, ttl="30s", ttl_sweep=100)
    kv.put_all([(f"short{i}", i) for i in range(3)])
    kv.flush()
    kv.close()
    kv = opener(value_serde=value_serde, ttl="2h", ttl_sweep=100, cache_size=0)
    if opener.backend == "memory":  # it keeps no local state
        opener.restore_all(kv)
    kv.put_all([(f"long{i}", i) for i in range(3)])
    kv.flush()
    widths = {key.decode(): unpack_expiry(stored)[1] for key, stored in opener.records()}
    assert widths == {**{f"short{i}": 8 for i in range(3)}, **{f"long{i}": 4 for i in range(3)}}
    everything = {f"{kind}{i}": i for kind in ("short", "long") for i in range(3)}
    assert _visible(kv, list(everything)) == everything
    kv.close()
    shutil.rmtree(opener.directory)
    opener.directory.mkdir()
    restored = opener(value_serde=value_serde, ttl="2h", ttl_sweep=100)
    opener.restore_all(restored)
    restored.flush()
    assert _visible(restored, list(everything)) == everything
    opener.time.advance_processing_time(31)  # the short ones expired
    restored.flush()  # the sweep's first pass learns the horizon; the next flush deletes
    restored.flush()
    assert _visible(restored, list(everything)) == {f"long{i}": i for i in range(3)}
    assert sorted(key for key, value in opener.records() if value is None) == [b"short0", b"short1", b"short2"]


@given(st.one_of(st.floats(min_value=1e-6, max_value=1e300), st.just(math.inf),
                 st.integers(1_577_836_801, 1_577_836_800 + 2**31 - 2).map(float)))
def test_a_packed_expiry_unpacks_to_itself(expiry: float) -> None:
    packed = pack_expiry(expiry)
    compact = expiry == math.inf or (expiry.is_integer() and 1_577_836_800 < expiry < 1_577_836_800 + 2**31 - 1)
    width = 4 if compact else 8 if expiry <= 1e12 else 12  # past 1e12: the wide form
    assert unpack_expiry(packed + b"value") == (expiry, width)
    assert len(packed) == width


@pytest.mark.parametrize("value", [2**40, -1, 2**62])
def test_a_plain_int_store_is_refused_with_ttl_whatever_its_values_read_as(opener: TtlOpener, value: int) -> None:
    """A plain int serde value past 2**32 starts with what reads as a compact expiry: its length (8
    bytes, a stamped one has 12 or 16) still tells it apart."""
    plain = opener(ttl=None, value_serde=IntSerde())
    plain.put("k", value)
    plain.flush()
    plain.close()
    shutil.rmtree(opener.directory)
    opener.directory.mkdir()
    kv = opener(value_serde=IntSerde())
    with pytest.raises(ConfigError, match="written without ttl"):
        opener.restore_all(kv)


def test_an_event_time_before_1970_expires_after_its_ttl(opener: TtlOpener) -> None:
    """A watermark before the epoch makes a negative expiry, stored exactly in the wide form: the
    entry expires ttl after it was written, and not before."""
    kv = opener(ttl_time="event", ttl="1m")
    opener.time.advance_watermark(-1_000.0)
    kv.flush()
    kv.put("k", 1)
    kv.flush()
    assert _visible(kv, ["k"]) == {"k": 1}
    kv.close()
    restored = opener(ttl_time="event", ttl="1m")
    if opener.backend == "memory":
        opener.restore_all(restored)
    assert _visible(restored, ["k"]) == {"k": 1}
    opener.time.advance_watermark(-941.0)
    restored.flush()
    assert _visible(restored, ["k"]) == {"k": 1}
    opener.time.advance_watermark(-940.0)
    restored.flush()
    assert _visible(restored, ["k"]) == {}
