"""`localstate inspect`: after an in-process run (real RocksDB, LMDB, file changelogs), it shows exactly
the state a plain-Python computation predicts, from the local stores or, without them, from the
changelogs replayed to the checkpoint; and it changes nothing in the state directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope

sys.path.insert(0, str(Path(__file__).resolve().parent))
from count_and_remember import CountAndRemember, stores_toml  # noqa: E402
from fs_snapshot import snapshot as _snapshot  # noqa: E402

PARTITIONS = 2
USERS = [f"user-{i:02d}" for i in range(7)]


JOB = """
[job]
name = "inspect-me"
partitions = 2
task = "not_imported_by_inspect:Task"

""" + stores_toml()


def _records(partition: int, start: int, n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(start, start + n):
        user = USERS[(i * 3 + partition) % len(USERS)]
        out.append((user, "forget" if i % 11 == 10 else f"/page/{i % 5}"))
    return out


def _apply(state: dict, records: list[tuple[str, str]]) -> None:
    counts, last = state["counts"], state["last"]
    for user, value in records:
        if value == "forget":
            counts.pop(user, None)
            last.pop(user, None)
        else:
            counts[user] = counts.get(user, 0) + 1
            last[user] = {"page": value}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Partition p: 40 committed records, then 9 more flushed to the stores and changelogs but never
    checkpointed (a crash between flush and checkpoint). Returns (job file, committed, local) states."""
    root = tmp_path_factory.mktemp("inspect")
    job_file = root / "job.toml"
    job_file.write_text(JOB)
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    committed, local = {}, {}
    for p in range(PARTITIONS):
        instance = TaskInstance(job, p, system, task_factory=CountAndRemember)
        instance.open()
        first, extra = _records(p, 0, 40), _records(p, 40, 9)
        for offset, (user, value) in enumerate(first + extra):
            instance.process(Envelope("views", p, offset, user, value))
            if offset == len(first) - 1:
                instance.commit()
        instance.prepare_commit()            # flushed, but the checkpoint is never written
        instance.abandon()
        committed[p] = {"counts": {}, "last": {}}
        _apply(committed[p], first)
        local[p] = {"counts": {}, "last": {}}
        _apply(local[p], first + extra)
    system.close()
    return job_file, committed, local


def _inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _dump(capsys, job_file: Path, store: str, *extra: str) -> dict[int, dict]:
    code, out, err = _inspect(capsys, str(job_file), "--store", store, "--json", "--limit", "0", *extra)
    assert code == 0, err
    found: dict[int, dict] = {p: {} for p in range(PARTITIONS)}
    for line in out.splitlines():
        row = json.loads(line)
        assert row["key"] not in found[row["partition"]]
        found[row["partition"]][row["key"]] = row["value"]
    return found


def test_local_stores_show_the_flushed_state(run, capsys):
    job_file, committed, local = run
    assert _dump(capsys, job_file, "counts") == {p: local[p]["counts"] for p in local}
    assert _dump(capsys, job_file, "last") == {p: local[p]["last"] for p in local}
    # the uncommitted tail is visible locally; the committed state differs (the test would be blind otherwise)
    assert any(local[p]["counts"] != committed[p]["counts"] for p in local)


def test_from_changelog_shows_exactly_the_checkpointed_state(run, capsys):
    job_file, committed, _ = run
    assert _dump(capsys, job_file, "counts", "--from-changelog") == {p: committed[p]["counts"] for p in committed}
    assert _dump(capsys, job_file, "last", "--from-changelog") == {p: committed[p]["last"] for p in committed}
    # the memory store has no local files: its contents always come from the changelog
    assert _dump(capsys, job_file, "cache") == {
        p: {u: _cache_value(p, u) for u, v in _records(p, 0, 40) if v != "forget"} for p in committed}


def _cache_value(partition: int, user: str) -> int:
    # cache holds the count as of the user's last non-forget record (forget does not touch it)
    count, value = 0, None
    for u, v in _records(partition, 0, 40):
        if u != user:
            continue
        count = 0 if v == "forget" else count + 1
        if v != "forget":
            value = count
    return value


