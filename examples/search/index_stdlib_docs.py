"""Index the Python standard library's docstrings with the ``search`` engine and query them.

    python examples/search/index_stdlib_docs.py [STATE_DIR]

A stream of real text nobody on this project wrote: every module, class and function docstring of
the stdlib (read with ast; nothing is imported), one document per docstring, flushed every 500
documents like a job committing. Then it answers a few queries, reopens the store to show that the
local index is reused (no replay), and rebuilds a second copy from the changelog alone.
Uses the file changelog when ``localstate.changelog.file`` provides one, else the memory changelog.
"""

from __future__ import annotations

import ast
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.search import SearchEngine, SearchEngineFactory

FIELDS: dict[str, Any] = {
    "name": {"type": "text", "stored": True},
    "doc": {"type": "text", "tokenizer": "en_stem", "required": True},
    "module": {"type": "string", "stored": True},
    "kind": {"type": "string", "stored": True},
    "lines": {"type": "int", "stored": True, "fast": True},
}


def docstrings() -> Iterator[tuple[str, dict[str, Any]]]:
    """(doc_id, document) for every docstring of the stdlib's top-level modules."""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):  # the module first, then its classes and functions
            if node is not tree and not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            text = ast.get_docstring(node)
            if not text:
                continue
            name = path.stem if node is tree else f"{path.stem}.{node.name}"
            kind = "module" if node is tree else type(node).__name__[:-3].lower()
            yield f"{name}:{getattr(node, 'lineno', 0)}", {"name": name.replace(".", " ").replace("_", " "),
                                                           "doc": text, "module": path.stem, "kind": kind,
                                                           "lines": text.count("\n") + 1}


def changelog_for(state_dir: Path):  # noqa: ANN201 - a ChangelogPartition
    try:
        from localstate.changelog.file import FileChangelogSystem  # type: ignore[attr-defined]
    except ImportError:
        from localstate.changelog.memory import MemoryChangelogPartition
        print("(localstate.changelog.file not available: using the in-memory changelog)")
        return MemoryChangelogPartition("stdlib-docs", 0)
    system = FileChangelogSystem(FileChangelogSystem.validate({}, "changelogs.file"), state_dir)
    system.ensure_stream("stdlib-docs", 1)
    return system.partition("stdlib-docs", 0)


def open_store(directory: Path, changelog) -> SearchEngine:  # noqa: ANN001
    factory = SearchEngineFactory()
    options = factory.validate_options("stdlib_docs", {"fields": FIELDS, "default_fields": ["name", "doc"]})
    directory.mkdir(parents=True, exist_ok=True)
    return factory.create(StoreContext("example", "stdlib_docs", 0, directory, options,
                                       StringSerde(), BytesSerde(), changelog))


def show(store: SearchEngine, query: str) -> None:
    print(f"\n{query!r}: {store.count(query)} matches")
    for hit in store.search(query, limit=3):
        print(f"  {hit.score:6.2f}  {hit.doc_id:<40} {hit.fields['kind']:<8} {hit.fields.get('lines')} lines")


def main(argv: list[str]) -> int:
    state_dir = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="stdlib-docs-"))
    changelog = changelog_for(state_dir)
    store = open_store(state_dir / "store", changelog)
    start = time.perf_counter()
    n = 0
    for doc_id, doc in docstrings():
        store.add(doc_id, doc)
        n += 1
        if n % 500 == 0:
            store.flush()  # a commit: log, flush the changelog, commit the index with its offset
    store.flush()
    print(f"indexed {n} docstrings in {time.perf_counter() - start:.1f}s; local offset {store.local_offset()}")
    for query in ["temporary file", "doc:thread AND doc:lock", "kind:class AND socket",
                  '"regular expression"', "lines:[100 TO 10000]"]:
        show(store, query)
    offset = store.local_offset()
    store.close()

    again = open_store(state_dir / "store", changelog)  # local state reuse: nothing to replay
    assert again.local_offset() == offset
    print(f"\nreopened: local offset {again.local_offset()} == changelog end {changelog.end_offset()}")
    again.close()

    rebuilt = open_store(state_dir / "rebuilt", changelog)  # a new machine: rebuild from the changelog
    start = time.perf_counter()
    rebuilt.restore(changelog.read(0))
    rebuilt.flush()
    print(f"rebuilt {rebuilt.count('*')} documents from the changelog in {time.perf_counter() - start:.2f}s")
    show(rebuilt, "temporary file")
    rebuilt.close()
    print(f"\nstate in {state_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
