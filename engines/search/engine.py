"""The search engine: a tantivy full-text index per store partition, made fault tolerant by a
changelog of ``doc_id -> document JSON`` records."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import struct
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping, Sequence

import tantivy

from localstate.core.changelog import ChangelogRecord
from localstate.core.corruption import corrupt_reason, store_corrupt, wipe_local
from localstate.core.engine import (Redistribution, SerdeColumn, SerdeUse, StateColumns, StorageEngine,
                                    StorageEngineFactory, StoreContext, StoreSerdes)
from localstate.core.logged import ChangelogCommit
from localstate.core.fsutil import check_tree_no_symlinks, errno_in_text, os_error_hint, write_atomic
from localstate.core.options import Option, did_you_mean, parse_size
from localstate.engines.search.schema import (
    FieldSpec,
    decode_document,
    encode_document,
    normalize_document,
    parse_default_fields,
    parse_fields,
    values_of,
)
from localstate.errors import (ConfigError, ConfigProblem, InvalidValueError, LocalStateError, RestoreError,
                               StoreClosedError, StoreError, StoreIOError)
from localstate.engines.search.columns import search_columns

__all__ = ["SearchEngineFactory", "SearchEngine", "SearchHit", "InvalidQueryError"]

log = logging.getLogger(__name__)

#: Hidden fields the engine adds to every schema.
ID_FIELD = "__ls_id"          # hex of the serialized doc id; raw string, stored, indexed
SOURCE_FIELD = "__ls_source"  # the document's JSON (what get() returns); stored only
TIE_FIELD = "__ls_tie"        # 64-bit hash of the doc id, fast: breaks score ties without loading docs
#: A term no document has (not hex); deleting it gives every commit at least one operation, so
#: each commit gets a new opstamp.
NOOP_TERM = "__localstate_noop__"
INDEX_DIRNAME = "tantivy"
OFFSET_FILENAME = "search-offset.json"
VERIFIED_FILENAME = "search-verified.json"
"""Segment files whose checksums were verified: ``{name: [size, mtime_ns]}`` (segments are immutable,
so each is read in full once, at the first open that finds it)."""
_SEGMENT_SUFFIXES = (".store", ".idx", ".term", ".pos", ".fast", ".fieldnorm")
_FOOTER_MAGIC = struct.pack("<I", 1337)  # tantivy's file footer: json {"version", "crc"}, u32 len, u32 magic
#: Words of tantivy errors that mean its files are damaged.
_DAMAGE_WORDS = ("IO error", "corrupt", "Corrupt", "checksum", "decompress", "out of bounds")
_MIN_THREAD_HEAP = 15_000_000  # tantivy refuses less per indexing thread
_RESTORE_CHUNK_BYTES = 32 << 20  # restore coalesces this much changelog at a time


class InvalidQueryError(InvalidValueError):
    """A query string tantivy cannot parse (syntax error, unknown field, bad literal)."""


@dataclass(frozen=True)
class SearchHit:
    """One ranked result: BM25 score, document id, and the fields declared ``stored = true``."""

    doc_id: Any
    score: float
    fields: dict[str, Any]


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit))


def _is_damage(exc: BaseException) -> bool:
    """Whether a tantivy read error reports damaged index files (a pyo3 panic while reading counts)."""
    if isinstance(exc, LocalStateError) or _is_fatal(exc):
        return False
    return type(exc).__name__ == "PanicException" or (
        isinstance(exc, (ValueError, OSError)) and any(word in str(exc) for word in _DAMAGE_WORDS))


def _footer_problem(path: Path) -> str | None:
    """Why segment file ``path`` fails tantivy's own footer checksum (crc32 of the bytes before the
    footer), or None."""
    data = path.read_bytes()
    if len(data) < 8 or data[-4:] != _FOOTER_MAGIC:
        return f"{path.name} has no valid footer"
    length = struct.unpack_from("<I", data, len(data) - 8)[0]
    if length + 8 > len(data):
        return f"{path.name} has a damaged footer"
    try:
        crc = json.loads(data[len(data) - 8 - length:len(data) - 8])["crc"]
    except (ValueError, KeyError, TypeError):
        return f"{path.name} has an unreadable footer"
    if zlib.crc32(memoryview(data)[:len(data) - 8 - length]) != crc:
        return f"{path.name} fails its checksum"
    return None


def _tie(key: bytes) -> int:
    """A stable signed 64-bit hash of a serialized doc id (tie-break order of equal scores)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