def test_prefix_range_partition_and_limit(run, capsys):
    job_file, _, local = run
    assert _dump(capsys, job_file, "counts", "--prefix", "user-0", "--partition", "1") == {
        0: {}, 1: {u: n for u, n in local[1]["counts"].items() if u.startswith("user-0")}}
    assert _dump(capsys, job_file, "counts", "--start", "user-02", "--end", "user-05") == {
        p: {u: n for u, n in local[p]["counts"].items() if "user-02" <= u < "user-05"} for p in local}
    code, out, err = _inspect(capsys, str(job_file), "--store", "counts", "--limit", "3")
    assert code == 0 and len(out.splitlines()) == 3 and "--limit 3" in err


def test_overview_lists_checkpoints_and_store_partitions(run, capsys):
    job_file, committed, local = run
    code, out, err = _inspect(capsys, str(job_file), "--json")
    assert code == 0, err
    view = json.loads(out)
    assert view["job"] == "inspect-me" and set(view["checkpoints"]) == {"0", "1"}
    for p in range(PARTITIONS):
        checkpoint = view["checkpoints"][str(p)]
        assert checkpoint["inputs"] == {"views": 40} and checkpoint["generation"] == 1
    rows = {(row["store"], row["partition"]): row for row in view["stores"]}
    for p in range(PARTITIONS):
        counts = rows[("counts", p)]
        assert counts["keys"] == len(local[p]["counts"]) and counts["bytes"] > 0
        # flushed past the checkpoint: the local offset is ahead, and the changelog ends there too
        assert counts["local_offset"] == counts["changelog_end"] > counts["checkpoint_offset"]
        assert rows[("last", p)]["keys"] == len(local[p]["last"])
        assert rows[("cache", p)]["backend"] == "memory" and rows[("cache", p)]["keys"] is None
        assert rows[("scratch", p)]["checkpoint_offset"] is None
    code, text, _ = _inspect(capsys, str(job_file))
    assert code == 0 and "checkpoints:" in text and "counts" in text and "rocksdb" in text


def test_changelog_view_and_heap_store_dump(run, capsys):
    job_file, committed, _ = run
    code, out, err = _inspect(capsys, str(job_file), "--changelog", "counts", "--json", "--records", "2")
    assert code == 0, err
    partitions = [json.loads(line) for line in out.splitlines()]
    assert [p["partition"] for p in partitions] == [0, 1]
    for info in partitions:
        assert info["stream"] == "inspect-me-counts-changelog" and info["start"] == 0
        assert info["end"] > info["checkpoint"] > 0
        assert info["segments"] and info["segments"][0]["name"].endswith(".log")
        assert len(info["records"]) == 2 and isinstance(info["records"][0]["key"], str)
    # heap: at least the changelog-based dump (keys decoded with the key serde)
    code, out, err = _inspect(capsys, str(job_file), "--store", "top", "--json", "--limit", "0")
    assert code == 0, err
    keys = {(row["partition"], row["key"]) for row in map(json.loads, out.splitlines())}
    assert keys == {(p, u) for p in committed for u, v in _records(p, 0, 40) if v != "forget"}


def test_without_local_store_directories_state_comes_from_the_changelog(run, capsys, tmp_path):
    job_file, committed, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(job_file.parent, copy, symlinks=True)
    shutil.rmtree(copy / "state" / "inspect-me" / "stores")
    copied = copy / "job.toml"
    assert _dump(capsys, copied, "counts") == {p: committed[p]["counts"] for p in committed}
    assert _dump(capsys, copied, "last") == {p: committed[p]["last"] for p in committed}
    code, out, _ = _inspect(capsys, str(copied), "--json")
    rows = {(r["store"], r["partition"]): r for r in json.loads(out)["stores"]}
    assert rows[("counts", 0)]["exists"] is False and rows[("counts", 0)]["keys"] is None
    assert not (copy / "state" / "inspect-me" / "stores").exists()      # not re-created
    # a store without changelog and without local files has nothing to show: a typed error
    code, _, err = _inspect(capsys, str(copied), "--store", "scratch")
    assert code == 1 and "changelog = false" in err


