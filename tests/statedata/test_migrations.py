"""Migrations: a Python function per store over (key, value) -> (key, value) or None, applied to a
savepoint's records on the way in; with new serdes the values are decoded and encoded again. A
record given a new key goes to the partition of its new key, with or without a rescale. The
function of the guide (docs/snippets/state_as_data/migrate.py) is the one tested."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from localstate import StreamTask, TaskTestDriver
from localstate.core.config import parse_job_config
from localstate.core.partitioner import partition_for
from localstate.errors import SavepointMismatchError, SerdeError
from localstate.runtime.layout import resolve_epoch
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.writer import take_savepoint

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "state_as_data"
sys.path.insert(0, str(SNIPPETS))
from migrate import counts_v2  # noqa: E402

USERS = ["Alice", "bob", "Carol", "bot-1", "bot-22", "dave", "Erin", "frank", "GRACE", "heidi"]


class Clicks(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def clicks_job(root: Path, partitions: int, value_serde: str = "int"):
    return parse_job_config({"job": {"name": "clicks", "partitions": partitions, "task": "unused:Unused",
                                     "state_dir": str(root), "commit_interval": 10 ** 9},
                             "stores": {"counts": {"engine": "kv", "backend": "memory", "key_serde": "string",
                                                   "value_serde": value_serde}}}, base_dir=root)


def saved(root: Path) -> tuple[Savepoint, dict[str, int]]:
    job = clicks_job(root, 2)
    counts: dict[str, int] = {}
    with TaskTestDriver(Clicks, job=job) as driver:
        for i in range(70):
            user = USERS[(i * 3) % len(USERS)]
            driver.send("clicks", user, i)
            counts[user] = counts.get(user, 0) + 1
    location = SavepointLocation({"url": str(root / "sp")})
    take_savepoint(job, location)
    return Savepoint.open(location), counts


def contents(job) -> dict[str, object]:
    job = resolve_epoch(job)
    found = {}
    with TaskTestDriver(Clicks, job=job) as driver:
        for partition in range(job.partitions):
            for key, value in driver.store("counts", partition).all():
                assert partition_for(key, job.partitions) == partition  # where its future records go
                found[key] = value
    return found


@pytest.mark.parametrize("partitions", [2, 3, 1])
def test_a_migration_transforms_renames_and_drops_records_on_the_way_in(tmp_path: Path, partitions: int) -> None:
    savepoint, counts = saved(tmp_path)
    target = clicks_job(tmp_path, partitions, value_serde="json")
    load_savepoint(savepoint, target, LoadOptions(yes=True, migrations={"counts": counts_v2}))
    expected = {}
    for key, value in counts.items():
        migrated = counts_v2(key, value)
        if migrated is not None:
            expected[migrated[0]] = migrated[1]
    assert contents(target) == expected


def test_new_serdes_without_a_migration_decode_and_encode_the_values_again(tmp_path: Path) -> None:
    savepoint, counts = saved(tmp_path)
    target = clicks_job(tmp_path, 3, value_serde="json")
    load_savepoint(savepoint, target, LoadOptions(yes=True))
    assert contents(target) == counts


def test_a_value_the_new_serde_cannot_encode_is_a_typed_error_and_nothing_switches(tmp_path: Path) -> None:
    savepoint, counts = saved(tmp_path)
    target = clicks_job(tmp_path, 2, value_serde="string")  # an int does not encode as a string
    with pytest.raises(SerdeError) as caught:
        load_savepoint(savepoint, target, LoadOptions(yes=True))
    assert caught.value.context["store"] == "counts" and "migration" in caught.value.hint
    assert contents(clicks_job(tmp_path, 2)) == counts


def test_a_migration_for_a_store_the_savepoint_does_not_hold_is_refused(tmp_path: Path) -> None:
    savepoint, _ = saved(tmp_path)
    with pytest.raises(SavepointMismatchError):
        load_savepoint(savepoint, clicks_job(tmp_path, 2), LoadOptions(yes=True, migrations={"views": counts_v2}))
