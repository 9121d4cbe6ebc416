"""The search engine's batched document add (issue #35): ``add_many`` is ``add`` per pair, in order,
checked whole before anything is applied; it takes Arrow rows as documents."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.errors import InvalidValueError
from search_support import open_engine

WORDS = ["alpha", "beta", "gamma", "delta", "apple", "banana"]


def _state(engine, changelog: MemoryChangelogPartition) -> tuple:
    engine.flush()
    hits = [(hit.doc_id, round(hit.score, 6)) for hit in engine.search("*", limit=100)]
    per_word = [engine.count(word) for word in WORDS]
    return [(r.key, r.value) for r in changelog.records], sorted(hits), per_word


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 6), st.lists(st.sampled_from(WORDS), min_size=1,
                                                                           max_size=4), st.integers(1990, 2020)),
                                 max_size=12), min_size=1, max_size=4))
def test_add_many_is_add_per_document(tmp_path_factory, batches) -> None:
    """Random batches with repeated ids: the same changelog records (in order), index and counts."""
    results = []
    for batched in (False, True):
        tmp = tmp_path_factory.mktemp("search")
        changelog = MemoryChangelogPartition()
        engine = open_engine(tmp, changelog)
        for batch in batches:
            ids = [f"d{i}" for i, _, _ in batch]
            docs = [{"body": " ".join(words), "year": year} for _, words, year in batch]
            if batched:
                engine.add_many(ids, docs)
            else:
                for doc_id, doc in zip(ids, docs):
                    engine.add(doc_id, doc)
            engine.flush()
        results.append(_state(engine, changelog))
        engine.close()
    assert results[0] == results[1]


def test_add_many_takes_arrow_rows_as_documents(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    batch = pa.RecordBatch.from_pydict({"title": ["Running dogs", None], "body": ["the quick fox", "lazy dog"],
                                        "year": [2001, 1999]})
    engine.add_many(["a", "b"], batch)
    engine.flush()
    assert engine.get("a") == {"title": "Running dogs", "body": "the quick fox", "year": 2001}
    assert engine.get("b") == {"body": "lazy dog", "year": 1999}  # a null field is a missing one
    assert engine.count("dog") == 2
    engine.close()


def test_a_bad_document_adds_none_of_the_batch(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    with pytest.raises(InvalidValueError):
        engine.add_many(["a", "b", "c"], [{"body": "fine"}, {"year": "not a year"}, {"body": "also fine"}])
    with pytest.raises(InvalidValueError):
        engine.add_many(["a", None], [{"body": "fine"}, {"body": "no id"}])
    with pytest.raises(InvalidValueError, match="2 doc ids but 1 documents"):
        engine.add_many(["a", "b"], [{"body": "one"}])
    assert engine.get("a") is None
    engine.flush()
    assert changelog.records == [] and engine.count("*") == 0
    engine.close()