def test_inspect_changes_nothing(run, capsys):
    job_file, _, _ = run
    state = job_file.parent / "state"
    before = _snapshot(state)
    for args in ([], ["--json"], ["--store", "counts"], ["--store", "last", "--json"], ["--store", "cache"],
                 ["--store", "counts", "--from-changelog"], ["--store", "top"], ["--changelog", "last"],
                 ["--changelog", "inspect-me-top-changelog", "--records", "100"], ["--partition", "1"]):
        code, _, err = _inspect(capsys, str(job_file), *args)
        assert code == 0, (args, err)
    assert _snapshot(state) == before


def test_typed_errors_for_unknown_store_stream_partition_and_a_job_never_run(run, tmp_path):
    job_file, _, _ = run

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localstate", "inspect", *args], capture_output=True, text=True)

    for args, words in ((["--store", "count"], ["no store 'count'", "did you mean 'counts'"]),
                        (["--changelog", "nope"], ["no changelog stream 'nope'", "inspect-me-counts-changelog"]),
                        (["--partition", "7"], ["partitions 0..1"])):
        result = cli(str(job_file), *args)
        assert result.returncode == 1, args
        assert all(word in result.stderr for word in words), result.stderr
        assert "what to do:" in result.stderr and "Traceback" not in result.stderr
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(JOB)
    result = cli(str(fresh))
    assert result.returncode == 1 and "has not run" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_job_file_parses(tmp_path):
    # the job above is valid as written (guards the fixture against silent config drift)
    (tmp_path / "job.toml").write_text(textwrap.dedent(JOB))
    assert set(load_job_config(tmp_path / "job.toml").stores) == {"counts", "last", "cache", "top", "scratch"}


def test_unreadable_local_store_falls_back_to_the_changelog(run, capsys, tmp_path):
    """Local state is a cache: garbage in a local RocksDB/LMDB directory is reported (overview) and the
    contents come from the changelog up to the checkpoint; nothing is repaired or deleted."""
    job_file, committed, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(job_file.parent, copy, symlinks=True)
    stores = copy / "state" / "inspect-me" / "stores"
    for store, backend in (("counts", "rocksdb"), ("last", "lmdb")):
        for p in range(PARTITIONS):
            directory = stores / store / str(p) / backend
            shutil.rmtree(directory)
            directory.mkdir()
            (directory / ("CURRENT" if backend == "rocksdb" else "data.mdb")).write_bytes(b"garbage\n" * 10)
    before = _snapshot(copy / "state")
    assert _dump(capsys, copy / "job.toml", "counts") == {p: committed[p]["counts"] for p in committed}
    assert _dump(capsys, copy / "job.toml", "last") == {p: committed[p]["last"] for p in committed}
    code, out, err = _inspect(capsys, str(copy / "job.toml"))
    assert code == 0, err
    assert "local store unreadable" in out
    assert _snapshot(copy / "state") == before


def test_key_selection_follows_the_key_type(tmp_path):
    """--start/--end compare int keys as ints (10 < 9 as text would be wrong), text keys as text."""
    import argparse

    from localstate.tools.inspect import _key_filter
    from localstate.errors import ConfigError

    (tmp_path / "job.toml").write_text(JOB + '\n[stores.byid]\nengine = "kv"\nkey_serde = "int"\n')
    job = load_job_config(tmp_path / "job.toml")
    args = lambda **kw: argparse.Namespace(**{"store": "byid", "prefix": None, "start": None, "end": None, **kw})  # noqa: E731
    select = _key_filter(job, args(start="9", end="11"))
    assert [k for k in (8, 9, 10, 11, 100) if select(k)] == [9, 10]
    select = _key_filter(job, args(store="counts", prefix="user-1"))
    assert [k for k in ("user-1", "user-10", "user-2", "xuser-1") if select(k)] == ["user-1", "user-10"]
    with pytest.raises(ConfigError):
        _key_filter(job, args(start="abc"))
    with pytest.raises(ConfigError):
        _key_filter(job, args(store="counts", prefix="a", start="b"))
