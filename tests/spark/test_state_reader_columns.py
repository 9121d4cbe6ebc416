"""The state reader's typed columns for every engine that offers them (heap top-N and reorder buffer,
the three sketch kinds, search): after a real run on Spark, and after a crash that left uncommitted
changelog records behind, each row equals what the store's engine holds at the committed checkpoint
(the engine's own query API, on a TaskInstance recovered to that checkpoint)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import localstate.spark
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from typed_state_task import TypedState  # noqa: E402

from .test_state_reader import flush_without_checkpoint, reader_job_head, run_in_two_batches  # noqa: E402

PARTITIONS = 2
USERS = [f"user-{i:02d}" for i in range(9)]
JOB = reader_job_head("typed", PARTITIONS, "typed_state_task:TypedState", "events") + """[stores.top]
engine = "heap"
key_serde = "string"
value_serde = "json"
capacity = 6

[stores.buffer]
engine = "heap"
kind = "reorder"
value_serde = "json"

[stores.visitors]
engine = "sketch"
kind = "hll"
key_serde = "string"
precision = 8

[stores.seen]
engine = "sketch"
kind = "bloom"
key_serde = "string"
capacity = 500

[stores.latency]
engine = "sketch"
kind = "quantiles"
key_serde = "string"
k = 16

[stores.docs]
engine = "search"
key_serde = "string"

[stores.docs.fields]
title = { type = "text", stored = true }
views = { type = "int" }
ratio = { type = "float" }
at = { type = "date" }
tags = { type = "string" }
"""
STORES = ("top", "buffer", "visitors", "seen", "latency", "docs")


def events(partition: int, start: int, n: int) -> list[tuple[str, dict]]:
    return [(USERS[(i * 4 + partition) % len(USERS)], {"i": i}) for i in range(start, start + n)]


def read_all(spark, job_file: Path) -> dict[str, list]:
    return {store: sorted((r.asDict() for r in localstate.spark.read_state(spark, job_file, store=store).collect()),
                          key=lambda r: json.dumps(r, default=str, sort_keys=True))
            for store in STORES}


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


@pytest.fixture(scope="module")
def typed_run(tmp_path_factory, spark, spark_context):
    """A run on Spark (2 batches), the reader's rows after it; then 7 more records per partition
    flushed to the changelogs but never checkpointed (a crash), the reader's rows after that."""
    root = tmp_path_factory.mktemp("reader-typed")
    (root / "job.toml").write_text(JOB)
    shutil.copy(HERE / "typed_state_task.py", root)
    job = run_in_two_batches(spark_context, root / "job.toml", events, 40, batch_size=25)
    after_run = read_all(spark, root / "job.toml")
    flush_without_checkpoint(job, TypedState, "events", events, 40, 7)
    changelogs = localstate.spark.read_state(spark, root / "job.toml", view="changelog").collect()
    # records after the checkpoint (a Bloom filter or HLL that saw the same users again may not change)
    assert {r["store"] for r in changelogs if r["uncommitted"]} >= {"top", "buffer", "latency", "docs"}
    after_crash = read_all(spark, root / "job.toml")
    return root / "job.toml", after_run, after_crash


def engines_at_checkpoint(job_file: Path) -> dict[int, dict]:
    """Each partition's engines, recovered to the checkpoint (the uncommitted tail trimmed), asked
    through their own query API for what the reader's columns show."""
    from datasketch import HyperLogLog as DatasketchHLL

    from localstate.engines.sketch.columns import QUANTILE_RANKS

    job = load_job_config(job_file)
    system = open_changelog_system(job)
    found: dict[int, dict] = {}
    for p in range(PARTITIONS):
        instance = TaskInstance(job, p, system, task_factory=TypedState)
        instance.open()
        engine = {name: store.engine for name, store in instance.stores.items()}
        users = sorted({u for part in range(PARTITIONS) for u, _ in events(part, 0, 40)})
        hll = engine["visitors"]
        found[p] = {
            "top": sorted([(e.item, e.score, e.payload) for e in engine["top"]], key=repr),
            "buffer": [(float(e.timestamp), e.event) for e in engine["buffer"]],
            "visitors": {name: (hll.count(name), hll.to_datasketch(name).reg.tolist()) for name in hll.names()},
            "seen": {name: engine["seen"].estimated_count(name) for name in engine["seen"].names()},
            "latency": {name: (engine["latency"].count(name),
                               engine["latency"].quantiles(name, QUANTILE_RANKS).tolist(),
                               engine["latency"].serialized(name)) for name in engine["latency"].names()},
            "docs": {u: engine["docs"].get(u) for u in users if engine["docs"].get(u) is not None},
        }
        instance.close(commit=False)
    system.close()
    found["datasketch"] = DatasketchHLL
    return found


