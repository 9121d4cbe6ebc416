"""Pipelined commits on the ``objectstore`` changelog (docs/durable.md, "Pipelined commits"):
``TaskInstance.commit`` returns with its delta PUTs in flight and a committer thread saves the
checkpoint once they landed. Checked through the real runtime (kv on RocksDB, jsonl outputs) on a
shared directory and on SeaweedFS S3:

* the same state, outputs and checkpoints as synchronous commits, and ``close()`` saves the commit
  in flight; ``prepare_commit`` (the Spark path) still waits for every object it names;
* a real child process SIGKILLed with a commit pending (its objects written, its checkpoint not) and
  right after the deferred save restarts exactly (state, outputs, input position) against plain Python;
* a PUT that fails with a commit pending: a typed error at the next commit and at close, the
  previous checkpoint stays, and the restarted job is exact once the storage is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.runtime.layout import checkpoint_store
from localstate.runtime.partition.instance import PIPELINE_DEPTH
from localstate.errors import ChangelogError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pipelined_job import STREAM, expected, feed_until, job, open_instance, outputs  # noqa: E402
from test_objectstore_durability import DirectoryOutage, SeaweedOutage, outage  # noqa: E402,F401 - the fixture

COMMIT_EVERY = 400


def committed(job_config):
    return checkpoint_store(job_config).load(0)


def state(instance) -> dict[str, int]:
    return dict(instance.stores["counts"].engine.all())


def assert_exact(instance, root: Path, records: int) -> None:
    """State, outputs and input position of ``instance`` are those of the first ``records`` inputs."""
    model_state, model_outputs = expected(records)
    assert instance.position("in") == records
    assert state(instance) == model_state and outputs(root) == model_outputs


def stored_objects(instance) -> dict[str, int]:
    """Object name (as a manifest names it) -> bytes of every object of the changelog partition in the storage."""
    return {info.key.split("/", 3)[3]: info.size for info in instance.changelogs.objects(STREAM, 0)}


def named_objects(manifest) -> dict[str, int]:
    return {item["object"]: item["bytes"] for item in [manifest["snapshot"], *manifest["deltas"]] if item is not None}


def test_pipelined_commits_equal_synchronous_ones_and_close_saves_the_commit_in_flight(objectstore_options,
                                                                                       tmp_path):
    results = {}
    for pipelined in (True, False):
        root = tmp_path / f"pipelined-{pipelined}"
        config = job(root, _fresh(objectstore_options, pipelined), pipelined_commits=pipelined,
                     commit_every=COMMIT_EVERY)
        instance = open_instance(config)
        assert instance.pipelined is pipelined
        checkpoints = []
        for round_end in (COMMIT_EVERY, 2 * COMMIT_EVERY, 3 * COMMIT_EVERY):
            feed_until(instance, round_end)  # autocommit: exactly one commit, at the round's last record
            assert instance.commits == round_end // COMMIT_EVERY
            assert instance.commit_pending is pipelined
            instance.settle_commit()
            saved = committed(config)
            assert saved.inputs == {"in": round_end}
            # every object the saved checkpoint names is in the storage, whole
            stored = stored_objects(instance)
            assert all(stored.get(name) == size for name, size in named_objects(saved.manifests["counts"]).items())
            checkpoints.append((saved.inputs, saved.changelogs, saved.outputs))
        feed_until(instance, 3 * COMMIT_EVERY + 150)  # no commit due: 150 records after the last one
        assert instance.commit_pending is False
        instance.commit()
        instance.close(commit=False)  # the commit in flight is saved all the same
        saved = committed(config)
        assert saved.inputs == {"in": 3 * COMMIT_EVERY + 150}
        checkpoints.append((saved.inputs, saved.changelogs, saved.outputs))
        again = open_instance(config)  # a restart finds exactly that
        assert again.position("in") == 3 * COMMIT_EVERY + 150
        results[pipelined] = (state(again), outputs(root), checkpoints)
        again.close(commit=False)
    model_state, model_outputs = expected(3 * COMMIT_EVERY + 150)
    assert results[True] == results[False]
    assert results[True][0] == model_state and results[True][1] == model_outputs


def test_back_to_back_commits_keep_at_most_two_in_flight_and_the_last_one_is_saved(objectstore_options, tmp_path):
    """Commits faster than the saves (20 records each): the task never has more than PIPELINE_DEPTH
    saves in flight, saves a newer commit already follows may be skipped, and the checkpoint saved at
    the end is the last commit's, exact."""
    every, commits = 20, 60
    config = job(tmp_path, objectstore_options, commit_every=every)
    instance = open_instance(config)
    assert instance.pipelined
    for commit in range(1, commits + 1):
        feed_until(instance, commit * every)  # exactly one commit, at the last record
        assert instance.commits == commit
        assert instance.commits_in_flight <= PIPELINE_DEPTH
        saved = committed(config)
        assert saved is None or saved.inputs.get("in", 0) <= commit * every  # never ahead of the commits
    instance.settle_commit()
    assert instance.commits_in_flight == 0 and not instance.commit_pending
    assert committed(config).inputs == {"in": commits * every}
    instance.close(commit=False)
    again = open_instance(config)
    assert_exact(again, tmp_path, commits * every)
    again.close(commit=False)


def _fresh(options: dict, pipelined: bool) -> dict:
    """``options`` at a location of its own (a directory or S3 prefix per commit mode)."""
    return {**options, "url": f"{options['url'].rstrip('/')}-{'pipelined' if pipelined else 'synchronous'}"}


