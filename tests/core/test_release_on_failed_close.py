"""A store whose close() fails (a full disk, say) does not keep the instance's other locks (issue
#37): TaskInstance.abandon and close release every changelog partition's writer lock and the
partition lock whatever fails, and raise the first error."""

from __future__ import annotations

import errno

import pytest

from localstate.core.config import parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.task import Envelope, StreamTask
from localstate.engines.kv.engine import KeyValueEngine
from localstate.runtime.partition.instance import TaskInstance
from localstate.errors import ChangelogError, StoreIOError

STORES = ("a", "b", "c")


class PutAll(StreamTask):
    def init(self, context):
        self.stores = [context.store(name) for name in STORES]

    def process(self, envelope, collector, coordinator):
        for store in self.stores:
            store.put(envelope.key, envelope.value)


@pytest.fixture
def job(tmp_path):
    stores = {name: {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"}
              for name in STORES}
    return parse_job_config({"job": {"name": "j", "task": "m:T"}, "stores": stores}, base_dir=tmp_path)


@pytest.fixture
def failing_close(monkeypatch):
    """Stores ``a`` and ``c`` fail to close (``a`` first): each raises its own error, as a store on a
    full disk would, before closing anything."""
    real = KeyValueEngine.close
    errors = {"a": StoreIOError("no space left on device closing a", errno=errno.ENOSPC, store="a"),
              "c": StoreIOError("no space left on device closing c", errno=errno.ENOSPC, store="c")}

    def close(self):
        error = errors.pop(self.context.store, None)
        if error is not None:
            raise error
        real(self)

    monkeypatch.setattr(KeyValueEngine, "close", close)
    return errors


def _open(job) -> TaskInstance:
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=PutAll)
    instance.open()
    instance.process(Envelope("in", 0, 0, "k", 1))
    return instance


def _assert_everything_released(job) -> None:
    """Every changelog partition of the instance opens for writing again, in this process, and a new
    instance of the partition opens (the partition lock is free)."""
    system = open_changelog_system(job)
    try:
        for store in job.stores.values():
            writer = system.partition(store.changelog, 0)  # raises "already open for writing" if held
            writer.close()
    finally:
        system.close()
    again = TaskInstance(job, 0, open_changelog_system(job), task_factory=PutAll)
    again.open()
    again.abandon()


def test_abandon_releases_every_lock_when_stores_fail_to_close_and_raises_the_first_error(job, failing_close):
    first = failing_close["a"]
    instance = _open(job)
    with pytest.raises(StoreIOError) as info:
        instance.abandon()
    assert info.value is first
    assert instance.stores == {}
    _assert_everything_released(job)


def test_close_after_a_commit_releases_every_lock_and_raises_the_first_store_error(job, failing_close):
    first = failing_close["a"]
    instance = _open(job)
    with pytest.raises(StoreIOError) as info:
        instance.close(commit=True)
    assert info.value is first
    _assert_everything_released(job)


def test_a_failed_commit_stays_the_error_raised_and_every_lock_is_released(job, failing_close, monkeypatch):
    instance = _open(job)
    commit_error = ChangelogError("disk full while flushing", stream="j-a-changelog", partition=0)

    def failing_commit():
        raise commit_error

    monkeypatch.setattr(instance, "commit", failing_commit)
    with pytest.raises(ChangelogError) as info:
        instance.close(commit=True)
    assert info.value is commit_error  # not the store errors of the release that followed
    _assert_everything_released(job)


def test_without_the_fix_a_held_writer_lock_is_what_a_new_instance_meets(job):
    # The check _assert_everything_released relies on: a changelog partition held open is refused.
    instance = _open(job)
    system = open_changelog_system(job)
    try:
        with pytest.raises(ChangelogError, match="already open for writing"):
            system.partition("j-b-changelog", 0)
    finally:
        system.close()
        instance.abandon()
