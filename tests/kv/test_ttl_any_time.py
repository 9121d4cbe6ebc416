"""A ttl store accepts any time it is fed and reads back exactly what it committed (issue 43 item 2):
event time in milliseconds, microseconds, nanoseconds, before 1970, zero, tiny or huge. Every
expiry round-trips through its stored form (compact, long or wide), a store's local state and its
changelog restore are never refused as "written without ttl", and state that releases before the
wide form wrote (long expiries past 1e12) opens again once its checkpoint names its layout."""

from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.serdes import IntSerde, JsonSerde
from localstate.engines.kv.ttl import EXPIRY, NEVER, _stamped, pack_expiry, unpack_expiry
from localstate.errors import ConfigError
from localstate.testing.time import ManualTime
from .ttl_support import open_ttl_store, visible_keys

#: event times a job may be fed, in every unit and degenerate: seconds, ms, us, ns, before 1970,
#: zero, tiny, huge
TIMES = [1.7e9, 1.7e12, 1.7e15, 1.7e18, -5e9, -1.0, 0.0, 1e-300, 5e-7, 1e300, 1e15 - 1, 2.0**63]
BACKENDS = ["rocksdb", "lmdb", "memory"]


@settings(max_examples=300)
@given(st.floats(allow_nan=False) | st.sampled_from([1.7e12, 1.7e15, 1.7e18, -0.0, 5e-324, -1e308]))
def test_every_expiry_reads_back_exactly_and_is_stamped(expiry: float) -> None:
    packed = pack_expiry(expiry)
    got, width = unpack_expiry(packed + b"value")
    assert width == len(packed) and width in (4, 8, 12)
    assert got == expiry or (math.isnan(got) and math.isnan(expiry))
    assert math.copysign(1.0, got) == math.copysign(1.0, expiry) or expiry == 0.0
    assert _stamped(packed + b'"v"')
    assert _stamped(packed + struct.pack(">Q", 2**63 + 5))  # an int serde's value after it


def test_nan_is_stored_as_never() -> None:
    assert unpack_expiry(pack_expiry(math.nan)) == (NEVER, 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("now", TIMES)
def test_an_event_time_store_fed_any_time_reopens_and_restores_its_state(tmp_path: Path, backend: str,
                                                                        now: float) -> None:
    changelog = MemoryChangelogPartition("ttl", 0)
    time = ManualTime(watermark=now)
    kv = open_ttl_store(tmp_path / "a", changelog, time, ttl="1h", ttl_time="event", backend=backend)
    kv.put("k", {"v": 1})
    kv.flush()
    assert visible_keys(kv, ["k"]) == {"k"}
    kv.close()
    # local state, reopened (the open checks its first entry), and a rebuild from the changelog
    reopened = open_ttl_store(tmp_path / "a", changelog, time, ttl="1h", ttl_time="event", backend=backend)
    if backend == "memory":
        reopened.restore(changelog.read(0))
    assert visible_keys(reopened, ["k"]) == {"k"}
    reopened.close()
    rebuilt = open_ttl_store(tmp_path / "b", changelog, time, ttl="1h", ttl_time="event", backend=backend)
    rebuilt.restore(changelog.read(0))
    assert visible_keys(rebuilt, ["k"]) == {"k"}
    # it still expires once the watermark passes its expiry (where the float can move past it)
    later = now + 7200 if abs(now) < 1e15 else now * 2 if now > 0 else None
    if later is not None and later != now:
        time.advance_watermark(later)
        rebuilt.flush()
        assert visible_keys(rebuilt, ["k"]) == set()
    rebuilt.close()


@pytest.mark.parametrize("now", [1.7e12, -5e9, 0.0])
def test_an_int_store_fed_any_time_restores(tmp_path: Path, now: float) -> None:
    """The int serde's values are stamped in C with a compact or long prefix; a wide one takes the
    reference path, and the restore's length check knows its width."""
    changelog = MemoryChangelogPartition("ttl", 0)
    time = ManualTime(watermark=now)
    kv = open_ttl_store(tmp_path / "a", changelog, time, ttl="10s", ttl_time="event", backend="rocksdb")
    kv.close()
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import StringSerde
    from localstate.engines.kv import KeyValueEngineFactory

    factory = KeyValueEngineFactory()
    options = factory.validate_options("n", {"ttl": "10s", "ttl_time": "event", "backend": "rocksdb"})

    def open_int(directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        return factory.create(StoreContext(job="job", store="n", partition=0, directory=directory, options=options,
                                           key_serde=StringSerde(), value_serde=IntSerde(), changelog=changelog,
                                           time=time))

    shutil.rmtree(tmp_path / "a")
    counts = open_int(tmp_path / "a")
    counts.put_all([("a", 1), ("b", -7)])
    counts.flush()
    counts.close()
    again = open_int(tmp_path / "b")
    again.restore(changelog.read(0))
    assert again.get_all(["a", "b"]) == {"a": 1, "b": -7}
    again.close()


def test_state_a_release_before_the_wide_form_wrote_opens_once_its_layout_is_recorded(tmp_path: Path) -> None:
    """The way out of the bricked state: releases before the wide form stored an expiry past 1e12 (an
    event time in milliseconds) in the long form, which the store's heuristic takes for a value
    written without ttl. A checkpoint that recorded the store's layout (every checkpoint since
    ``formats``) makes the store take it as stamped, and it reads exactly."""
    changelog = MemoryChangelogPartition("ttl", 0)
    expiry = 1.7e12 + 10
    changelog.append(b"k", EXPIRY.pack(expiry) + JsonSerde().serialize({"v": 1}))
    changelog.flush()
    time = ManualTime(watermark=1.7e12)
    unknown = open_ttl_store(tmp_path / "a", changelog, time, ttl="10s", ttl_time="event")
    with pytest.raises(ConfigError, match="written without ttl"):
        unknown.restore(changelog.read(0))
    unknown.close()
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import StringSerde
    from localstate.engines.kv import KeyValueEngineFactory

    factory = KeyValueEngineFactory()
    options = factory.validate_options("sessions", {"ttl": "10s", "ttl_time": "event"})
    (tmp_path / "b").mkdir()
    known = factory.create(StoreContext(job="job", store="sessions", partition=0, directory=tmp_path / "b",
                                        options=options, key_serde=StringSerde(), value_serde=JsonSerde(),
                                        changelog=changelog, time=time, extra={"state_format": "kv+ttl"}))
    known.restore(changelog.read(0))
    assert known.get("k") == {"v": 1}
    time.advance_watermark(expiry)
    known.flush()
    assert known.get("k") is None
    known.close()
