"""Nothing outside the state directory is touched, with a symlink planted at every file and folder a run
writes (issue #43, item 1): a reference run lists what a `localstate run` writes (stores, changelogs,
checkpoints and their locks, give-back requests and claims, progress files and live.json, the output
stream); then, for each of them, a symlink to a victim outside replaces it (or waits at its name, for
what the next run creates) and the next run must either work or fail with a typed error, leaving the
victims exactly as they were and creating nothing outside.

The runs are what ``localstate run`` does (a SparkJobRunner watched by a ProgressObserver, worker
affinity on, compaction rounds, progress files rotated on every batch) on the shared local context."""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from pathlib import Path

import pytest

from counting_job import write_counting_job
from localstate.core.config import load_job_config
from localstate.errors import LocalStateError
from localstate.runtime.driver.progress import ProgressObserver
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.streams.jsonl import write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from fs_snapshot import snapshot  # noqa: E402

pytestmark = pytest.mark.spark

JOB = "plants"
STORES = f"state/{JOB}/stores/counts/0/rocksdb"
CHANGELOG = f"state/changelogs/{JOB}-counts-changelog"
CHECKPOINTS = f"state/{JOB}/checkpoints"
PROGRESS = f"state/{JOB}/progress"

TARGETS = [
    # the job's directory and its marker
    f"state/{JOB}", f"state/{JOB}/.localstate-owned",
    # checkpoints, the instance lock, the give-back request, the claims of worker affinity, failed attempts
    CHECKPOINTS, f"{CHECKPOINTS}/0.json", f"{CHECKPOINTS}/0.lock", f"{CHECKPOINTS}/0.want",
    f"{CHECKPOINTS}/claims", f"{CHECKPOINTS}/attempts",
    # the local store: RocksDB opens every file of its directory by name
    f"state/{JOB}/stores", f"state/{JOB}/stores/counts", f"state/{JOB}/stores/counts/0", STORES,
    f"{STORES}/CURRENT", f"{STORES}/IDENTITY", f"{STORES}/LOCK", f"{STORES}/LOG", f"{STORES}/MANIFEST-*",
    f"{STORES}/OPTIONS-*", f"{STORES}/*.sst", f"{STORES}/*.log", f"{STORES}/rocksdict-config.json",
    # the changelog: its stream, partition, segments (the next one too), locks, compaction manifest
    "state/changelogs", CHANGELOG, f"{CHANGELOG}/.localstate-owned", f"{CHANGELOG}/stream.json", f"{CHANGELOG}/0",
    f"{CHANGELOG}/0/00000000000000000000.log", f"{CHANGELOG}/0/00000000000000000003.log",
    f"{CHANGELOG}/0/writer.lock", f"{CHANGELOG}/0/compact.lock", f"{CHANGELOG}/0/compaction.json",
    # what a job keeps for its operators
    PROGRESS, f"{PROGRESS}/live.json", f"{PROGRESS}/progress.jsonl", f"{PROGRESS}/progress.jsonl.1",
    f"{PROGRESS}/progress.jsonl.2",
    # the output stream (its root, `out`, is the operator's choice)
    "out/counts-out", "out/counts-out/.localstate-owned", "out/counts-out/stream.json", "out/counts-out/0",
    "out/counts-out/0/00000000000000000000.log", "out/counts-out/0/writer.lock",
]
"""every file and folder a run writes, as paths (or patterns) relative to the job's folder"""

IN_THE_DEFAULT_RUN = {
    f"state/{JOB}", f"{CHECKPOINTS}/0.json", f"{CHECKPOINTS}/0.lock", f"{CHECKPOINTS}/0.want", f"{CHECKPOINTS}/claims",
    STORES, f"{STORES}/CURRENT", CHANGELOG, f"{CHANGELOG}/0/00000000000000000003.log", f"{CHANGELOG}/0/writer.lock",
    f"{PROGRESS}/live.json", f"{PROGRESS}/progress.jsonl.2", "out/counts-out/0/00000000000000000000.log",
}
"""the targets the default run plants at: of each part of the layout (the job's folder, checkpoints,
the store, the changelog, progress files, the output), a folder, a file, a lock and one that a run
only creates later (the next segment, a rotated progress file, a give-back request); a symlink at
every other target is the slow soak (`-m slow`)"""

