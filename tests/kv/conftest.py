"""Fixtures for the key-value engine tests: a store factory over a shared in-memory changelog,
parametrized over the three backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, JsonSerde, Serde, StringSerde
from localstate.engines.kv import KeyValueEngine, KeyValueEngineFactory

BACKENDS = ["rocksdb", "lmdb", "memory"]


class Opener:
    """Opens the same store partition (same directory, same changelog) as often as a test needs."""

    def __init__(self, directory: Path, backend: str) -> None:
        self.directory = directory
        self.backend = backend
        self.changelog = MemoryChangelogPartition("kv-test", 0)
        self.opened: list[KeyValueEngine] = []

    def __call__(self, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 **options: Any) -> KeyValueEngine:
        options.setdefault("backend", self.backend)
        validated = KeyValueEngineFactory().validate_options("teststore", options)
        ctx = StoreContext(job="job", store="teststore", partition=0, directory=self.directory,
                           options=validated, key_serde=key_serde or StringSerde(),
                           value_serde=value_serde or JsonSerde(), changelog=self.changelog)
        engine = KeyValueEngineFactory().create(ctx)
        self.opened.append(engine)
        return engine

    def close_all(self) -> None:
        for engine in self.opened:
            engine.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def opener(tmp_path: Path, backend: str):
    o = Opener(tmp_path / "store", backend)
    (tmp_path / "store").mkdir()
    yield o
    o.close_all()


@pytest.fixture
def kv(opener: Opener) -> KeyValueEngine:
    return opener()


@pytest.fixture
def bkv(opener: Opener) -> KeyValueEngine:
    """A store with bytes keys and bytes values."""
    return opener(BytesSerde(), BytesSerde())
