"""Search engine benchmark: indexing throughput, query latency (p50/p99) and restore time vs index
size, each next to tantivy used directly on the same documents in the same run.

    python -m bench search [--json] [--quick] [--docs N]

Documents are real text: paragraphs of the Python standard library's docstrings (read with ast),
repeated with variations (a sentence of another paragraph appended, other numbers) to reach N.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import random
import shutil
import statistics
import sysconfig
import tempfile
from functools import partial
import time
from pathlib import Path
from typing import Any

import tantivy

from bench.report import Report, peak_rss_mb, timed
from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.search import SearchEngine, SearchEngineFactory

__all__ = ["main"]

FIELDS: dict[str, Any] = {
    "title": {"type": "text", "stored": True, "tokenizer": "en_stem"},
    "body": {"type": "text"},
    "module": {"type": "string", "stored": True},
    "year": {"type": "int", "stored": True, "fast": True},
    "when": {"type": "date"},
}
COMMIT_EVERY = 1000
WRITER_MEMORY = 128 << 20


def paragraphs() -> list[tuple[str, str]]:
    """(module, paragraph) pairs from stdlib docstrings, deterministic order."""
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))]:
            text = ast.get_docstring(node)
            for para in (p.strip() for p in (text or "").split("\n\n")):
                if len(para) >= 40:
                    out.append((path.stem, para))
    return out


def make_docs(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    base = paragraphs()
    docs = []
    for i in range(n):
        module, para = base[i % len(base)]
        if i >= len(base):  # a variation: append one sentence of another paragraph
            other = base[rng.randrange(len(base))][1].split(". ")[0]
            para = f"{para} {other}"
        docs.append({"title": f"{module} {para.split(None, 6)[:6] and ' '.join(para.split()[:6])}",
                     "body": para, "module": module, "year": 1990 + i % 35,
                     "when": dt.datetime(2000 + i % 25, 1 + i % 12, 1 + i % 28, tzinfo=dt.timezone.utc)})
    return docs


def make_queries(docs: list[dict[str, Any]], count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    words = [w.strip(".,:;()[]'\"`").lower() for d in docs[:5000] for w in d["body"].split()]
    words = [w for w in words if w.isalpha() and len(w) > 3]
    queries = []
    for i in range(count):
        a, b = rng.choice(words), rng.choice(words)
        queries.append([a, f"{a} {b}", f"+{a} +{b}", f'"{a} {b}"' if i % 7 == 0 else f"title:{a}"][i % 4])
    return queries


# -- the engine ----------------------------------------------------------------------------------------


def open_engine(directory: Path, changelog: MemoryChangelogPartition) -> SearchEngine:
    factory = SearchEngineFactory()
    options = factory.validate_options("bench", {"fields": FIELDS, "writer_memory": WRITER_MEMORY})
    directory.mkdir(parents=True, exist_ok=True)
    context = StoreContext("bench", "bench", 0, directory, options, StringSerde(), BytesSerde(), changelog)
    return factory.create(context)


def engine_index(directory: Path, docs: list[dict[str, Any]]) -> tuple[SearchEngine, MemoryChangelogPartition, float]:
    changelog = MemoryChangelogPartition()
    engine = open_engine(directory, changelog)
    with timed() as t:
        for i, doc in enumerate(docs):
            engine.add(f"doc{i:07d}", doc)
            if i % COMMIT_EVERY == COMMIT_EVERY - 1:
                engine.flush()
        engine.flush()
    return engine, changelog, t["seconds"]


# -- tantivy directly ----------------------------------------------------------------------------------


def tantivy_schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name="en_stem")
    builder.add_text_field("body")
    builder.add_text_field("module", stored=True, tokenizer_name="raw")
    builder.add_integer_field("year", stored=True, indexed=True, fast=True)
    builder.add_date_field("when", indexed=True)
    return builder.build()


def tantivy_doc(i: int, doc: dict[str, Any]) -> tantivy.Document:
    out = tantivy.Document()
    out.add_text("id", f"doc{i:07d}")
    out.add_text("title", doc["title"])
    out.add_text("body", doc["body"])
    out.add_text("module", doc["module"])
    out.add_integer("year", doc["year"])
    out.add_date("when", doc["when"])
    return out


def tantivy_index(directory: Path, docs: list[dict[str, Any]], commit_every: int | None) -> tuple[tantivy.Index, float]:
    directory.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(tantivy_schema(), path=str(directory))
    writer = index.writer(heap_size=WRITER_MEMORY, num_threads=1)
    with timed() as t:
        for i, doc in enumerate(docs):
            writer.add_document(tantivy_doc(i, doc))
            if commit_every and i % commit_every == commit_every - 1:
                writer.commit()
        writer.commit()
        index.reload()
    writer.wait_merging_threads()
    return index, t["seconds"]


def tantivy_search(index: tantivy.Index, searcher: tantivy.Searcher, query: str) -> list[tuple[str, float]]:
    parsed = index.parse_query(query, ["title", "body"])
    out = []
    for score, address in searcher.search(parsed, 10).hits:
        doc = searcher.doc(address)
        out.append((doc.get_first("id"), score))
    return out


def latencies(fn, queries: list[str]) -> tuple[float, float]:  # noqa: ANN001
    for q in queries[:20]:  # warm up
        fn(q)
    samples = []
    for q in queries:
        start = time.perf_counter()
        fn(q)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench search", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="20k documents instead of 100k")
    parser.add_argument("--docs", type=int, default=None)
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args(argv)
    n = args.docs or (20_000 if args.quick else 100_000)
    docs = make_docs(n)
    queries = make_queries(docs, args.queries)
    report = Report("search", params={"docs": n, "queries": len(queries), "commit_every": COMMIT_EVERY,
                                      "writer_memory": "128MB", "writer_threads": 1})
    root = Path(tempfile.mkdtemp(prefix="bench-search-"))
    try:
        # 1. indexing throughput, flush/commit every COMMIT_EVERY documents
        engine, changelog, engine_s = engine_index(root / "engine", docs)
        index, tantivy_s = tantivy_index(root / "tantivy", docs, COMMIT_EVERY)
        report.add("engine: add + flush", docs_per_s=n / engine_s, seconds=engine_s)
        report.add("tantivy direct: add_document + commit", docs_per_s=n / tantivy_s, seconds=tantivy_s)
        report.ratio("indexing docs/s: engine / tantivy direct", tantivy_s / engine_s, target=">= 0.5")

        # 2. query latency (top 10, ids and scores fetched) on the full index
        searcher = index.searcher()
        e50, e99 = latencies(lambda q: engine.search(q, 10), queries)
        t50, t99 = latencies(partial(tantivy_search, index, searcher), queries)
        report.add("engine: search top 10", p50_ms=e50, p99_ms=e99)
        report.add("tantivy direct: search top 10", p50_ms=t50, p99_ms=t99)
        report.ratio("query p50: engine / tantivy direct (lower is better)", e50 / t50, target="<= 2")
        report.ratio("query p99: engine / tantivy direct (lower is better)", e99 / t99, target="<= 2")
        same_ids = same_scores = 0
        for q in queries[:200]:
            mine = engine.search(q, 10)
            theirs = tantivy_search(index, searcher, q)
            same_ids += {h.doc_id for h in mine} == {d for d, _ in theirs}
            same_scores += [round(h.score, 4) for h in mine] == [round(sc, 4) for _, sc in theirs]
        report.notes.append(f"top-10 of 200 queries: same BM25 score lists for {same_scores}/200, same id sets "
                            f"for {same_ids}/200 (equal scores at the cut: the engine breaks ties by a hash "
                            "of the doc id, tantivy by segment order)")
        engine.close()
        del searcher, index

        # 3. restore time vs index size: bulk restore of the changelog vs tantivy bulk indexing
        records = list(changelog.read())
        for size in sorted({n // 10, n // 2, n}):
            target = root / f"restore-{size}"
            fresh = open_engine(target, MemoryChangelogPartition())
            with timed() as t:
                fresh.restore(records[:size])
                fresh.flush()
            fresh.close()
            _, bulk_s = tantivy_index(root / f"tantivy-bulk-{size}", docs[:size], None)
            report.add(f"engine: restore {size:,} docs + flush", docs_per_s=size / t["seconds"], seconds=t["seconds"])
            report.add(f"tantivy direct: bulk index {size:,} docs, one commit", docs_per_s=size / bulk_s,
                       seconds=bulk_s)
            report.ratio(f"restore {size:,}: engine / tantivy bulk (time, lower is better)", t["seconds"] / bulk_s,
                         target="<= 2")
            shutil.rmtree(target)
            shutil.rmtree(root / f"tantivy-bulk-{size}")
        # add-per-commit (what restore avoids), on a small slice
        small = records[:500]
        fresh = open_engine(root / "per-commit", MemoryChangelogPartition())
        with timed() as t:
            for record in small:
                fresh.add(record.key.decode(), json.loads(record.value))
                fresh.flush()
        fresh.close()
        per_commit_rate = len(small) / t["seconds"]
        restore_rate = n / next(r["seconds"] for r in reversed(report.rows) if r["system"].startswith("engine: restore"))
        report.add("engine: add + flush per document (500 docs)", docs_per_s=per_commit_rate, seconds=t["seconds"])
        report.ratio("restore docs/s / add-with-flush-per-doc docs/s", restore_rate / per_commit_rate, target=">= 10")
        report.notes.append("query latency: the engine loads each hit's stored document source (the whole "
                            "document, kept so get() can return it) and decodes its JSON; tantivy direct "
                            "only stores id/title/module/year")
        report.notes.append(f"peak RSS {peak_rss_mb():.0f} MiB; memory changelog (no disk I/O for the log)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.emit(args.json)
    return 0