def test_typed_columns_equal_the_engines_after_a_run_and_a_crash(typed_run):
    job_file, after_run, after_crash = typed_run
    assert after_crash == after_run  # the uncommitted tail is not read
    rows = after_run
    expected = engines_at_checkpoint(job_file)
    datasketch = expected.pop("datasketch")
    for p in range(PARTITIONS):
        mine = {store: [r for r in rows[store] if r["partition"] == p] for store in STORES}
        want = expected[p]
        assert sorted([(r["item"], r["score"], r["payload"] and json.loads(r["payload"])) for r in mine["top"]],
                      key=repr) == want["top"]
        assert len(mine["top"]) == 6  # the capacity
        buffer = sorted(mine["buffer"], key=lambda r: (r["timestamp"], r["seq"]))
        assert [(r["timestamp"], json.loads(r["event"])) for r in buffer] == want["buffer"] != []
        assert {r["name"]: (r["estimate"], datasketch.deserialize(bytes(r["sketch"])).reg.tolist())
                for r in mine["visitors"]} == want["visitors"]
        assert {r["kind"] for r in mine["visitors"]} == {"hll"} and len(want["visitors"]) == 3
        assert {r["name"]: r["estimate"] for r in mine["seen"]} == want["seen"] != {}
        assert {r["kind"] for r in mine["seen"]} == {"bloom"} and all(r["bits_set"] > 0 for r in mine["seen"])
        assert {r["name"]: (r["count"], r["quantiles"], bytes(r["sketch"])) for r in mine["latency"]} \
            == want["latency"] != {}
        docs = {r["doc_id"]: r for r in mine["docs"]}
        assert set(docs) == set(want["docs"]) != set()
        for doc_id, held in want["docs"].items():
            row = docs[doc_id]
            assert json.loads(row["document"])["title"] == held["title"] == row["title"]
            assert (row["views"], row["ratio"]) == (held["views"], held["ratio"])
            assert row["at"].timestamp() == held["at"].timestamp()
            assert row["tags"] == (held["tags"] if isinstance(held["tags"], str) else None)
            assert json.loads(row["document"])["tags"] == held["tags"]


def test_typed_schemas_and_raw_bytes(spark, typed_run):
    job_file = typed_run[0]
    schemas = {store: localstate.spark.read_state(spark, job_file, store=store).schema.simpleString()
               for store in STORES}
    assert schemas == {
        "top": "struct<partition:int,item:string,score:double,payload:string>",
        "buffer": "struct<partition:int,timestamp:double,seq:bigint,event:string>",
        "visitors": "struct<partition:int,name:string,kind:string,estimate:double,sketch:binary>",
        "seen": "struct<partition:int,name:string,kind:string,estimate:double,bits_set:bigint>",
        "latency": "struct<partition:int,name:string,kind:string,count:bigint,quantiles:array<double>,"
                   "sketch:binary>",
        "docs": "struct<partition:int,doc_id:string,title:string,views:bigint,ratio:double,at:timestamp,"
                "tags:string,document:string>",
    }
    raw = localstate.spark.read_state(spark, job_file, store="top", raw=True)
    assert raw.columns == ["partition", "key_bytes", "value_bytes"]
    assert raw.count() == 6 * PARTITIONS
