"""The kv engine's get/put in C (engines/kv/_hotpath.c) against the Python closures they replace:
two stores, one with each, run the same operations and must return the same results, raise the same
errors, log the same changelog records and hold the same state, for every key and value serde kind the
fast paths special-case (string/int/bytes keys; int, bytes and JSON values), with a cache small enough
to rotate and a pending map small enough to spill.

The C module is optional at install; here it must be built unless LOCALSTATE_PURE_PYTHON is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.native import pure_python_requested
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory
from localstate.engines.kv import engine as engine_module
from localstate.errors import LocalStateError
from native_support import native_module


def _hotpath_module():
    return native_module("localstate.engines.kv._hotpath")


def test_the_c_hot_path_is_in_use_unless_pure_python_is_requested(tmp_path: Path) -> None:
    store = _open(tmp_path, "string", "int", native=True)
    if pure_python_requested():
        assert engine_module._HOTPATH is None
    else:
        assert engine_module._HOTPATH is _hotpath_module()
        assert type(store.get.__self__).__name__ == "HotPath"
    store.close()


SERDES = {"string": StringSerde, "int": IntSerde, "bytes": BytesSerde, "json": JsonSerde}


def _open(directory: Path, key_serde: str, value_serde: str, *, native: bool, cache_size: int = 4,
          write_batch_size: int = 3) -> Any:
    """A memory-backend kv store whose get/put are the C ones (``native``) or the Python closures."""
    saved = engine_module._HOTPATH
    engine_module._HOTPATH = _hotpath_module() if native else None
    try:
        options = KeyValueEngineFactory().validate_options(
            "s", {"backend": "memory", "cache_size": cache_size, "write_batch_size": write_batch_size})
        ctx = StoreContext(job="job", store="s", partition=0, directory=directory, options=options,
                           key_serde=SERDES[key_serde](), value_serde=SERDES[value_serde](),
                           changelog=MemoryChangelogPartition("hot", 0))
        return KeyValueEngineFactory().create(ctx)
    finally:
        engine_module._HOTPATH = saved


# Keys and values of the right kind and of wrong kinds (a bool for an int, a str for bytes, ...): the
# fast paths must hand every case they do not own to the reference path, which raises the typed error.
ANY_KEY = st.one_of(st.sampled_from(["a", "b", "c", "d", "e", "f"]), st.integers(-3, 3), st.booleans(),
                    st.sampled_from([b"a", b"b", b"c", 2**64, -2**63 - 1, 1.0, None]))
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
            else:
                result = store.flush()
            out.append(("ok", result))
        except (LocalStateError, TypeError) as exc:
            out.append((type(exc).__name__, str(exc).replace("KeyValueEngine.", "")))
    return out


@pytest.mark.parametrize("key_serde,value_serde", [("string", "int"), ("int", "int"), ("bytes", "bytes"),
                                                   ("string", "json"), ("string", "bytes"), ("json", "int")])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=OPS)
def test_c_and_python_hot_paths_behave_alike(tmp_path_factory, key_serde, value_serde, ops) -> None:
    stores = [_open(tmp_path_factory.mktemp("native"), key_serde, value_serde, native=True),
              _open(tmp_path_factory.mktemp("python"), key_serde, value_serde, native=False)]
    try:
        results = [_run(store, ops) for store in stores]
        assert _normalise(results[0]) == _normalise(results[1])
        for store in stores:
            store.flush()
        logged = [[(r.key, r.value) for r in store._logged.changelog.read(0)] for store in stores]
        assert logged[0] == logged[1]
        states = [sorted(store.all(), key=repr) for store in stores]  # json keys mix types
        assert states[0] == states[1]
        assert [store.spills for store in stores][0] == stores[1].spills
    finally:
        for store in stores:
            store.close()


def _normalise(results: list[Any]) -> list[Any]:
    # A TypeError about the call's arity names the function; the C method and the closure name it
    # differently but both reject the same calls.
    return [(kind, "arity" if kind == "TypeError" and "argument" in message else message)
            if kind != "ok" else (kind, message) for kind, message in results]


def test_spill_and_rotation_through_the_c_path(tmp_path: Path) -> None:
    """The counting pattern (get + put of the same key) over more keys than the cache holds and more
    changes than a spill allows: exact counts after a flush, from the cache and from the backend."""
    store = _open(tmp_path, "string", "int", native=True, cache_size=8, write_batch_size=5)
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
    hot_path = _hotpath_module().HotPath
    blank = hot_path.__new__(hot_path)
    with pytest.raises(RuntimeError, match="before __init__"):
        blank.get("a")
    with pytest.raises(RuntimeError, match="before __init__"):
        blank.put("a", 1)
