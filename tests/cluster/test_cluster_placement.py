"""Where a partition's warm local state lives, as the driver records it, without Spark.

Each committed checkpoint of a cluster run names the *home* of the attempt that committed it (an id
of the executor host's local store directory, :func:`local_home`); a restarted driver places each
partition on an executor with that home. The record is a hint: a damaged or hostile home reads as
"unknown" (never a refused checkpoint, never a traceback), a home no live executor has leaves the
partition to the least-loaded executor, and whether local state is used stays the attempt markers'
decision (tests/cluster/test_cluster_local_state.py). The restarts themselves, warm, are in
tests/cluster/test_cluster_restarts.py.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import write_job  # noqa: E402

from localstate.core.checkpoint import Checkpoint, CheckpointStore  # noqa: E402
from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.spark.cluster import Placement, assign_executors, local_home  # noqa: E402
from localstate.runtime.spark.runner import SparkJobRunner, run_partition  # noqa: E402

pytestmark = [pytest.mark.cluster]

HOME = "0123456789abcdef0123456789abcdef"
GOOD = {"format": 1, "partition": 0, "generation": 3, "inputs": {"in": 7}, "changelogs": {"counts": 12},
        "attempt": "ab12", "home": HOME}

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)


def _with_home(value: object) -> Checkpoint:
    return Checkpoint.from_json(json.dumps({**GOOD, "home": value}), "/state/job/checkpoints/0.json")


# -- the record: a field of the checkpoint, validated as a hint ---------------------------------------

def test_home_round_trips_and_is_left_out_when_unknown() -> None:
    checkpoint = Checkpoint.from_json(json.dumps(GOOD), "0.json")
    assert checkpoint.home == HOME and checkpoint.attempt == "ab12"
    assert Checkpoint.from_json(checkpoint.to_json(), "0.json") == checkpoint
    plain = Checkpoint(0, 1, {"in": 7}, {"counts": 12})
    assert plain.home is None and "home" not in json.loads(plain.to_json())  # as every older checkpoint


@pytest.mark.parametrize("value", [
    None, 7, 1.5, True, False, [HOME], {"home": HOME}, "", " ", HOME.upper(), HOME + "0" * 33, "0" * 65,
    "../../etc/passwd", "/abs/path", "host-a", "12 34", "ab\x00cd", "ab\ncd", "\u00e9\u00e9", "x" * 10_000,
    "0x1f", "-1", "deadbeef ", "1.5e9",
])
def test_a_damaged_or_hostile_home_reads_as_unknown(value: object) -> None:
    checkpoint = _with_home(value)
    assert checkpoint.home is None
    # Everything that decides correctness is read as written.
    assert (checkpoint.generation, checkpoint.inputs, checkpoint.changelogs, checkpoint.attempt) == \
        (3, {"in": 7}, {"counts": 12}, "ab12")


@settings(max_examples=100, deadline=None)
@given(value=json_values)
def test_any_json_value_as_home_is_a_home_id_or_unknown(value: object) -> None:
    home = _with_home(value).home
    valid = isinstance(value, str) and 0 < len(value) <= 64 and set(value) <= set("0123456789abcdef")
    assert home == (value if valid else None)


def test_a_checkpoint_file_with_a_damaged_home_loads(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    (tmp_path / "0.json").write_text(json.dumps({**GOOD, "home": {"nested": ["x" * 300]}}))
    loaded = store.load(0)
    assert loaded is not None and loaded.home is None and loaded.changelogs == {"counts": 12}


# -- the home of an executor host ------------------------------------------------------------------

def test_local_home_names_the_local_store_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stable = load_job_config(write_job(tmp_path / "stable", "spark://127.0.0.1:7077", state_dir=tmp_path / "state",
                                       local_dir="${LOCALSTATE_TEST_HOST_DIR}"))
    default = load_job_config(write_job(tmp_path / "default", "spark://127.0.0.1:7077", state_dir=tmp_path / "state"))
    homes = {}
    for host in ("a", "b"):
        monkeypatch.setenv("LOCALSTATE_TEST_HOST_DIR", str(tmp_path / host))
        for executor in ("1", "2"):  # two executors (Spark local directories) on one host
            monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / host / f"executor-{executor}"))
            homes[("stable", host, executor)] = local_home(stable)
            homes[("default", host, executor)] = local_home(default)
    assert all(Checkpoint(0, home=h).home == h and Checkpoint.from_json(Checkpoint(0, home=h).to_json(), "x").home == h
               for h in homes.values())  # a valid home id
    # With a stable local_dir, a host's executors share its home; hosts differ.
    assert homes[("stable", "a", "1")] == homes[("stable", "a", "2")] != homes[("stable", "b", "1")]
    # With Spark's per-executor local directory, every executor has its own.
    assert len({homes[("default", h, e)] for h in "ab" for e in "12"}) == 4


def test_a_task_on_a_cluster_reports_its_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = load_job_config(write_job(tmp_path / "job", "spark://127.0.0.1:7077", state_dir=tmp_path / "state",
                                    local_dir="${LOCALSTATE_TEST_HOST_DIR}"))
    runner = SparkJobRunner(job, context=object(), batch_size=600, progress=None)
    runner.planner.initial_checkpoints()
    plans, _ = runner.plan(0)
    homes = set()
    for host, plan in zip(("a", "b"), plans):
        monkeypatch.setenv("LOCALSTATE_TEST_HOST_DIR", str(tmp_path / host))
        result = run_partition(job, plan)
        assert "error" not in result and result["home"] == local_home(job)
        homes.add(result["home"])
    assert len(homes) == 2


def test_the_driver_places_by_the_homes_of_committed_state_only(tmp_path: Path) -> None:
    """Homes are wanted for the planned partitions whose checkpoint has state and a valid home: not for
    a partition without state, nor one whose home is damaged (unknown) or absent."""
    job = load_job_config(write_job(tmp_path / "job", "spark://127.0.0.1:7077", state_dir=tmp_path / "state",
                                    local_dir="${LOCALSTATE_TEST_HOST_DIR}"))
    runner = SparkJobRunner(job, context=object(), batch_size=600, progress=None)
    runner.planner.initial_checkpoints()
    store = runner.checkpoints
    homes = {0: "a" * 32, 1: "b" * 32, 2: "NOT-HEX", 3: None}
    for partition, home in homes.items():
        committed = store.load(partition)
        assert committed is not None
        state = {"counts": 5} if partition != 1 else {}
        data = {**json.loads(committed.to_json()), "generation": 1, "changelogs": state, "home": home}
        (store.root / f"{partition}.json").write_text(json.dumps(data))
    runner.plan(0)
    assert runner.planner.homes == {0: "a" * 32}


# -- placing partitions on their homes ------------------------------------------------------------

def test_a_restart_places_every_partition_on_its_home() -> None:
    alive = {"0": "10.0.0.1", "1": "10.0.0.2"}
    holders = {0: ["1"], 1: ["0"], 2: ["1"], 3: ["0"]}
    assert assign_executors(range(4), alive, holders) == {0: ("1", "10.0.0.2"), 1: ("0", "10.0.0.1"),
                                                         2: ("1", "10.0.0.2"), 3: ("0", "10.0.0.1")}


def test_homes_of_gone_or_unknown_hosts_leave_partitions_to_the_least_loaded() -> None:
    alive = {"5": "h5", "6": "h6"}
    assigned = assign_executors(range(4), alive, {0: ["1"], 1: ["2"], 2: [], 3: ["9", "5"]})
    assert assigned[3] == ("5", "h5")
    assert sorted(executor for executor, _ in assigned.values()) == ["5", "5", "6", "6"]


def test_a_partition_count_change_places_new_partitions_and_ignores_old_homes() -> None:
    alive = {"0": "h0", "1": "h1"}
    holders = {0: ["0"], 1: ["1"], 2: ["0"], 3: ["1"]}  # recorded by a 4-partition job
    assert set(assign_executors(range(2), alive, holders)) == {0, 1}  # now 2: the others are not placed
    grown = assign_executors(range(6), alive, holders)  # now 6: 4 and 5 have no home
    assert [grown[p][0] for p in range(4)] == ["0", "1", "0", "1"]
    assert sorted(executor for executor, _ in grown.values()) == ["0", "0", "0", "1", "1", "1"]


def test_no_live_executor_leaves_placement_to_spark() -> None:
    assert assign_executors(range(3), {}, {0: ["0"]}) == {}


@settings(max_examples=100, deadline=None)
@given(planned=st.lists(st.integers(0, 40), unique=True, max_size=20),
       alive=st.dictionaries(st.sampled_from("0123456789"), st.sampled_from(["h1", "h2", "h3"]), max_size=6),
       holders=st.dictionaries(st.integers(0, 45), st.lists(st.sampled_from("0123456789xyz"), max_size=4)),
       data=st.data())
def test_partitions_go_to_live_executors_owning_a_fair_share(planned: list[int], alive: dict[str, str],
                                                             holders: dict[int, list[str]],
                                                             data: st.DataObject) -> None:
    assigned = assign_executors(planned, alive, holders)
    if not alive:
        assert assigned == {}
        return
    assert set(assigned) == set(planned)
    assert all(alive.get(executor) == host for executor, host in assigned.values())
    # Every partition that has state somewhere alive, and every planned one, placed at once: ownership.
    held = sorted(p for p, executors in holders.items() if any(e in alive for e in executors))
    everything = sorted(set(held) | set(planned))
    full = assign_executors(everything, alive, holders)
    share = -(-len(everything) // len(alive))
    owned = Counter(executor for executor, _ in full.values())
    assert max(owned.values(), default=0) <= share
    # A partition is owned away from its live holders only if each of them owns a full share.
    for partition in everything:
        live = [e for e in holders.get(partition, []) if e in alive]
        if live and full[partition][0] not in live:
            assert all(owned[e] == share for e in live), (partition, live, full)
    # Any batch of partitions with state runs each where it is owned: a sparse batch moves nothing.
    owners = assign_executors(held, alive, holders)
    batch = data.draw(st.lists(st.sampled_from(held), unique=True) if held else st.just([]))
    assert assign_executors(batch, alive, holders) == {p: owners[p] for p in batch}


def test_holders_are_the_live_executors_with_the_wanted_home() -> None:
    placement = Placement(None)
    placement.executor_homes = {"0": "a" * 32, "1": "b" * 32, "2": "a" * 32, "7": "c" * 32}
    alive = {"0": "h0", "1": "h1", "2": "h0"}  # "7" is gone
    wanted = {0: "a" * 32, 1: "b" * 32, 2: "c" * 32, 3: "d" * 32}
    assert placement.holders(wanted, alive) == {0: ["0", "2"], 1: ["1"]}
    assert set(assign_executors([0, 1, 2, 3], alive, placement.holders(wanted, alive))) == {0, 1, 2, 3}


def test_a_sparse_batch_runs_where_its_partitions_are_owned() -> None:
    """Two partitions of one executor in a batch of their own both stay there (warm), rather than
    one moving for the batch's parallelism (and being rebuilt)."""
    holders = {0: ["0"], 1: ["1"], 2: ["0"], 3: ["1"]}
    assert assign_executors([0, 2], {"0": "h0", "1": "h1"}, holders) == {0: ("0", "h0"), 2: ("0", "h0")}


def test_a_host_with_too_many_homes_keeps_its_share() -> None:
    """Every partition's home on one host (the other host came back empty): the excess moves."""
    assigned = assign_executors(range(4), {"0": "h0", "1": "h1"}, {p: ["0"] for p in range(4)})
    assert [assigned[p][0] for p in range(4)] == ["0", "0", "1", "1"]
