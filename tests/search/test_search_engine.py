"""Search engine: API, visibility, changelog, restore, local state reuse, corruption, errors."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.engines.search import InvalidQueryError, SearchEngineFactory
from localstate.errors import ConfigError, InvalidValueError, RestoreError, StoreClosedError, StoreError
from search_support import open_engine


def ranked(engine, query: str, limit: int = 20) -> list[tuple[str, float]]:
    return [(hit.doc_id, hit.score) for hit in engine.search(query, limit=limit)]


QUERIES = ["function", "return value", "title:module", "body:\"the file\"", "year:[2000 TO 2010] AND data",
           "module:os", "socket OR thread", "+string -unicode", "*"]


def test_add_search_get_and_visibility_after_flush(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    assert engine.local_offset() == 0  # fresh and truly empty
    engine.add("a", {"title": "Running dogs", "body": "the quick brown fox", "year": 2001,
                     "when": dt.datetime(2020, 1, 2, 3, 4, 5)})
    engine.add("b", {"title": "Sleeping cats", "body": "the lazy dog sleeps", "year": 1999, "weight": 2})
    # get() reads its own pending writes; search() only sees flushed state.
    assert engine.get("a")["when"] == dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert engine.search("dog") == [] and engine.count("*") == 0
    engine.flush()
    assert engine.local_offset() == 2 == changelog.end_offset()
    hits = engine.search("run")  # en_stem: "running" matches "run"
    assert [h.doc_id for h in hits] == ["a"]
    assert hits[0].fields == {"title": "Running dogs", "year": 2001,
                              "when": dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)}
    assert "body" not in hits[0].fields  # body is not stored = true
    assert hits[0].score > 0
    assert engine.count("lazy") == 1 and engine.count("dog") == 2 and engine.count("year:[2000 TO 2010]") == 1
    assert engine.count("*") == 2  # the hidden offset document never matches
    assert engine.get("b") == {"title": "Sleeping cats", "body": "the lazy dog sleeps", "year": 1999,
                               "weight": 2.0}
    engine.close()


def test_updates_and_deletes_visible_after_flush_and_logged_coalesced(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    engine.add("a", {"body": "alpha apple"})
    engine.add("b", {"body": "beta banana"})
    engine.flush()
    for i in range(50):  # 50 updates of one doc between two flushes: one changelog record
        engine.add("a", {"body": f"alpha cherry {i}"})
    engine.delete("b")
    assert engine.get("b") is None and engine.get("a") == {"body": "alpha cherry 49"}
    assert engine.count("apple") == 1 and engine.count("banana") == 1  # not flushed yet
    engine.flush()
    assert engine.count("apple") == 0 and engine.count("banana") == 0 and engine.count("cherry") == 1
    assert [h.doc_id for h in engine.search("alpha")] == ["a"]
    tail = list(changelog.read(2))
    assert [(r.key, r.value) for r in tail] == [(b"a", b'{"body":"alpha cherry 49"}'), (b"b", None)]
    assert engine.local_offset() == 4
    engine.flush()  # nothing new: nothing logged
    assert changelog.end_offset() == 4
    engine.close()


def test_restore_full_and_compacted_matches_and_deleted_never_return(tmp_path: Path, stdlib_docs) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path / "a", changelog)
    docs = stdlib_docs[:600]
    for i, doc in enumerate(docs):
        engine.add(f"d{i}", doc)
        if i % 100 == 99:
            engine.flush()
    for i in range(1, 600, 11):  # updates
        engine.add(f"d{i}", {**docs[i], "body": docs[i]["body"] + " xyzzyupdated"})
    deleted = {f"d{i}" for i in range(0, 600, 7)}
    for doc_id in deleted:
        engine.delete(doc_id)
    engine.flush()
    matches = {q: {h.doc_id for h in engine.search(q, 10_000)} for q in QUERIES}
    assert engine.count("xyzzyupdated") == len([i for i in range(1, 600, 11) if i % 7])
    live_count = engine.count("*")
    assert live_count == 600 - len(deleted)
    engine.close()

    records = list(changelog.read())
    compacted = [r for r in records if r is {rr.key: rr for rr in records}[r.key]]  # last per key
    assert len(compacted) == 600 < len(records)
    for name, replay in (("full", records), ("compacted", compacted)):
        fresh = open_engine(tmp_path / name, MemoryChangelogPartition())
        fresh.restore(iter(replay))
        fresh.flush()
        assert fresh.count("*") == live_count
        for doc_id in deleted:
            assert fresh.get(doc_id) is None
        for q in QUERIES:
            assert {h.doc_id for h in fresh.search(q, 10_000)} == matches[q]
            assert fresh.count(q) == len(matches[q])
        fresh.close()
    # The two rebuilt indexes hold the same documents: identical ranked results and scores.
    a = open_engine(tmp_path / "full", MemoryChangelogPartition())
    b = open_engine(tmp_path / "compacted", MemoryChangelogPartition())
    for q in QUERIES:
        assert ranked(a, q) == ranked(b, q)
    assert ranked(a, "function")[0][1] > ranked(a, "function")[-1][1]  # a real ranking, not all ties
    a.close()
    b.close()


def test_restore_onto_non_empty_store_last_record_wins(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    engine.add("x", {"body": "old text"})
    engine.add("y", {"body": "keep me"})
    engine.flush()
    from localstate.core.changelog import ChangelogRecord
    engine.restore([ChangelogRecord(b"x", b'{"body":"newer text"}', 10),
                    ChangelogRecord(b"z", b'{"body":"zed"}', 11),
                    ChangelogRecord(b"z", None, 12),
                    ChangelogRecord(b"x", b'{"body":"newest text"}', 13)])
    engine.flush()
    assert changelog.end_offset() == 2  # restore does not re-log
    assert engine.get("x") == {"body": "newest text"} and engine.get("z") is None
    assert engine.count("old") == 0 and engine.count("newest") == 1 and engine.count("*") == 2
    engine.close()


def test_local_state_reuse_needs_no_replay(tmp_path: Path, stdlib_docs) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    for i, doc in enumerate(stdlib_docs[:300]):
        engine.add(i and f"d{i}" or "d0", doc)
    engine.flush()
    engine.add("late", {"body": "never flushed paragraph"})
    before = {q: ranked(engine, q) for q in QUERIES}
    offset = engine.local_offset()
    engine.close()  # no flush: "late" is discarded
    changelog.drop_unflushed()
    reopened = open_engine(tmp_path, changelog)
    assert reopened.local_offset() == offset == changelog.end_offset() == 300
    assert reopened.get("late") is None
    assert {q: ranked(reopened, q) for q in QUERIES} == before  # same index, no replay needed
    reopened.flush()  # the runtime's post-restore flush: logs nothing, commits nothing new
    assert changelog.end_offset() == 300 and reopened.local_offset() == 300
    reopened.close()


def test_offset_marker_resolves_a_commit_that_did_not_happen(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    engine.add("a", {"body": "one"})
    engine.flush()
    assert engine.local_offset() == 1
    # A crash after flush() wrote its marker but before tantivy committed: the index is still at
    # the old commit, so the old offset must be reported, not the announced one.
    engine._write_marker(1, 99)
    engine.close()
    reopened = open_engine(tmp_path, changelog)
    assert reopened.local_offset() == 1 and reopened.get("a") == {"body": "one"}
    reopened.add("b", {"body": "two"})
    reopened.flush()  # this commit happened: its announced offset is the local offset
    reopened.close()
    again = open_engine(tmp_path, changelog)
    assert again.local_offset() == 2 and again.count("two") == 1
    again.close()
    (tmp_path / "search-offset.json").write_text("{broken")
    broken = open_engine(tmp_path, changelog)
    assert broken.local_offset() is None and broken.count("*") == 0
    broken.close()


@pytest.mark.parametrize("damage", ["garbage_meta", "empty_meta", "garbage_segments", "missing_segment",
                                    "no_meta_but_files"])
def test_corrupt_index_dir_warns_and_reports_none(tmp_path: Path, damage: str, caplog) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    for i in range(20):
        engine.add(f"d{i}", {"body": f"paragraph number {i}"})
    engine.flush()
    engine.close()
    index_dir = tmp_path / "tantivy"
    segments = [p for p in index_dir.iterdir() if p.suffix in (".store", ".idx", ".term")]
    assert segments
    if damage == "garbage_meta":
        (index_dir / "meta.json").write_text("{not json")
    elif damage == "empty_meta":
        (index_dir / "meta.json").write_bytes(b"")
    elif damage == "garbage_segments":
        for p in segments:
            p.write_bytes(b"\x00garbage" * 10)
    elif damage == "missing_segment":
        for p in segments:
            if p.suffix == ".store":
                p.unlink()
    else:
        (index_dir / "meta.json").unlink()
    with caplog.at_level(logging.WARNING, logger="localstate.engines.search.engine"):
        reopened = open_engine(tmp_path, changelog)
    assert reopened.local_offset() is None
    assert any("discarding local index" in r.getMessage() for r in caplog.records)
    assert reopened.count("*") == 0
    # The runtime then rebuilds from offset 0.
    reopened.restore(changelog.read(0))
    reopened.flush()
    assert reopened.local_offset() == 20 and reopened.count("paragraph") == 20
    reopened.close()


def test_schema_change_discards_local_index(tmp_path: Path, caplog) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog, fields={"body": {"type": "text"}})
    engine.add("a", {"body": "hello"})
    engine.flush()
    engine.close()
    with caplog.at_level(logging.WARNING):
        other = open_engine(tmp_path, changelog, fields={"body": {"type": "text", "tokenizer": "en_stem"}})
    assert other.local_offset() is None and "schema does not match" in caplog.text
    other.close()


def test_closed_store_and_single_writer(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition()
    engine = open_engine(tmp_path, changelog)
    with pytest.raises(StoreError, match="holds this store partition"):
        open_engine(tmp_path, changelog)
    engine.close()
    for call in (lambda: engine.get("a"), lambda: engine.add("a", {"body": "x"}), engine.flush,
                 lambda: engine.search("x"), engine.local_offset):
        with pytest.raises(StoreClosedError):
            call()
    again = open_engine(tmp_path, changelog)  # close() released the writer lock
    again.close()


# -- errors ------------------------------------------------------------------------------------------


def problems_of(exc: ConfigError) -> dict[str, str]:
    return {p.path: p.message for p in exc.problems}


def test_bad_schema_errors_name_store_field_and_attribute() -> None:
    factory = SearchEngineFactory()
    with pytest.raises(ConfigError) as info:
        factory.validate_options("articles", {"fields": {
            "title": {"type": "txt"},
            "body": {"type": "text", "tokenizer": "en_stemm"},
            "tag": {"type": "string", "tokenizer": "en_stem"},
            "year": {"type": "int", "fats": True},
            "n": {"type": "float", "stored": "yes"},
            "__secret": {"type": "text"},
            "x": "text",
        }})
    problems = problems_of(info.value)
    assert "unknown type 'txt'" in problems["stores.articles.fields.title.type"]
    assert "did you mean 'text'" in problems["stores.articles.fields.title.type"]
    assert "unknown tokenizer 'en_stemm'" in problems["stores.articles.fields.body.tokenizer"]
    assert "only text fields" in problems["stores.articles.fields.tag.tokenizer"]
    assert "did you mean 'fast'" in problems["stores.articles.fields.year.fats"]
    assert "true or false" in problems["stores.articles.fields.n.stored"]
    assert "reserved" in problems["stores.articles.fields.__secret"]
    assert "expected a table" in problems["stores.articles.fields.x"]
    with pytest.raises(ConfigError) as info:
        factory.validate_options("articles", {"default_fields": ["body"]})
    assert "required option is missing" in problems_of(info.value)["stores.articles.fields"]
    with pytest.raises(ConfigError) as info:
        factory.validate_options("articles", {"fields": {"body": {"type": "text"}, "year": {"type": "int"}},
                                              "default_fields": ["year", "bdy"]})
    assert "default fields must be text" in str(info.value) and "did you mean 'body'" in str(info.value)
    with pytest.raises(ConfigError, match="stores.articles.writer_memory"):
        factory.validate_options("articles", {"fields": {"b": {"type": "text"}}, "writer_memory": "1MB"})
    with pytest.raises(ConfigError, match="stores.articles.fields"):
        factory.validate_options("articles", {"fields": {}})


def test_bad_query_raises_typed_error(tmp_path: Path) -> None:
    engine = open_engine(tmp_path, MemoryChangelogPartition())
    engine.add("a", {"body": "text"})
    engine.flush()
    for query in ["title:(", "AND", "\"unclosed", "nofield:x", "year:abc"]:
        with pytest.raises(InvalidQueryError) as info:
            engine.search(query)
        assert info.value.context["store"] == "docs" and info.value.context["query"] == query
        assert info.value.hint
    with pytest.raises(InvalidQueryError, match="unknown field 'bdy'"):
        engine.search("x", fields=["bdy"])
    with pytest.raises(InvalidQueryError):
        engine.count("body:(")
    engine.close()


def test_bad_documents_raise_typed_errors_naming_store_and_field(tmp_path: Path) -> None:
    engine = open_engine(tmp_path, MemoryChangelogPartition())
    cases = [
        ({"title": "no body"}, "body", "required field 'body' is missing"),
        ({"body": "x", "year": "2001"}, "year", "expects an integer"),
        ({"body": "x", "year": True}, "year", "expects an integer"),
        ({"body": "x", "year": 1 << 70}, "year", "64 bits"),
        ({"body": "x", "weight": float("nan")}, "weight", "not finite"),
        ({"body": "x", "when": "yesterday"}, "when", "expects a datetime"),
        ({"body": 42}, "body", "expects a string"),
        ({"body": "x", "colour": "red"}, "colour", "unknown field 'colour'"),
    ]
    for doc, field, message in cases:
        with pytest.raises(InvalidValueError, match=message) as info:
            engine.add("d", doc)
        assert info.value.context == {"store": "docs", "partition": 0, "field": field}
    with pytest.raises(InvalidValueError):
        engine.add("d", ["not", "a", "dict"])
    engine.flush()
    assert engine.count("*") == 0  # nothing half-added
    engine.close()


def test_multi_valued_fields_and_dates(tmp_path: Path) -> None:
    engine = open_engine(tmp_path, MemoryChangelogPartition())
    engine.add("a", {"body": ["first paragraph", "second paragraph"], "module": ["os", "sys"],
                     "when": 0, "year": [1999, 2005]})
    engine.flush()
    assert engine.count("module:sys") == 1 and engine.count("second") == 1 and engine.count("year:2005") == 1
    assert engine.get("a")["when"] == dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    assert engine.count('when:"1970-01-01T00:00:00Z"') == 1
    engine.close()


def test_restore_rejects_records_that_do_not_fit_schema(tmp_path: Path) -> None:
    from localstate.core.changelog import ChangelogRecord
    engine = open_engine(tmp_path, MemoryChangelogPartition())
    with pytest.raises(RestoreError) as info:
        engine.restore([ChangelogRecord(b"a", json.dumps({"body": 5}).encode(), 7)])
    assert info.value.context["offset"] == 7 and info.value.context["store"] == "docs"
    engine.close()


def test_tie_break_depends_on_doc_ids_not_insertion_order(tmp_path: Path) -> None:
    one = open_engine(tmp_path / "one", MemoryChangelogPartition())
    two = open_engine(tmp_path / "two", MemoryChangelogPartition())
    ids = [f"k{i:03d}" for i in range(60)]
    for doc_id in ids:
        one.add(doc_id, {"body": "same words here"})
        one.flush() if doc_id.endswith("9") else None  # many segments
    for doc_id in reversed(ids):
        two.add(doc_id, {"body": "same words here"})
    one.flush()
    two.flush()
    from localstate.engines.search.engine import _tie
    expected = sorted(ids, key=lambda d: _tie(d.encode()))[:7]
    assert expected != ids[:7] and expected != list(reversed(ids))[:7]
    assert [h.doc_id for h in one.search("words", limit=7)] == expected
    assert [h.doc_id for h in two.search("words", limit=7)] == expected
    one.close()
    two.close()


def test_docs_example_runs(capsys) -> None:
    path = Path(__file__).parents[2] / "docs" / "snippets" / "search" / "engine_direct.py"  # in docs/search.md
    exec(compile(path.read_text(), str(path), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "[]" and out[2].startswith("a1 ") and out[-1] == "2 2"


def test_stdlib_example_runs(tmp_path: Path) -> None:
    import subprocess
    import sys
    script = Path(__file__).parents[2] / "examples" / "search" / "index_stdlib_docs.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "reopened: local offset" in result.stdout and "'temporary file':" in result.stdout
