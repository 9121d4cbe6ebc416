"""Fixtures for heap engine tests: open a heap store partition on a real kv backend and a memory
changelog, without the runtime; and a shared local SparkContext for the Spark examples."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.changelog import ChangelogRecord
from localstate.core.engine import StoreContext
from localstate.core.serdes import JsonSerde, Serde, StringSerde
from localstate.engines.heap import HeapEngineFactory

_counter = itertools.count()


def open_heap(directory: Path, changelog: Any, *, key_serde: Serde | None = None,
              value_serde: Serde | None = None, store: str = "heap", **options: Any) -> Any:
    """Open one heap store partition (options validated by the factory, like the runtime does)."""
    factory = HeapEngineFactory()
    validated = factory.validate_options(store, options)
    directory.mkdir(parents=True, exist_ok=True)
    context = StoreContext(job="test", store=store, partition=0, directory=directory, options=validated,
                           key_serde=key_serde or StringSerde(), value_serde=value_serde or JsonSerde(),
                           changelog=changelog)
    return factory.create(context)


def compacted(records: list[ChangelogRecord]) -> list[ChangelogRecord]:
    """Keep only the last record per key (what log compaction does), in offset order."""
    last = {record.key: record for record in records}
    return sorted(last.values(), key=lambda record: record.offset)


@pytest.fixture
def heap_dirs() -> Iterator[Callable[[], Path]]:
    """Fresh directories for stores (hypothesis runs many examples per test function)."""
    root = Path(tempfile.mkdtemp(prefix="heap-test-"))

    def new() -> Path:
        return root / f"s{next(_counter)}"

    yield new
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def changelog() -> MemoryChangelogPartition:
    return MemoryChangelogPartition("heap-changelog", 0)


@pytest.fixture
def opener() -> Callable[..., Any]:
    """``opener(directory, changelog, **options)`` -> an open heap store."""
    return open_heap


@pytest.fixture
def compact() -> Callable[[list[ChangelogRecord]], list[ChangelogRecord]]:
    return compacted


@pytest.fixture(scope="session")
def spark_context():
    """One local SparkContext for the session (get-or-create: shared with tests/spark when both run)."""
    from localstate.runtime.spark.runner import spark_context as make_context

    context = make_context("local[2]", "localstate-tests")
    yield context
    context.stop()