def _drop_writer(writer: tantivy.IndexWriter) -> None:
    """Discard uncommitted work and release the writer's directory lock."""
    try:
        writer.rollback()
        writer.wait_merging_threads()
    except BaseException as exc:
        if _is_fatal(exc):
            raise
        log.warning("closing a tantivy index writer failed: %s", exc)


class SearchEngine(ChangelogCommit, StorageEngine):
    """A tantivy index for one store partition.

    Visibility: ``add``/``delete`` are *pending* until :meth:`flush`. :meth:`get` sees pending
    writes (read-your-writes through an overlay of pending documents); :meth:`search` and
    :meth:`count` see the index as of the last :meth:`flush` (tantivy commit + reader reload).
    Records handed to :meth:`restore` become visible to every call at the next flush.

    Durability: :meth:`flush` logs one record per changed doc id (``key_serde(doc_id) -> JSON`` or a
    tombstone), calls ``changelog.flush()`` for the end offset ``n``, then commits the index. The
    local offset is tied to the tantivy commit through its opstamp (tantivy-py has no commit
    payload): before committing, ``search-offset.json`` records ``{opstamp: P, offset: o, next: n}``
    where P/o are the current commit; on open, a committed opstamp still equal to P means the
    commit did not happen (offset o), anything else means it did (offset n). So the offset is
    exactly as atomic as the commit itself. (A hidden offset document, replaced at each commit,
    would also be atomic but leaves a deleted document per flush in the segments, which skews
    BM25 statistics until merges; this way an index built by adds alone ranks exactly like a
    fresh rebuild.) Ranking ties (equal BM25 scores) are broken by a hash of the doc id, so
    results depend only on what the index holds, not on segment layout.
    """

    def __init__(self, context: StoreContext, specs: Mapping[str, FieldSpec], default_fields: Sequence[str],
                 writer_memory: int, writer_threads: int) -> None:
        super().__init__(context)
        self.specs = dict(specs)
        self.default_fields = list(default_fields)
        self._stored = [name for name, spec in self.specs.items() if spec.stored]
        self._path = Path(context.directory) / INDEX_DIRNAME
        self._writer_memory = writer_memory
        self._writer_threads = writer_threads
        self._pending: dict[bytes, tuple[bytes, dict[str, Any]] | None] = {}
        self._dirty = False  # restored records not yet committed
        self._closed = False
        self._offset_path = Path(context.directory) / OFFSET_FILENAME
        self.changelog = context.changelog
        try:
            self._index, self._writer, self._offset = self._open()
        except (OSError, ValueError) as exc:  # tantivy reports OS errors as ValueError text
            code = (exc.errno if isinstance(exc, OSError) else None) or errno_in_text(str(exc))
            if code is None:
                raise
            raise StoreIOError(f"cannot open the search index at {self._path}: {exc}", errno=code,
                               hint=os_error_hint(code), path=str(self._path), **self.context.describe()) from exc
        self._opstamp: int = self._writer.commit_opstamp
        self._searcher = self._index.searcher()

    # -- opening ---------------------------------------------------------------------------------

    def _schema(self) -> tantivy.Schema:
        builder = tantivy.SchemaBuilder()
        builder.add_text_field(ID_FIELD, stored=True, tokenizer_name="raw")
        builder.add_bytes_field(SOURCE_FIELD, stored=True)
        builder.add_integer_field(TIE_FIELD, fast=True)
        for spec in self.specs.values():
            if spec.type in ("text", "string"):
                builder.add_text_field(spec.name, stored=False, fast=spec.fast, tokenizer_name=spec.tokenizer)
            elif spec.type == "int":
                builder.add_integer_field(spec.name, stored=False, indexed=spec.indexed, fast=spec.fast)
            elif spec.type == "float":
                builder.add_float_field(spec.name, stored=False, indexed=spec.indexed, fast=spec.fast)
            else:
                builder.add_date_field(spec.name, stored=False, indexed=spec.indexed, fast=spec.fast)
        return builder.build()

    def _open(self) -> tuple[tantivy.Index, tantivy.IndexWriter, int | None]:
        """Open the local index, its writer and its offset. A directory tantivy cannot use is
        wiped (local state is only a cache of the changelog) and reported as offset None."""
        schema = self._schema()
        check_tree_no_symlinks(self._path)  # tantivy would follow a planted symlink
        self._path.mkdir(parents=True, exist_ok=True)
        problem: str | None = None
        index: tantivy.Index | None = None
        exists = tantivy.Index.exists(str(self._path))
        marked = corrupt_reason(self._path)
        if marked is not None:
            problem = f"found damaged earlier: {marked}"
        elif exists:
            problem = self._segment_damage()
        if problem is not None:
            pass  # discarded below
        elif exists:
            try:
                index = tantivy.Index(schema, path=str(self._path), reuse=True)
                num_docs = index.searcher().num_docs
            except BaseException as exc:  # tantivy raises ValueError or pyo3 PanicException
                if _is_fatal(exc):
                    raise
                index, problem = None, str(exc).splitlines()[0][:300]
        elif any(self._path.iterdir()):
            problem = "it has files but no meta.json"
        else:
            self._offset_path.unlink(missing_ok=True)
            index, num_docs = tantivy.Index(schema, path=str(self._path), reuse=True), 0
        if index is not None:
            writer = self._new_writer(index)
            offset, problem = self._committed_offset(writer.commit_opstamp, num_docs)
            if problem is None:
                return index, writer, offset
            _drop_writer(writer)
        wipe_local(self._path, "index", problem, store=self.context.store, partition=self.context.partition)
        # The offset marker and the verified-segments list live beside the index: stale without it.
        self._offset_path.unlink(missing_ok=True)
        self._verified_path.unlink(missing_ok=True)
        index = tantivy.Index(schema, path=str(self._path), reuse=True)
        return index, self._new_writer(index), None

    @property
    def _verified_path(self) -> Path:
        return Path(self.context.directory) / VERIFIED_FILENAME

    def _segment_damage(self) -> str | None:
        """Verify the footer checksum of every segment file not verified at an earlier open (tantivy
        reads lazily and would serve damaged segments as wrong or missing results). Why the index is
        damaged, or None."""
        try:
            verified = json.loads(self._verified_path.read_bytes())
            if not isinstance(verified, dict):
                verified = {}
        except (OSError, ValueError):
            verified = {}
        committed = self._committed_files()
        if committed is None:
            return None  # no readable meta.json: opening the index reports it
        now: dict[str, list[int]] = {}
        for entry in os.scandir(self._path):
            if entry.name not in committed or not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            identity = [stat.st_size, stat.st_mtime_ns]
            if verified.get(entry.name) != identity:
                problem = _footer_problem(Path(entry.path))
                if problem is not None:
                    return problem
            now[entry.name] = identity
        if now != verified:
            write_atomic(self._verified_path, json.dumps(now, sort_keys=True).encode())
        return None

    def _committed_files(self) -> set[str] | None:
        """Names of the files of the segments meta.json lists (files of segments a killed writer
        left behind uncommitted are not part of the index and may be torn)."""
        try:
            meta = json.loads((self._path / "meta.json").read_bytes())
            names: set[str] = set()
            for segment in meta["segments"]:
                prefix = str(segment["segment_id"]).replace("-", "")
                names.update(f"{prefix}{suffix}" for suffix in _SEGMENT_SUFFIXES)
                deletes = segment.get("deletes")
                if deletes:
                    names.add(f"{prefix}.{int(deletes['opstamp'])}.del")
            return names
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Damage found while reading the index is a StoreCorruptError (and marks it for a rebuild at
        the next open), not an error of the task."""
        try:
            yield
        except BaseException as exc:
            if not _is_damage(exc):
                raise
            raise store_corrupt(self._path, "tantivy", str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                store=self.context.store, partition=self.context.partition) from exc

    def _new_writer(self, index: tantivy.Index) -> tantivy.IndexWriter:
        try:
            return index.writer(heap_size=self._writer_memory, num_threads=self._writer_threads)
        except ValueError as exc:
            raise StoreError(f"cannot open the index writer of {self._path}: {exc}",
                             hint="another process (or another open instance) holds this store partition; "
                                  "close it first", **self.context.describe()) from exc

    def _committed_offset(self, opstamp: int, num_docs: int) -> tuple[int | None, str | None]:
        """(offset, None) for the committed index, or (None, why it is unusable)."""
        try:
            marker = json.loads(self._offset_path.read_bytes())
            before, offset, following = marker["opstamp"], marker["offset"], marker["next"]
        except FileNotFoundError:
            # Never flushed: usable only if empty (the changelog state at offset 0).
            return (0, None) if num_docs == 0 else (None, f"it holds documents but {OFFSET_FILENAME} is missing")
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"{OFFSET_FILENAME} is unreadable: {exc}"
        offset = following if opstamp != before else offset
        if offset is None:
            return (0, None) if num_docs == 0 else (None, "its offset is unknown")
        return int(offset), None

    def _write_marker(self, offset: int | None, following: int) -> None:
        """Durably note, before a commit, what the commit will mean (see class docstring)."""
        write_atomic(self._offset_path,
                     json.dumps({"opstamp": self._opstamp, "offset": offset, "next": following}).encode())

    # -- helpers ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("search store used after close()", hint="open the store again",
                                   **self.context.describe())

    def _key(self, doc_id: Any) -> bytes:
        if doc_id is None:
            raise InvalidValueError("doc_id must not be None", hint="pass a document id",
                                    **self.context.describe())
        return self.context.key_serde.serialize(doc_id)

    def _tantivy_doc(self, key: bytes, source: bytes, normalized: Mapping[str, Any]) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_text(ID_FIELD, key.hex())
        doc.add_bytes(SOURCE_FIELD, source)
        doc.add_integer(TIE_FIELD, _tie(key))
        for name, value in normalized.items():
            kind = self.specs[name].type
            for item in values_of(value):
                if kind in ("text", "string"):
                    doc.add_text(name, item)
                elif kind == "int":
                    doc.add_integer(name, item)
                elif kind == "float":
                    doc.add_float(name, item)
                else:
                    doc.add_date(name, _dt.datetime.fromisoformat(item))
        return doc

    def _parse(self, query: str, fields: Sequence[str] | None) -> tantivy.Query:
        if not isinstance(query, str):
            raise InvalidQueryError(f"a query must be a string, got {type(query).__name__}",
                                    hint="pass a query string such as 'title:python AND year:[2000 TO 2010]'",
                                    **self.context.describe())
        names = self.default_fields if fields is None else list(fields)
        for name in names:
            if name not in self.specs:
                raise InvalidQueryError(f"unknown field {name!r} in fields=" + did_you_mean(str(name), list(self.specs)),
                                        hint=f"fields: {', '.join(self.specs)}", field=name,
                                        **self.context.describe())
        try:
            return self._index.parse_query(query, names)
        except ValueError as exc:
            raise InvalidQueryError(f"cannot parse query {query!r}: {exc}",
                                    hint="check the query syntax (field:term, \"phrase\", AND/OR/NOT, "
                                         f"[a TO b]); fields: {', '.join(self.specs)}",
                                    query=query, **self.context.describe()) from exc

    def _source_of(self, doc: tantivy.Document) -> dict[str, Any]:
        return json.loads(doc.get_first(SOURCE_FIELD))

    def _doc_id(self, doc: tantivy.Document) -> Any:
        return self.context.key_serde.deserialize(bytes.fromhex(doc.get_first(ID_FIELD)))

    # -- query API -------------------------------------------------------------------------------

    def add(self, doc_id: Any, doc: Mapping[str, Any]) -> None:
        """Add or replace the document ``doc_id``. Checked against the schema now (typed error
        naming the field); visible to get() at once, to search() after flush()."""
        self._check_open()
        key = self._key(doc_id)
        normalized = normalize_document(self.specs, doc, self.context.store, self.context.partition)
        self._pending[key] = (encode_document(normalized), normalized)

    def add_many(self, doc_ids: Iterable[Any], docs: Iterable[Mapping[str, Any]] | Any) -> None:
        """``add(doc_id, doc)`` for each pair, in order (a doc id given twice keeps its last document):
        a batch task's documents at once. ``docs`` is a sequence of mappings, or a ``pyarrow``
        RecordBatch or Table whose columns are the fields (each row a document; null fields are
        left out, as a missing field). Every id and document is checked before any is applied: an
        error adds none of the batch."""
        self._check_open()
        if hasattr(docs, "to_pylist") and hasattr(docs, "schema"):  # Arrow rows: the fields as columns
            docs = [{name: value for name, value in row.items() if value is not None} for row in docs.to_pylist()]
        ids = doc_ids if isinstance(doc_ids, list) else list(doc_ids)
        docs = docs if isinstance(docs, list) else list(docs)
        if len(ids) != len(docs):
            raise InvalidValueError(f"add_many: {len(ids)} doc ids but {len(docs)} documents",
                                    hint="pass one document per doc id", **self.context.describe())
        key, specs, store, partition = self._key, self.specs, self.context.store, self.context.partition
        staged: dict[bytes, tuple[bytes, dict[str, Any]]] = {}
        for doc_id, doc in zip(ids, docs):
            normalized = normalize_document(specs, doc, store, partition)
            staged[key(doc_id)] = (encode_document(normalized), normalized)
        self._pending.update(staged)  # the same order and contents as add() of each pair in turn

    def delete(self, doc_id: Any) -> None:
        """Delete ``doc_id`` (a no-op if absent). Same visibility as add()."""
        self._check_open()
        self._pending[self._key(doc_id)] = None

    def get(self, doc_id: Any) -> dict[str, Any] | None:
        """The whole document as added (dates as aware UTC datetimes), or None. Sees pending writes."""
        self._check_open()
        key = self._key(doc_id)
        if key in self._pending:
            entry = self._pending[key]
            return None if entry is None else decode_document(self.specs, entry[1])
        term = tantivy.Query.term_query(self._index.schema, ID_FIELD, key.hex())
        with self._reading():
            hits = self._searcher.search(term, 1).hits
            if not hits:
                return None
            source = self._source_of(self._searcher.doc(hits[0][1]))
        return decode_document(self.specs, source)

    def search(self, query: str, limit: int = 10, fields: Sequence[str] | None = None) -> list[SearchHit]:
        """The ``limit`` best documents for ``query`` (tantivy query syntax), best first.

        ``fields``: the fields searched by terms without ``field:`` (default: ``default_fields``).
        Ties in score are broken by a 64-bit hash of the doc id, so the result depends only on the
        documents in the index, not on how they were added (segments, merges).
        """
        self._check_open()
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise InvalidValueError(f"limit must be a non-negative integer, got {limit!r}",
                                    hint="pass limit=10 for example", **self.context.describe())
        parsed = self._parse(query, fields)
        if limit == 0:
            return []
        with self._reading():
            return self._search(parsed, limit)

    def _search(self, parsed: tantivy.Query, limit: int) -> list[SearchHit]:
        searcher = self._searcher
        # Fetch until every document tying with the limit-th score is in hand, so the cut does not
        # depend on tantivy's doc-address order (which differs between equal indexes).
        fetch = limit + 1
        while True:
            raw = searcher.search(parsed, fetch, count=False).hits
            if len(raw) < fetch or raw[-1][0] < raw[limit - 1][0]:
                break
            fetch *= 2
        if len(raw) > limit and raw[limit][0] < raw[limit - 1][0]:
            raw = raw[:limit]  # no tie at the cut: the extra hit is not needed
        ties = searcher.fast_field_values(TIE_FIELD, [address for _, address in raw])
        ranked = sorted(zip(raw, ties), key=lambda item: (-item[0][0], item[1]))
        hits = []
        for (score, address), _ in ranked[:limit]:
            doc = searcher.doc(address)
            source = self._source_of(doc)
            stored = decode_document(self.specs, {n: source[n] for n in self._stored if n in source})
            hits.append(SearchHit(self._doc_id(doc), score, stored))
        return hits

    def count(self, query: str, fields: Sequence[str] | None = None) -> int:
        """Number of documents matching ``query`` as of the last flush()."""
        self._check_open()
        parsed = self._parse(query, fields)
        with self._reading():
            return self._searcher.search(parsed, 1, count=True).count

    # -- contract --------------------------------------------------------------------------------

    def restore(self, records: Iterable[ChangelogRecord]) -> None:
        """Re-index changelog records with the one open writer; committed at the next flush().

        Records are coalesced in bounded chunks (last record per doc id wins) so a document that
        is overwritten or deleted later in the chunk is never indexed: less work, and no deleted
        documents left behind to skew BM25 statistics.
        """
        self._check_open()
        # Deleting a term that cannot exist is wasted work on a bulk rebuild of an empty index.
        empty = not self._dirty and self._searcher.num_docs == 0
        seen: set[bytes] = set()
        chunk: dict[bytes, ChangelogRecord] = {}
        size = 0
        for record in records:
            chunk.pop(record.key, None)  # re-insert: keep chunk order = order of last writes
            chunk[record.key] = record
            size += len(record.key) + len(record.value or b"") + 64
            if size >= _RESTORE_CHUNK_BYTES:
                self._restore_chunk(chunk, empty, seen)
                chunk, size = {}, 0
        self._restore_chunk(chunk, empty, seen)

    def _restore_chunk(self, chunk: Mapping[bytes, ChangelogRecord], empty: bool, seen: set[bytes]) -> None:
        writer = self._writer
        for key, record in chunk.items():
            if not empty or key in seen:
                writer.delete_documents_by_term(ID_FIELD, key.hex())
            if empty:
                seen.add(key)
            self._pending.pop(key, None)
            self._dirty = True
            if record.value is None:
                continue
            try:
                normalized = normalize_document(self.specs, json.loads(record.value), self.context.store,
                                                self.context.partition)
            except (ValueError, InvalidValueError) as exc:
                raise RestoreError(f"changelog record for doc {key!r:.60} does not fit the index schema: {exc}",
                                   hint="the store's fields changed incompatibly with the logged documents; "
                                        "restore the old schema or rebuild the changelog",
                                   offset=record.offset, **self.context.describe()) from exc
            writer.add_document(self._tantivy_doc(key, encode_document(normalized), normalized))

    def flush(self) -> None:
        """Log pending changes (one record per doc id), flush the changelog, then commit the index
        together with the new offset (hidden offset document) and reload the searcher."""
        self._check_open()
        self.commit([(key, None if entry is None else entry[0]) for key, entry in self._pending.items()])

    def _write_local(self, writes: Any, end: int, deletes: bool) -> None:
        """The tantivy commit of the pending documents with the offset marker (the commit template's
        local write), then a searcher reload."""
        pending = self._pending
        if not pending and not self._dirty and end == self._offset:
            return
        writer = self._writer
        try:
            for key, entry in pending.items():
                writer.delete_documents_by_term(ID_FIELD, key.hex())
                if entry is not None:
                    writer.add_document(self._tantivy_doc(key, entry[0], entry[1]))
            writer.delete_documents_by_term(ID_FIELD, NOOP_TERM)
            self._write_marker(self._offset, end)
            opstamp = writer.commit()
        except BaseException as exc:
            if _is_fatal(exc):
                raise
            # Pending stays: a retry logs the same records again (harmless) and re-applies them.
            writer.rollback()
            code = (exc.errno if isinstance(exc, OSError) else None) or errno_in_text(str(exc))
            error = StoreIOError if code is not None else StoreError
            raise error(f"tantivy commit failed: {exc}", hint="check disk space and permissions of "
                        f"{self._path}; the changelog already holds the changes", offset=end,
                        **self.context.describe(), **({"errno": code} if code is not None else {})) from exc
        if opstamp == self._opstamp:  # never seen; would only make a reopen replay a little more
            log.warning("search store %s: tantivy commit kept opstamp %d", self.context.store, opstamp)
        self._opstamp = opstamp
        self._pending = {}
        self._dirty = False
        self._index.reload()
        self._searcher = self._index.searcher()

    def local_offset(self) -> int | None:
        """Offset committed with the index (0 for a new empty index, None after a discarded one)."""
        self._check_open()
        return self._offset

    def close(self) -> None:
        """Discard uncommitted changes and release the index writer lock. Does not flush."""
        if self._closed:
            return
        self._closed = True
        self._pending = {}
        writer, self._writer = self._writer, None
        _drop_writer(writer)
        del writer
        self._searcher = None
        self._index = None


class SearchEngineFactory(StorageEngineFactory):
    """``engine = "search"``: a tantivy full-text index; schema from the store's ``fields`` table."""

    description = "full-text search index (tantivy): add/delete/get documents, BM25-ranked search"
    unsupported_options: ClassVar[Mapping[str, str]] = {
        "ttl": "the index has no expiry per document yet (docs/time/ttl.md); delete old documents from "
               "the task, e.g. with a timer"}
    options: ClassVar[Mapping[str, Option]] = {
        "fields": Option(dict, doc="the index schema: field name -> { type = text|string|int|float|date, "
                                   "stored, indexed, tokenizer, fast, required }"),
        "default_fields": Option(list, default=[], doc="fields searched by terms without 'field:' "
                                                      "(default: every text field)"),
        "writer_memory": Option((int, str), default=128 << 20, parse=parse_size,
                                doc="tantivy indexing memory budget (split between writer threads)"),
        "writer_threads": Option(int, default=1, minimum=1, maximum=8, doc="tantivy indexing threads"),
    }

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        specs = parse_fields(store, options["fields"])
        options["fields"] = {name: spec.as_dict() for name, spec in specs.items()}
        options["default_fields"] = parse_default_fields(store, options["default_fields"], specs)
        need = _MIN_THREAD_HEAP * options["writer_threads"]
        if options["writer_memory"] < need:
            raise ConfigError([ConfigProblem(f"stores.{store}.writer_memory",
                                             f"must be at least {need} bytes (15MB per writer thread), "
                                             f"got {options['writer_memory']}")])

    def serdes(self, options: Mapping[str, Any]) -> StoreSerdes:
        """The task's document ids (key serde); documents are logged as JSON by the engine itself:
        no value serde."""
        return StoreSerdes(key=SerdeUse("document ids"), value=None)

    def create(self, context: StoreContext) -> SearchEngine:
        specs = parse_fields(context.store, context.options["fields"])
        default_fields = parse_default_fields(context.store, context.options.get("default_fields", []), specs)
        return SearchEngine(context, specs, default_fields,
                            writer_memory=parse_size(context.options.get("writer_memory", "128MB")),
                            writer_threads=int(context.options.get("writer_threads", 1)))

    def state_columns(self, store: str, options: Mapping[str, Any], key: SerdeColumn,
                      value: SerdeColumn) -> StateColumns:
        """One row per document: :func:`~localstate.engines.search.columns.search_columns`."""
        return search_columns(store, options, key)

    def redistribution(self, store: str, options: Mapping[str, Any], merge_values: Any = None) -> Redistribution:
        """``core.engine.Rescalable``: a document goes with its id; documents do not merge."""
        return Redistribution(lambda key: key)
