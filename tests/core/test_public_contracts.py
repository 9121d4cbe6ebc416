"""A plugin author (engine, changelog system, stream system, backend, serde) imports every contract
from ``localstate`` itself, never from ``localstate.core.*``: each public name is the very object the
runtime checks plugins against, and the removed pre-1.0 names are gone."""

import importlib

import pytest

import localstate

# public name -> the module that defines it
CONTRACTS = {
    # engines
    "StorageEngine": "localstate.core.engine",
    "StorageEngineFactory": "localstate.core.engine",
    "StoreContext": "localstate.core.engine",
    "Option": "localstate.core.options",
    "Serde": "localstate.core.serdes",
    # changelog systems
    "ChangelogSystem": "localstate.core.changelog",
    "ChangelogPartition": "localstate.core.changelog",
    "ChangelogWriter": "localstate.core.changelog",
    "ChangelogRecord": "localstate.core.changelog",
    # stream systems
    "StreamSystem": "localstate.core.stream",
    "InputStream": "localstate.core.stream",
    "OutputStream": "localstate.core.stream",
    "InputRecord": "localstate.core.stream",
    "PendingTail": "localstate.core.stream",
    "RetainedStart": "localstate.core.stream",
    # storage backends
    "KVBackend": "localstate.core.backend",
    "DirectoryBackend": "localstate.core.backend",
    "SortedRun": "localstate.core.backend",
    "Item": "localstate.core.backend",
    # time (timers and the stores' TTL read it)
    "Timers": "localstate.core.time",
    "TimerNamespace": "localstate.core.time",
    "TimeSource": "localstate.core.time",
    "EVENT_TIME": "localstate.core.time",
    "PROCESSING_TIME": "localstate.core.time",
}


@pytest.mark.parametrize("name, module", sorted(CONTRACTS.items()))
def test_every_plugin_contract_is_public_and_the_same_object_as_in_core(name, module) -> None:
    assert name in localstate.__all__
    assert getattr(localstate, name) is getattr(importlib.import_module(module), name)


def test_the_stream_contract_is_the_one_core_streams_exports() -> None:
    streams = importlib.import_module("localstate.core.stream")
    for name in ("StreamSystem", "InputStream", "OutputStream", "InputRecord"):
        assert getattr(localstate, name) is getattr(streams, name)


def test_a_third_party_backend_and_stream_system_build_on_the_public_names(tmp_path) -> None:
    class DictBackend(localstate.KVBackend):
        name = "acme-dict"
        persistent = False

        def __init__(self, path, options, *, store="", partition=None):
            super().__init__()
            self.data: dict[bytes, bytes] = {}

        def get(self, key):
            return self.data.get(key)

        def get_meta(self, key):
            return None

        def approximate_count(self):
            return len(self.data)

        def _scan(self, start, end, after, reverse, limit):
            keys = sorted((k for k in self.data if (start is None or k >= start) and (end is None or k < end)),
                          reverse=reverse)
            if after is not None:
                keys = [k for k in keys if (k < after if reverse else k > after)]
            return [(k, self.data[k]) for k in keys[:limit]]

        def _write(self, items, meta, deletes):
            for key, value in items:
                if value is None:
                    self.data.pop(key, None)
                else:
                    self.data[key] = value

        def clear(self):
            self.data.clear()

        def _close(self):
            pass

    backend = DictBackend.open(tmp_path, {})
    backend.write([(b"b", b"2"), (b"a", b"1")])
    with backend.iterate(None, None) as rows:
        assert list(rows) == [(b"a", b"1"), (b"b", b"2")]
    backend.close()

    class Lines(localstate.StreamSystem):
        pass

    assert issubclass(Lines, importlib.import_module("localstate.core.stream").StreamSystem)
    record = localstate.InputRecord(0, "k", "v")
    assert (record.key, record.value) == ("k", "v")


@pytest.mark.parametrize("module, name", [
    ("localstate.engines.sketch", "SketchStore"),
    ("localstate.engines.sketch", "HyperLogLogStore"),
    ("localstate.engines.sketch", "BloomFilterStore"),
    ("localstate.engines.sketch", "QuantilesStore"),
    ("localstate.engines.heap.factory", "inner_kv_options"),
])
def test_removed_pre_1_0_aliases_are_gone(module, name) -> None:
    assert not hasattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module", ["localstate.engines.kv.backends", "localstate.engines.kv.backends.base",
                                    "localstate.engines.kv.codecs"])
def test_removed_pre_1_0_modules_are_gone(module) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)