NOT_TARGETS = ["state", "out", "data", "data/*", "job.toml"]
"""the operator's: the state directory and output root themselves, the input"""


def _feed(base: Path, count: int, start: int) -> None:
    write_jsonl(base / "data", 0, [{"key": f"k{i % 3}", "value": 0, "ts": 0.0} for i in range(start, start + count)])


def _run(base: Path, context) -> None:
    """What `localstate run --until-drained` does, on the shared context (progress rotated every batch)."""
    job = load_job_config(base / "job.toml")
    runner = SparkJobRunner(job, context=context, progress=None)
    observer = ProgressObserver.watch(runner, max_bytes=200, keep=2)
    try:
        runner.run()
    finally:
        observer.close()


def _written(base: Path) -> dict[str, str]:
    """relative path -> "dir" or "file" of everything under ``base`` (symlinks as "link")."""
    found = {}
    for folder, dirs, files in os.walk(base):
        for name in dirs + files:
            path = Path(folder, name)
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file"
            found[str(path.relative_to(base))] = kind
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory, spark_context) -> tuple[Path, dict[str, str], dict[str, str]]:
    """A job folder after one run, what it held then, and what a second run (more input) added."""
    base = tmp_path_factory.mktemp("reference") / "job"
    write_counting_job(base, JOB, partitions=1)
    _feed(base, 3, 0)
    _run(base, spark_context)
    first = _written(base)
    second_base = base.parent / "second"
    shutil.copytree(base, second_base, symlinks=True)
    _feed(second_base, 3, 3)
    _run(second_base, spark_context)
    return base, first, _written(second_base)


def _resolve(pattern: str, first: dict[str, str], second: dict[str, str]) -> tuple[str, str, bool]:
    """``(path, kind, exists after the first run)`` of a target."""
    for listing, exists in ((first, True), (second, False)):
        matches = sorted(path for path in listing if fnmatch.fnmatchcase(path, pattern))
        if matches:
            return matches[0], listing[matches[0]], exists
    kind = "dir" if pattern.rsplit("/", 1)[-1] in ("claims", "attempts") else "file"
    return pattern, kind, False  # written only while a run runs (give-back requests, failed attempts)


def test_the_targets_are_everything_a_run_writes(reference):
    """The list below covers what the reference runs wrote: a new writer must be added to it."""
    _, first, second = reference
    uncovered = [path for path in sorted({**first, **second})
                 if not any(fnmatch.fnmatchcase(path, pattern) for pattern in TARGETS + NOT_TARGETS)
                 and not path.startswith(f"{CHECKPOINTS}/claims/")
                 and not fnmatch.fnmatchcase(path, f"{STORES}/LOG.old.*")]
    assert not uncovered, uncovered


@pytest.mark.parametrize("target", [target if target in IN_THE_DEFAULT_RUN else pytest.param(target, marks=pytest.mark.slow)
                                    for target in TARGETS])
def test_a_symlink_planted_there_touches_nothing_outside(reference, spark_context, tmp_path, target):
    base, first, second = reference
    job = tmp_path / "job"
    shutil.copytree(base, job, symlinks=True)
    path, kind, exists = _resolve(target, first, second)
    outside = tmp_path / "outside"
    outside.mkdir()
    if kind == "dir":
        victim = outside / "victim-dir"
        victim.mkdir()
        (victim / "precious").write_bytes(b"precious\n")
    else:
        victim = outside / "victim-file"
        victim.write_bytes(b"precious\n")
    planted = job / path
    if not exists:
        victim = outside / "absent"  # what a run would create through the link
    elif kind == "dir":
        shutil.rmtree(planted)
    else:
        planted.unlink()
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(victim, target_is_directory=kind == "dir")
    before = snapshot(outside)
    _feed(job, 3, 3)
    try:
        _run(job, spark_context)
    except LocalStateError as exc:  # a typed refusal is a safe outcome; anything else is not
        assert "Traceback" not in str(exc) and "what to do" in str(exc)
        assert not target.startswith(PROGRESS), f"what a job keeps for its operators stopped it: {exc}"
    assert snapshot(outside) == before, f"{path} ({kind}, {'replaced' if exists else 'planted ahead'})"
    assert not (outside / "absent").exists()
