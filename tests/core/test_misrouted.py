"""Input partitioning checked (issue 43 item 7): a keyed record in an input partition other than the
one ``partition_for`` gives its key was counted in two stores, silently. Now each input that places
records by key (jsonl, file, kafka) checks it as records are read, per record and per column chunk
alike, under ``on_misrouted``: ``fail`` (MisroutedRecordError naming input, partition, offset, key
and the partition it belongs to), ``skip`` and ``dead_letter`` (counted as ``misrouted``), ``route``
(the TaskTestDriver only; ``localstate run`` refuses it at validate). The runtime's feed is driven
directly (``run_partition``), without Spark."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.file import FileChangelogSystem
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for, partitions_of
from localstate.core.stream import open_input, open_output
from localstate.core.task import StreamTask
from localstate.errors import ConfigError, InputError, MisroutedRecordError
from localstate.runtime.spark.affinity.kept import release_kept
from localstate.runtime.spark.runner import PartitionPlan, run_partition
from localstate.runtime.driver.views import committed_contents, store_config
from localstate.testing.driver import TaskTestDriver
from localstate.tools.cli import main

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
PARTITIONS = 3
KEYS = [f"user-{i}" for i in range(40)]


def _owned(partition: int) -> list[str]:
    return [key for key in KEYS if partition_for(key, PARTITIONS) == partition]


def _job(tmp: Path, system: str, task: str, **events: Any) -> Path:
    source = f'system = "{system}"\npath = "data"'
    extra = "".join(f"\n{name} = {json.dumps(value)}" for name, value in events.items())
    (tmp / "job.toml").write_text(f"""
[job]
name = "routing"
partitions = {PARTITIONS}
task = "poison_task:{task}"
state_dir = "state"
pythonpath = ["{HERE}"]

[inputs.events]
{source}{extra}

[outputs.out]
system = "file"
path = "out"

[outputs.dead]
system = "file"
path = "dead"

