"""Test support for the search engine: a real text corpus (Python stdlib docstrings), a tiny durable
JSON-lines changelog (used when localstate.changelog.file is not available), and StoreContext
builders. Loaded by conftest.py and by the kill -9 worker script."""

from __future__ import annotations

import ast
import base64
import json
import os
import sysconfig
from pathlib import Path
from typing import Any, Iterable, Iterator

from localstate import ChangelogPartition, ChangelogRecord, ChangelogWriter, StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.search import SearchEngine, SearchEngineFactory

__all__ = ["FIELDS", "corpus", "JsonlChangelog", "durable_changelog", "make_context", "open_engine"]

FIELDS: dict[str, Any] = {
    "title": {"type": "text", "stored": True, "tokenizer": "en_stem"},
    "body": {"type": "text", "required": True},
    "module": {"type": "string", "stored": True},
    "year": {"type": "int", "stored": True, "fast": True},
    "weight": {"type": "float", "stored": True},
    "when": {"type": "date", "stored": True},
}


def corpus(limit: int | None = None) -> list[dict[str, Any]]:
    """Paragraphs of the docstrings of the Python standard library (text nobody here wrote),
    read with ast (nothing is imported), in a deterministic order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs: list[dict[str, Any]] = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        nodes = [tree] + [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        for node in nodes:
            text = ast.get_docstring(node)
            if not text:
                continue
            name = path.stem if node is tree else f"{path.stem}.{node.name}"
            for i, para in enumerate(p.strip() for p in text.split("\n\n")):
                if len(para) < 40:
                    continue
                n = len(docs)
                docs.append({"title": name.replace("_", " ") + f" part {i}", "body": para, "module": path.stem,
                             "year": 1990 + n % 35, "weight": (n % 97) / 7.0,
                             "when": f"20{n % 25:02d}-0{1 + n % 9}-1{n % 10}T12:00:00+00:00"})
                if limit is not None and len(docs) >= limit:
                    return docs
    return docs


class JsonlChangelog(ChangelogPartition):
    """A durable changelog partition in one JSON-lines file (test-only). ``flush()`` writes and
    fsyncs; a torn last line (crash mid-write) is ignored and cut on open."""

    def __init__(self, path: Path, stream: str = "search", partition: int = 0) -> None:
        self.path = Path(path)
        self.stream, self.partition = stream, partition
        self._records: list[ChangelogRecord] = []
        self._pending: list[tuple[bytes, bytes | None]] = []
        good = 0
        if self.path.exists():
            data = self.path.read_bytes()
            for line in data.split(b"\n"):
                if not line:
                    break
                try:
                    obj = json.loads(line)
                except ValueError:
                    break
                value = None if obj["v"] is None else base64.b64decode(obj["v"])
                self._records.append(ChangelogRecord(base64.b64decode(obj["k"]), value, obj["o"]))
                good += len(line) + 1
            if good != len(data):
                with open(self.path, "r+b") as f:
                    f.truncate(good)
        self._file = open(self.path, "ab")

    def append(self, key: bytes, value: bytes | None) -> None:
        self._pending.append((bytes(key), None if value is None else bytes(value)))

    def flush(self) -> int:
        lines = []
        for key, value in self._pending:
            record = ChangelogRecord(key, value, len(self._records))
            self._records.append(record)
            lines.append(json.dumps({"o": record.offset, "k": base64.b64encode(key).decode(),
                                     "v": None if value is None else base64.b64encode(value).decode()}))
        self._pending.clear()
        if lines:
            self._file.write(("\n".join(lines) + "\n").encode())
            self._file.flush()
            os.fsync(self._file.fileno())
        return len(self._records)

    def end_offset(self) -> int:
        return len(self._records) + len(self._pending)

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        stop = len(self._records) if end is None else min(end, len(self._records))
        return iter(self._records[start:stop])

    def close(self) -> None:
        self._file.close()


def durable_changelog(directory: Path) -> ChangelogPartition:
    """The project's file changelog when it is available, else the JSON-lines one above."""
    try:
        from localstate.changelog.file import FileChangelogSystem  # type: ignore[attr-defined]
    except ImportError:
        return JsonlChangelog(Path(directory) / "changelog.jsonl")
    system = FileChangelogSystem(FileChangelogSystem.validate({}, "changelogs.file"), Path(directory))
    system.ensure_stream("search-changelog", 1)
    return system.partition("search-changelog", 0)


def make_context(directory: Path, changelog: ChangelogWriter, fields: dict[str, Any] | None = None,
                 store: str = "docs", **options: Any) -> StoreContext:
    factory = SearchEngineFactory()
    opts = factory.validate_options(store, {"fields": fields or FIELDS, "writer_memory": "32MB", **options})
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return StoreContext("job", store, 0, directory, opts, StringSerde(), BytesSerde(), changelog)


def open_engine(directory: Path, changelog: ChangelogWriter, **kwargs: Any) -> SearchEngine:
    context = make_context(directory, changelog, **kwargs)
    return SearchEngineFactory().create(context)


def state_at(records: Iterable[ChangelogRecord]) -> dict[bytes, bytes]:
    """Compacted changelog state: last value per key, tombstones removed."""
    state: dict[bytes, bytes | None] = {}
    for record in records:
        state[record.key] = record.value
    return {k: v for k, v in state.items() if v is not None}


def read_checkpoint(path: Path) -> int:
    """The offset the worker recorded after its last completed flush (0 if none yet)."""
    try:
        return int(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return 0


def write_checkpoint(path: Path, offset: int) -> None:
    """Atomically record ``offset`` (what the runtime's checkpoint file would hold)."""
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(offset))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def recover(engine: SearchEngine, changelog: ChangelogPartition, checkpoint: int) -> dict[str, Any]:
    """What the runtime does on start (see the helper brief): replay [min(L, C), C), then
    neutralise records written after C by re-writing each such key's value at C (trim records,
    appended to the changelog too so a later rebuild agrees), then flush."""
    local = engine.local_offset()
    start = 0 if local is None else min(local, checkpoint)
    engine.restore(changelog.read(start, checkpoint))
    tail_keys = {r.key for r in changelog.read(checkpoint)}
    if tail_keys:
        at_c = state_at(changelog.read(0, checkpoint))
        trims = [(key, at_c.get(key)) for key in sorted(tail_keys)]
        changelog.append_many(trims)
        end = changelog.flush()
        engine.restore(ChangelogRecord(k, v, end - 1) for k, v in trims)
    engine.flush()
    return {"local": local, "checkpoint": checkpoint, "replayed_from": start, "trimmed": len(tail_keys)}