def test_close_with_commit_saves_everything_and_prepare_commit_waits_for_its_objects(objectstore_options, tmp_path):
    config = job(tmp_path, objectstore_options, commit_every=10 ** 6)
    instance = open_instance(config)
    assert instance.pipelined
    feed_until(instance, 500)
    checkpoint = instance.prepare_commit()  # the Spark path: its objects are written when it returns
    stored = stored_objects(instance)
    named = named_objects(checkpoint.manifests["counts"])
    assert named and all(stored.get(name) == size for name, size in named.items())
    assert instance.commit_pending is False
    instance.save_checkpoint(checkpoint)
    feed_until(instance, 900)
    instance.close()  # commits and waits for the save
    assert committed(config).inputs == {"in": 900}
    again = open_instance(config)
    assert_exact(again, tmp_path, 900)
    again.close(commit=False)


# ---------------------------------------------------------------- a real process killed

def run_child(root: Path, options: dict, records: int, crash: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash is not None:
        env["LOCALSTATE_CRASH_AT"] = crash
    params = {"root": str(root), "options": options, "records": records, "commit_every": COMMIT_EVERY}
    return subprocess.run([sys.executable, str(HERE / "pipelined_job.py"), json.dumps(params)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("point, saved_commits", [
    # the 3rd commit's objects are written, its checkpoint is not: 2 commits stay, or 1 if the 2nd
    # commit's save was skipped (the 3rd was already queued behind it: PIPELINE_DEPTH)
    # (or none, if both earlier saves were skipped)
    ("commit_pending", {0, 1, 2}),
    # killed right after the 3rd checkpoint actually saved: that of the 3rd commit, or a later one
    # if earlier saves were skipped
    ("after_checkpoint", {3, 4, 5, 6}),
])
def test_sigkill_with_a_commit_pending_restarts_exactly(objectstore_options, tmp_path, point, saved_commits):
    records = 6 * COMMIT_EVERY
    killed = run_child(tmp_path, objectstore_options, records, crash=f"{point}:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "done" not in killed.stdout
    config = job(tmp_path, objectstore_options, commit_every=COMMIT_EVERY)
    position = committed(config).inputs.get("in", 0)
    assert position in {commits * COMMIT_EVERY for commits in saved_commits}
    # The restart is exact at the committed position: state rolled back, outputs trimmed, input resumed.
    instance = open_instance(config)
    (recovery,) = instance.recoveries
    assert recovery.checkpoint_offset == committed(config).changelogs.get("counts", 0)
    if point == "commit_pending":
        assert recovery.status == "rebuilt"  # the local store had applied the pending commit's flush
    assert_exact(instance, tmp_path, position)
    instance.close(commit=False)
    # ...and the job runs to the end as if it had never died.
    finished = run_child(tmp_path, objectstore_options, records)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert f"opened at {position}" in finished.stdout
    final = open_instance(config)
    assert_exact(final, tmp_path, records)
    final.close(commit=False)


# ---------------------------------------------------------------- storage that fails

def failing_commit_pending(outage, root: Path, saved: int, pending: int):
    """An instance that committed (and saved) ``saved`` records, then lost its storage and committed
    ``pending`` records: that commit's PUT fails in the background. Returns (job, instance, the
    saved checkpoint)."""
    config = job(root, outage.options, commit_every=10 ** 6)
    instance = open_instance(config)
    feed_until(instance, saved)
    instance.commit()
    instance.settle_commit()
    first = committed(config)
    assert first.inputs == {"in": saved}
    outage.stop()
    feed_until(instance, pending)
    instance.commit()  # returns: its PUT is in flight (and fails)
    assert instance.commit_pending
    return config, instance, first


def test_a_put_failing_with_a_commit_pending_fails_the_next_commit_and_close(outage, tmp_path):
    config, instance, first = failing_commit_pending(outage, tmp_path, 300, 500)
    with pytest.raises(ChangelogError) as caught:
        instance.commit()  # the next commit waits for the pending one and reports its failure
    error = caught.value
    assert error.context["stream"] == STREAM and error.context["partition"] == 0
    assert f"changelogs/{STREAM}/0/" in error.context["path"]  # the delta object that could not be written
    assert instance.commit_pending is False
    # nothing after the last saved checkpoint is committed, now or later
    # close(commit=True) tries once more: the failed save's own error or the failed partition's
    with pytest.raises(ChangelogError, match="could not be written|cannot write object"):
        instance.close()
    outage.start()
    assert committed(config).inputs == first.inputs and committed(config).changelogs == first.changelogs
    again = open_instance(config)  # the same host: its local store ran ahead of the checkpoint
    (recovery,) = again.recoveries
    assert recovery.status == "rebuilt" and recovery.checkpoint_offset == first.changelogs["counts"]
    assert_exact(again, tmp_path, 300)
    feed_until(again, 800)
    again.close()
    final = open_instance(config)
    assert_exact(final, tmp_path, 800)
    final.close(commit=False)


def test_a_put_failing_with_a_commit_pending_is_raised_by_close(outage, tmp_path):
    config, instance, _first = failing_commit_pending(outage, tmp_path, 200, 350)
    with pytest.raises(ChangelogError) as caught:
        instance.close(commit=False)  # nothing new to commit, but the pending commit failed
    assert caught.value.context["stream"] == STREAM
    outage.start()
    assert committed(config).inputs == {"in": 200}
    again = open_instance(config)
    assert_exact(again, tmp_path, 200)
    again.close(commit=False)


def test_the_option_off_commits_synchronously(objectstore_options, tmp_path):
    config = job(tmp_path, objectstore_options, pipelined_commits=False, commit_every=10 ** 6)
    instance = open_instance(config)
    assert instance.pipelined is False
    feed_until(instance, 250)
    instance.commit()
    assert instance.commit_pending is False
    assert committed(config).inputs == {"in": 250}  # saved before commit() returned
    assert instance.stores["counts"].changelog.put_wait_seconds > 0  # the commit waited for its PUT
    instance.close(commit=False)