[stores.last]
engine = "kv"
key_serde = "json"
value_serde = "json"
""")
    return tmp / "job.toml"


def _write(tmp: Path, system: str, partition: int, keys: list[Any]) -> None:
    if system == "jsonl":
        (tmp / "data").mkdir(exist_ok=True)
        with open(tmp / "data" / f"{partition}.jsonl", "a") as handle:
            for i, key in enumerate(keys):
                handle.write(json.dumps({"key": key, "value": i, "ts": 1_700_000_000 + i}) + "\n")
        return
    logs = FileChangelogSystem({"path": str(tmp / "data")}, tmp)
    logs.ensure_stream("events", PARTITIONS)
    writer = logs.partition("events", partition)
    writer.append_many([(json.dumps(key).encode(), json.dumps({"n": i}).encode()) for i, key in enumerate(keys)])
    writer.flush()
    writer.close()


def _run(tmp: Path, system: str, task: str, partition: int, **events: Any) -> dict[str, Any]:
    job = load_job_config(_job(tmp, system, task, **events))
    end = open_input(job, "events").end_offset(partition)
    result = run_partition(job, PartitionPlan(batch=0, partition=partition, ranges={"events": (0, end)}, limit=None))
    release_kept()
    if "error" in result:
        return {"error": pickle.loads(result["error"])}
    checkpoint = Checkpoint(**result["checkpoint"])
    return {"in": result["in"], "skipped": result["skipped"], "dead": result["dead"], "counts": result["counts"],
            "state": sorted((json.loads(key) for key, _ in committed_contents(job, store_config(job, "last"), partition,
                                                                              checkpoint)), key=repr),
            "dead letters": list(open_output(job, "dead").read(partition))}


TASKS = ["KeepLast", "KeepLastBatch"]  # per record, and a batch task reading column chunks
SYSTEMS = ["jsonl", "file"]


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("task", TASKS)
def test_a_key_split_across_two_partitions_fails_naming_the_record(tmp_path: Path, system: str, task: str) -> None:
    mine, other = _owned(1), _owned(2)
    _write(tmp_path, system, 1, mine[:3] + [other[0]] + mine[3:5])
    error = _run(tmp_path, system, task, 1)["error"]
    assert isinstance(error, MisroutedRecordError) and isinstance(error, InputError)
    context = error.context
    assert (context["stream"], context["partition"], context["offset"], context["owner"]) == ("events", 1, 3, 2)
    assert context["key"] == repr(other[0]) and "on_misrouted" in error.hint


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_misrouted_records_are_skipped_or_dead_lettered_and_counted(tmp_path: Path, system: str, task: str,
                                                                    policy: str) -> None:
    mine, stray = _owned(0), _owned(1)[:2] + _owned(2)[:3]
    keys = [mine[0], stray[0], mine[1], stray[1], stray[2], mine[2], stray[3], stray[4]]
    _write(tmp_path, system, 0, keys)
    found = _run(tmp_path, system, task, 0, on_misrouted=policy, dead_letter="dead")
    assert found["in"] == len(keys) and found["state"] == sorted(mine[:3], key=repr)
    assert found["counts"] == {"misrouted": {"events": 5}}
    if policy == "skip":
        assert found["skipped"] == 5 and found["dead letters"] == []
    else:
        assert found["dead"] == 5
        dead = [value for _, value in found["dead letters"]]
        assert [d["offset"] for d in dead] == [1, 3, 4, 6, 7]
        assert all("misrouted" in d["error"] and json.loads(d["raw"])["key"] in stray for d in dead)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.one_of(st.sampled_from(KEYS), st.integers(-5, 5), st.lists(st.integers(0, 3), max_size=2)),
                     min_size=1, max_size=60),
       partition=st.integers(0, PARTITIONS - 1), task=st.sampled_from(TASKS))
def test_exactly_the_misrouted_records_are_found_on_every_read_path(tmp_path_factory: Any, keys: list[Any],
                                                                     partition: int, task: str) -> None:
    tmp = tmp_path_factory.mktemp("routing")
    _write(tmp, "jsonl", partition, keys)
    found = _run(tmp, "jsonl", task, partition, on_misrouted="dead_letter", dead_letter="dead")
    expected = [i for i, key in enumerate(keys) if partition_for(key, PARTITIONS) != partition]
    assert sorted(value["offset"] for _, value in found["dead letters"]) == expected
    assert found["counts"] == ({"misrouted": {"events": len(expected)}} if expected else {})


def test_route_is_refused_by_localstate_run_at_validate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job_file = _job(tmp_path, "jsonl", "KeepLast", on_misrouted="route")
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError) as caught:
        open_input(load_job_config(job_file), "events")
    assert caught.value.problems[0].path == "inputs.events.on_misrouted" and "TaskTestDriver" in str(caught.value)
    assert main(["validate", str(job_file)]) != 0
    assert "inputs.events.on_misrouted" in capsys.readouterr().err


def test_dead_letter_needs_the_output(tmp_path: Path) -> None:
    job_file = _job(tmp_path, "jsonl", "KeepLast", on_misrouted="dead_letter")
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError) as caught:
        open_input(load_job_config(job_file), "events")
    assert caught.value.problems[0].path == "inputs.events.dead_letter"


def test_one_job_partition_has_nothing_to_check(tmp_path: Path) -> None:
    from localstate.core.routing import RoutingCheck

    (tmp_path / "data").mkdir()
    text = _job(tmp_path, "jsonl", "KeepLast").read_text().replace(f"partitions = {PARTITIONS}", "partitions = 1")
    (tmp_path / "job.toml").write_text(text)
    assert RoutingCheck.of(open_input(load_job_config(tmp_path / "job.toml"), "events"), 0) is None


def test_partitions_of_agrees_with_partition_for() -> None:
    import pyarrow as pa

    keys = KEYS + [str(i) for i in range(50)]
    assert partitions_of(keys, 7) == [partition_for(key, 7) for key in keys]
    assert partitions_of(pa.array(keys), 7).to_pylist() == [partition_for(key, 7) for key in keys]
    assert partitions_of(pa.array(list(range(-20, 20))), 5).to_pylist() == [partition_for(k, 5) for k in range(-20, 20)]
    odd = [[1, 2], {"a": 1}, None, True, 2.5]
    assert partitions_of(odd, 4) == [partition_for(key, 4) for key in odd]


class _Keep(StreamTask):
    def init(self, context: Any) -> None:
        self.seen = context.kv("seen")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.seen.put(envelope.key, envelope.partition)


def _driver(**policy: Any) -> TaskTestDriver:
    driver = TaskTestDriver(_Keep, partitions=PARTITIONS,
                            stores={"seen": {"engine": "kv", "key_serde": "string", "value_serde": "int"}})
    if policy:
        driver.declare_input("events", **policy)
    return driver


def test_the_driver_fails_a_record_sent_to_another_partition_by_default() -> None:
    key = _owned(2)[0]
    with _driver() as driver:
        driver.send("events", _owned(0)[0], 1, partition=0)
        with pytest.raises(MisroutedRecordError) as caught:
            driver.send("events", key, 1, partition=0)
        assert caught.value.context["owner"] == 2 and caught.value.context["partition"] == 0


def test_the_driver_routes_a_record_to_the_partition_of_its_key() -> None:
    key = _owned(2)[0]
    with _driver(on_misrouted="route") as driver:
        sent = driver.send("events", key, 1, partition=0)
        driver.send_batch("events", [key, _owned(1)[0]], [2, 3], partition=0)
        driver.send_rows([("events", key, 4, None)], partition=1)
        assert sent.partition == 2
        assert driver.store("seen", 2).get(key) == 2 and driver.store("seen", 0).get(key) is None
        assert driver.store("seen", 1).get(_owned(1)[0]) == 1
        driver.commit()
        driver.crash()
        driver.restart()
        assert driver.store("seen", 2).get(key) == 2


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_the_driver_skips_or_dead_letters_and_counts(policy: str) -> None:
    with _driver(on_misrouted=policy, dead_letter="bad" if policy == "dead_letter" else "") as driver:
        driver.send("events", _owned(2)[0], 1, partition=0)
        driver.send("events", _owned(0)[0], 1, partition=0)
        driver.commit()
        assert driver.counts() == {"misrouted": {"events": 1}}
        assert len(driver.outputs("bad")) == (1 if policy == "dead_letter" else 0)
        assert [key for key, _ in driver.store("seen", 0).all()] == [_owned(0)[0]]


@pytest.mark.parametrize("task", TASKS)
def test_allow_processes_every_record_where_it_is_unchecked(tmp_path: Path, task: str) -> None:
    """An input whose keys are not what the task keeps state by: ``allow`` (as before the check)."""
    keys = _owned(0)[:2] + _owned(1)[:2] + _owned(2)[:2]
    _write(tmp_path, "jsonl", 0, keys)
    found = _run(tmp_path, "jsonl", task, 0, on_misrouted="allow")
    assert found["in"] == 6 and found["state"] == sorted(keys, key=repr) and found["counts"] == {}


def test_the_driver_allows_a_record_where_it_was_sent() -> None:
    with _driver(on_misrouted="allow") as driver:
        driver.send("events", _owned(2)[0], 1, partition=0)
        assert driver.store("seen", 0).get(_owned(2)[0]) == 0
