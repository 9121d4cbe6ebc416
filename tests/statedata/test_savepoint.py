"""Savepoints: taken while a standing job runs, each is consistent (every store at the one checkpoint
it records) and the job is not disturbed; read by pandas (pyarrow) from its files alone, it gives the
state reader's rows; any keys and values round-trip as bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st

from localstate import StreamTask, TaskTestDriver
from localstate.core.config import parse_job_config
from localstate.runtime.driver.views import committed_contents, load_checkpoints
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint, find_savepoints
from localstate.runtime.statedata.writer import take_savepoint

CORE = Path(__file__).resolve().parents[1] / "core"
sys.path.insert(0, str(CORE))
import crash_job  # noqa: E402
from toml_tables import toml_text  # noqa: E402 - tests/ is on sys.path (tests/conftest.py)


def test_savepoints_taken_while_a_standing_job_runs_are_consistent_and_the_job_is_undisturbed(tmp_path: Path) -> None:
    records = 60_000
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CORE), os.environ.get("PYTHONPATH", "")])}
    job = crash_job.job(str(tmp_path), 500)
    running = subprocess.Popen([sys.executable, str(CORE / "crash_job.py"), str(tmp_path), "run", str(records), "500"],
                               env=env, stdout=subprocess.PIPE, text=True)
    taken = []
    try:
        while running.poll() is None or not taken:
            if load_checkpoints(job)[0] is None:
                time.sleep(0.05)
                continue
            location = SavepointLocation({"url": str(tmp_path / f"sp{len(taken)}")})
            take_savepoint(job, location)
            taken.append(Savepoint.open(location))
    finally:
        out, _ = running.communicate(timeout=600)
    assert running.returncode == 0 and "done" in out  # the job ran to its end, undisturbed
    positions = set()
    for savepoint in taken:
        position = savepoint.manifest.checkpoints[0].inputs.get("input", 0)
        positions.add(position)
        per_key, per_bucket = crash_job.expected_state(position)
        assert decoded(savepoint, "per_key", job) == per_key
        assert decoded(savepoint, "per_bucket", job) == per_bucket
    # and the job's own final state is exact
    dump = tmp_path / "dump.json"
    subprocess.run([sys.executable, str(CORE / "crash_job.py"), str(tmp_path), "dump", str(dump)], env=env, check=True)
    per_key, _ = crash_job.expected_state(records)
    assert {k: v for k, v in json.loads(dump.read_text())["per_key"]} == per_key


def decoded(savepoint: Savepoint, store: str, job) -> dict:
    config = job.stores[store]
    key_serde, value_serde = (job.registry.serde(config.key_serde), job.registry.serde(config.value_serde))
    return {key_serde.deserialize(k): value_serde.deserialize(v) for k, v in savepoint.entries(store, 0)}


class Mixed(StreamTask):
    def init(self, context):
        self.stores = context.stores

    def process(self, envelope, collector, coordinator):
        key, value = envelope.key, envelope.value
        self.stores["names"].put(key, value)
        self.stores["numbers"].put(len(key), value["n"])
        self.stores["docs"].put(key, json.dumps(value).encode())


MIXED_STORES = {"names": {"engine": "kv", "key_serde": "string", "value_serde": "json"},
                "numbers": {"engine": "kv", "key_serde": "int", "value_serde": "int", "backend": "lmdb"},
                "docs": {"engine": "kv", "key_serde": "string", "value_serde": "bytes", "backend": "memory"}}


def mixed_job(root: Path, partitions: int = 3):
    return parse_job_config({"job": {"name": "mixed", "partitions": partitions, "task": "unused:Unused",
                                     "state_dir": str(root), "commit_interval": 10 ** 9},
                             "stores": MIXED_STORES},
                            base_dir=root)


def test_a_savepoint_read_by_pandas_from_its_files_alone_gives_the_state_readers_rows(tmp_path: Path) -> None:
    """pandas + pyarrow, nothing of localstate, on the Parquet files (DuckDB is not installed here;
    it reads the same Hive-partitioned Parquet). The rows are those the state reader's state view makes
    for each partition (its code path, without a Spark session)."""
    from localstate.runtime.spark.state_source import ReadOptions, Slice, load_view

    job = mixed_job(tmp_path)
    with TaskTestDriver(Mixed, job=job) as driver:
        for i in range(200):
            driver.send("events", f"key-{i % 37}-{'é' * (i % 3)}", {"n": i, "tags": ["a", i % 4]})
    write_job_toml(tmp_path / "job.toml", tmp_path)
    location = SavepointLocation({"url": str(tmp_path / "sp")})
    take_savepoint(job, location)
    for store, value_kind in (("names", "json"), ("numbers", "int")):
        frame = pd.read_parquet(tmp_path / "sp" / "stores" / store)  # Hive partitions: a 'partition' column
        frame["partition"] = frame["partition"].astype(int)
        saved = sorted(zip(frame["partition"], frame["key"], frame["value"]))
        view, resolved = load_view(ReadOptions.parse({"job": str(tmp_path / "job.toml"), "store": store}))
        rows = sorted(row for p in range(job.partitions) for row in view.rows(Slice(p, resolved.checkpoints[p])))
        assert saved == rows and len(rows) > 10


def write_job_toml(path: Path, root: Path) -> None:
    """The mixed job's file (without its commit interval): what the state reader is given."""
    path.write_text(toml_text({"job": {"name": "mixed", "partitions": 3, "task": "unused:Unused", "state_dir": root},
                               **{f"stores.{store}": options for store, options in MIXED_STORES.items()}}))


class Raw(StreamTask):
    def init(self, context):
        self.raw = context.store("raw")

    def process(self, envelope, collector, coordinator):
        if envelope.value is None:
            self.raw.delete(envelope.key)
        else:
            self.raw.put(envelope.key, envelope.value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.one_of(st.none(), st.binary(max_size=300))),
                max_size=60),
       st.integers(1, 4))
def test_any_keys_and_values_round_trip_through_a_savepoint(tmp_path_factory, writes, partitions) -> None:
    root = tmp_path_factory.mktemp("raw")
    job = parse_job_config({"job": {"name": "raw", "partitions": partitions, "task": "unused:Unused",
                                    "state_dir": str(root), "commit_interval": 10 ** 9},
                            "stores": {"raw": {"engine": "kv", "backend": "memory"}}}, base_dir=root)
    with TaskTestDriver(Raw, job=job) as driver:
        for key, value in writes:
            driver.send("events", key, value)
    location = SavepointLocation({"url": str(root / "sp")})
    take_savepoint(job, location)
    savepoint = Savepoint.open(location)
    checkpoints = load_checkpoints(job)
    for partition in range(partitions):
        assert savepoint.entries("raw", partition) == committed_contents(job, job.stores["raw"], partition,
                                                                          checkpoints[partition])
    assert find_savepoints(SavepointLocation({"url": str(root)})) == [("sp", True)]
