"""Checkpoints in the ``objectstore`` (ObjectCheckpoints): a save is three storage requests (the
generation check's listing, the PUT, the delete of the oldest), and what that saves — the read-back
of this instance's own checkpoint, a second listing — never hides another instance's checkpoint:
the generation check still fences a stale instance. On a shared directory and on SeaweedFS S3."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.storage import ObjectStore
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.errors import FencedError


class CountingStore(ObjectStore):
    """The system's object store, counting its requests by kind (``requests``) and logging each as
    ``(kind, key or prefix)`` (``log``)."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store.fs, store.base, store.url, store.spec)
        self.requests: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []

    def _count(self, kind: str, key: str) -> None:
        self.requests[kind] += 1
        self.log.append((kind, key))

    def on(self, prefix: str) -> Counter[str]:
        """The logged requests on keys below ``prefix``, by kind."""
        return Counter(kind for kind, key in self.log if key.startswith(prefix))

    def put(self, key: str, data: Any) -> None:
        self._count("put", key)
        super().put(key, data)

    def get(self, key: str) -> bytes:
        self._count("get", key)
        return super().get(key)

    def list(self, prefix: str):
        self._count("list", prefix)
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self._count("delete", key)
        super().delete(key)


def checkpoints(options: dict, root: Path, name: str) -> tuple[CheckpointStore, CountingStore]:
    """A CheckpointStore of job ``j`` on the objectstore of ``options``, as one instance holds it."""
    system = ObjectStoreChangelogSystem(options, root)
    objects = system.checkpoint_objects("j")
    objects.store = counting = CountingStore(system.store)
    return CheckpointStore(root / name, objects=objects), counting


def test_a_save_is_three_requests_and_reads_back_as_saved(objectstore_options, tmp_path):
    store, counting = checkpoints(objectstore_options, tmp_path, "a")
    keep = store.objects.keep
    for number in range(keep + 3):
        counting.requests.clear()
        store.save(Checkpoint(0, generation=1, inputs={"in": number}), expect_generation=1)
        deletes = 1 if number >= keep else 0  # the oldest goes once `keep` are stored
        assert counting.requests == Counter({"list": 1, "put": 1, **({"delete": 1} if deletes else {})}), number
    assert store.load(0).inputs == {"in": keep + 2}
    fresh, fresh_counting = checkpoints(objectstore_options, tmp_path, "b")  # another process reads it from storage
    assert fresh.load(0).inputs == {"in": keep + 2} and fresh_counting.requests["get"] == 1
    assert len(store.objects.store.list("jobs/j/checkpoints/0")) == keep


def test_another_instances_newer_checkpoint_still_fences_this_one(objectstore_options, tmp_path):
    old, _ = checkpoints(objectstore_options, tmp_path, "old")
    new, _ = checkpoints(objectstore_options, tmp_path, "new")
    for number in range(3):
        old.save(Checkpoint(0, generation=1, inputs={"in": number}), expect_generation=1)
    assert new.load(0).inputs == {"in": 2}
    new.save(Checkpoint(0, generation=2, inputs={"in": 2}), expect_generation=1)  # takes the partition over
    with pytest.raises(FencedError, match="taken over by generation 2"):
        old.save(Checkpoint(0, generation=1, inputs={"in": 3}), expect_generation=1)
    assert old.load(0).generation == 2  # what the old instance reads is the newer one, not its own last save
    new.save(Checkpoint(0, generation=2, inputs={"in": 5}), expect_generation=2)
    assert checkpoints(objectstore_options, tmp_path, "reader")[0].load(0).inputs == {"in": 5}
