"""The files a job keeps for its operators are input like any other (issue #43, item 1): every field of
``live.json`` and of a progress line, damaged in every way (wrong JSON types, huge and negative ints,
zero and negative pids, NaN and infinities, truncation, binary garbage, a directory or FIFO or symlink
where a file should be, unreadable permissions), gives ``localstate status`` an answer (exit 0 only
for a sound, live heartbeat; a damaged one is ``unknown``, exit 3), a problem saying what to do, and
JSON a strict parser reads; the metrics take only sound figures; and the writers of a run never stop
it, never follow a symlink and never write outside the state directory."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fs_snapshot import snapshot  # noqa: E402
from localstate.core.config import load_job_config
from localstate.runtime.driver.metrics import JobMetrics
from localstate.runtime.driver.operating import LIVE, LIVE_FIELDS, NOT_LIVE, PROGRESS_FIELDS, UNKNOWN
from localstate.runtime.driver.progress import (LIVE_FILE, PROGRESS_FILE, Heartbeat, ProgressLog, ProgressObserver,
                                         ProgressReport, progress_directory)
from localstate.runtime.driver.plan import BatchResult
from localstate.tools.cli import main

HOST = socket.gethostname()

#: values of every JSON type and of every kind of damage a field can hold
HOSTILE: list[Any] = [
    "abc", "", "x" * 5000, "\x1b[31mred\x07", "2025-01-01", [], [1, 2], {}, {"a": 1}, None, True, False,
    0, -1, 1.5, -0.0, 2 ** 70, -(2 ** 70), 10 ** 30, 2 ** 63, float("nan"), float("inf"), float("-inf"), 1e308,
]


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "ops"\ntask = "x:Y"\n[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    return path


def progress_dir(job_file: Path) -> Path:
    directory = progress_directory(load_job_config(job_file))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def sound_live(**changes: Any) -> dict[str, Any]:
    """A live.json a live run writes: this process, this host, a fresh heartbeat."""
    now = time.time()
    return {"pid": os.getpid(), "host": HOST, "run_id": "r1", "started": now, "heartbeat": now,
            "state": "running", "batch": 3, "heartbeat_interval": 5.0, **changes}


def sound_progress(batch: int = 1, **changes: Any) -> dict[str, Any]:
    return {"job": "ops", "run_id": "r1", "batch": batch, "timestamp": "2025-01-01T00:00:00.000Z", "duration_ms": 12.5,
            "rows_in": 10, "rows_out": 4, "lag": 0, "pending_bytes": 0, "failed_attempts": 0,
            "failed_attempt_reasons": [], "inputs": {}, "state": {"stores": {}}, **changes}


def status(job_file: Path, capsys) -> tuple[int, dict[str, Any], str]:
    """``localstate status`` twice (text, then --json): exit code, the JSON (parsed strictly: no NaN),
    the text. Raises if either raised."""
    code = main(["status", str(job_file)])
    text = capsys.readouterr().out
    assert main(["status", str(job_file), "--json"]) == code
    out = capsys.readouterr().out

    def refuse(name: str) -> None:
        raise AssertionError(f"status --json printed {name}")

    found = json.loads(out, parse_constant=refuse)
    assert text.isprintable() or all(line.isprintable() for line in text.splitlines()), text
    return code, found, text


# -- live.json -------------------------------------------------------------------------------------------

def test_a_sound_heartbeat_of_a_live_process_is_live(job_file, capsys):
    (progress_dir(job_file) / LIVE_FILE).write_text(json.dumps(sound_live()))
    code, found, text = status(job_file, capsys)
    assert (code, found["liveness"], found["live"], found["problems"]) == (0, LIVE, True, [])
    assert "LIVE" in text


@pytest.mark.parametrize("field", sorted(LIVE_FIELDS))
def test_every_field_of_live_json_damaged(job_file, capsys, field):
    check, _what, required = LIVE_FIELDS[field]
    for value in HOSTILE + ["missing"]:
        if check(value) if value != "missing" else not required:
            continue  # a value the field may hold (e.g. batch None, no run_id): covered by the sound cases
        live = sound_live()
        if value == "missing":
            del live[field]
        else:
            live[field] = value
        (progress_dir(job_file) / LIVE_FILE).write_text(json.dumps(live))  # NaN/Infinity as Python writes them
        code, found, text = status(job_file, capsys)
        if required:
            assert (code, found["liveness"], found["live"]) == (3, UNKNOWN, False), (value, found)
            assert field in found["why"] and "rewrites live.json" in found["why"]  # what to do
            assert "unknown" in text
        else:  # an optional field: judged without it, and said
            assert found["liveness"] == LIVE and code == 0, (value, found)
            assert any(field in problem for problem in found["problems"]), (value, found)
        assert field not in (found["run"] or {})  # never shown as if it were sound


@pytest.mark.parametrize("pid", [0, -1, -2 ** 31, 2 ** 22 + 1, 2 ** 70, "1", 1.0, True])
def test_impossible_pids_with_a_fresh_heartbeat_are_never_live(job_file, capsys, pid):
    (progress_dir(job_file) / LIVE_FILE).write_text(json.dumps(sound_live(pid=pid)))
    code, found, _ = status(job_file, capsys)
    assert (code, found["liveness"]) == (3, UNKNOWN) and "pid" in found["why"]


def test_a_gone_pid_a_stale_heartbeat_and_one_from_the_future(job_file, capsys):
    directory = progress_dir(job_file)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    cases = [(sound_live(pid=child.pid), NOT_LIVE, "gone"),
             (sound_live(heartbeat=time.time() - 3600), NOT_LIVE, "old"),
             (sound_live(heartbeat=time.time() + 3600), UNKNOWN, "future"),
             (sound_live(state="stopped"), NOT_LIVE, "stopped"),
             (sound_live(host="elsewhere", heartbeat=time.time() - 3600), NOT_LIVE, "stale"),
             (sound_live(pid=1), LIVE, "pid 1")]  # a process that started before the run did: plausible
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cases.append((sound_live(pid=later.pid, started=time.time() - 60), NOT_LIVE, "reused"))
    for live, liveness, why in cases:
        (directory / LIVE_FILE).write_text(json.dumps(live))
        code, found, _ = status(job_file, capsys)
        assert found["liveness"] == liveness and why in found["why"], (live, found)
        assert code == (0 if liveness == LIVE else 3)
    later.kill()
    later.wait()


def _whole_file_damage(directory: Path, outside: Path) -> dict[str, Any]:
    """name -> what to put at live.json (bytes, or a function making it)."""
    text = json.dumps(sound_live()).encode()
    cases: dict[str, Any] = {f"truncated at {cut}": text[:cut] for cut in (0, 1, 10, len(text) // 2, len(text) - 1)}
    cases.update({
        "binary garbage": bytes(range(256)) * 4, "NUL bytes": b"\0" * 100, "invalid UTF-8": b'{"pid": "\xff\xfe"}',
        "a list": b"[1, 2]", "a number": b"5", "a string": b'"live"', "null": b"null", "NaN": b"NaN",
        "deep nesting": b"[" * 100_000 + b"]" * 100_000, "huge int": b'{"pid": 1' + b"0" * 5000 + b"}",
        "oversized": b" " * (2 << 20) + text,
    })

    def directory_at(path: Path) -> None:
        path.mkdir()

    def fifo_at(path: Path) -> None:
        os.mkfifo(path)

    def symlink_at(path: Path) -> None:
        (outside / "live.json").write_text(json.dumps(sound_live()))
        path.symlink_to(outside / "live.json")

    cases.update({"a directory": directory_at, "a FIFO": fifo_at, "a symlink to a sound file": symlink_at})
    return cases


def test_every_whole_file_damage_of_live_json(job_file, capsys, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    directory = progress_dir(job_file)
    for name, damage in _whole_file_damage(directory, outside).items():
        path = directory / LIVE_FILE
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif os.path.lexists(path):
            path.unlink()
        if callable(damage):
            damage(path)
        else:
            path.write_bytes(damage)
        before = snapshot(outside)
        code, found, text = status(job_file, capsys)
        assert (code, found["liveness"], found["live"]) == (3, UNKNOWN, False), (name, found)
        assert "live.json" in found["why"] and ("what to do" in found["why"] or "localstate" in found["why"]
                                                  or "remove" in found["why"] or "symlink" in found["why"]), found
        assert snapshot(outside) == before, name


@pytest.mark.parametrize("planted", ["progress-is-a-file", "progress-is-a-symlink", "job-dir-is-a-file"])
def test_status_when_the_folders_are_damaged(job_file, capsys, tmp_path, planted):
    job = load_job_config(job_file)
    directory = progress_directory(job)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / LIVE_FILE).write_text(json.dumps(sound_live()))
    (outside / PROGRESS_FILE).write_text(json.dumps(sound_progress()) + "\n")
    if planted == "progress-is-a-file":
        directory.parent.mkdir(parents=True)
        directory.write_text("not a folder")
    elif planted == "progress-is-a-symlink":
        directory.parent.mkdir(parents=True)
        directory.symlink_to(outside, target_is_directory=True)
    else:
        directory.parent.parent.mkdir(parents=True)
        directory.parent.write_text("not a folder")
    code, found, _ = status(job_file, capsys)
    assert code == 3 and found["last_progress"] is None and not found["live"]
    if planted == "progress-is-a-symlink":
        assert found["liveness"] == UNKNOWN and "symlink" in found["why"]  # never followed to the sound file


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop root's file access")
def test_unreadable_files(job_file, tmp_path):
    """Mode 000 files, read by ``status`` in a process without the capabilities that let root read
    anything (tests run as root here)."""
    directory = progress_dir(job_file)
    (directory / LIVE_FILE).write_text(json.dumps(sound_live()))
    (directory / PROGRESS_FILE).write_text(json.dumps(sound_progress()) + "\n")
    for path in (directory / LIVE_FILE, directory / PROGRESS_FILE):
        path.chmod(0)
    command = [sys.executable, "-c", "import sys; from localstate.tools.cli import main; sys.exit(main())",
               "status", str(job_file), "--json"]
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    found = json.loads(done.stdout)
    assert found["liveness"] == UNKNOWN and "Permission denied" in found["why"]
    assert found["last_progress"] is None and any("Permission denied" in p for p in found["problems"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(LIVE_FIELDS) + ["extra"]),
                       st.one_of(st.sampled_from(HOSTILE), st.integers(), st.floats(), st.text(max_size=20)),
                       max_size=8),
       st.booleans())
def test_live_json_property(job_file, capsys, changes, keep_sound):
    """Any mix of fields: status answers, strict JSON; LIVE only if pid, host, state and heartbeat are sound."""
    live = {**(sound_live() if keep_sound else {}), **changes}
    (progress_dir(job_file) / LIVE_FILE).write_text(json.dumps(live))
    code, found, _ = status(job_file, capsys)
    if found["liveness"] == LIVE:
        for name in ("pid", "host", "state", "heartbeat"):
            assert LIVE_FIELDS[name][0](live.get(name)), (name, live)
        assert code == 0
    else:
        assert code == 3


# -- progress.jsonl ---------------------------------------------------------------------------------------

def write_progress(job_file: Path, lines: list[bytes]) -> Path:
    path = progress_dir(job_file) / PROGRESS_FILE
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("field", sorted(PROGRESS_FIELDS))
def test_every_field_of_the_last_progress_line_damaged(job_file, capsys, field):
    check, _what, required = PROGRESS_FIELDS[field]
    for value in HOSTILE + ["missing"]:
        if check(value) if value != "missing" else not required:
            continue  # a value status reads as it is
        damaged = sound_progress(batch=2)
        if value == "missing":
            damaged.pop(field, None)
        else:
            damaged[field] = value
        write_progress(job_file, [json.dumps(sound_progress(batch=1)).encode() + b"\n",
                                  json.dumps(damaged).encode() + b"\n"])
        code, found, text = status(job_file, capsys)
        assert code == 3
        assert found["last_progress"]["batch"] == 1, (value, found)  # the sound line before it
        assert any("damaged line" in problem and field in problem for problem in found["problems"]), (value, found)
        assert "last batch 1" in text


def test_every_whole_line_damage_of_progress(job_file, capsys, tmp_path):
    good = json.dumps(sound_progress(batch=1)).encode() + b"\n"
    tails = {
        "torn": json.dumps(sound_progress(batch=2)).encode()[:30], "binary": bytes(range(256)),
        "NUL": b"\0" * 64, "invalid UTF-8": b'{"batch": "\xff"}', "a list": b"[1]", "null": b"null",
        "NaN": b"NaN", "deep": b"[" * 50_000 + b"]" * 50_000, "huge int": b'{"batch": 1' + b"0" * 5000 + b"}",
        "many damaged lines": b"garbage\n" * 10_000,
    }
    for name, tail in tails.items():
        write_progress(job_file, [good, tail, b"\n"])
        code, found, text = status(job_file, capsys)
        assert code == 3 and found["last_progress"]["batch"] == 1, (name, found)
        assert any("damaged line" in p for p in found["problems"]), (name, found)
    # Nothing sound at all: no batch, and said so.
    write_progress(job_file, [b"garbage\n", bytes(range(256))])
    code, found, text = status(job_file, capsys)
    assert found["last_progress"] is None and "no batch recorded yet" in text
    assert any("no readable progress object" in p for p in found["problems"])
    # One line of 20 MB without a newline: read no further than the limit.
    write_progress(job_file, [good, b"x" * (20 << 20)])
    code, found, _ = status(job_file, capsys)
    assert code == 3 and found["last_progress"] is None


@pytest.mark.parametrize("planted", ["directory", "fifo", "symlink"])
def test_progress_file_of_another_kind(job_file, capsys, tmp_path, planted):
    path = progress_dir(job_file) / PROGRESS_FILE
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps(sound_progress()) + "\n")
    {"directory": path.mkdir, "fifo": lambda: os.mkfifo(path), "symlink": lambda: path.symlink_to(outside)}[planted]()
    code, found, _ = status(job_file, capsys)
    assert code == 3 and found["last_progress"] is None
    assert any(str(path) in problem for problem in found["problems"]), found


def test_the_newest_sound_object_may_be_in_the_rotated_file(job_file, capsys):
    directory = progress_dir(job_file)
    (directory / f"{PROGRESS_FILE}.1").write_text(json.dumps(sound_progress(batch=7)) + "\n")
    write_progress(job_file, [b"torn{"])
    code, found, _ = status(job_file, capsys)
    assert found["last_progress"]["batch"] == 7


# -- the metrics -----------------------------------------------------------------------------------------

json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                                     st.sampled_from(HOSTILE)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=12)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(PROGRESS_FIELDS) + ["timestamp", "state", "inputs"]), json_values,
                       max_size=10), st.dictionaries(st.sampled_from(["restore", "stores", "warm_tasks", "commit_ms"]),
                                                     json_values, max_size=4))
def test_metrics_take_only_sound_figures(fields, state):
    metrics = JobMetrics("ops")
    progress = {**fields, "state": {**state, **(fields.get("state") if isinstance(fields.get("state"), dict) else {})}}
    metrics.observe(progress)
    metrics.seed(progress)
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert math.isfinite(sample.value) and sample.value >= 0 or sample.name == "localstate_lag_records", sample


def test_metrics_seed_from_the_last_sound_progress_of_the_run_before(job_file):
    job = load_job_config(job_file)
    write_progress(job_file, [json.dumps(sound_progress(batch=4, lag=17, duration_ms=2500.0)).encode() + b"\n",
                              b"damaged {\n"])
    metrics = JobMetrics(job.name)
    from localstate.runtime.driver.progress import read_last_progress

    metrics.seed(read_last_progress(job).value)
    sample = metrics.registry.get_sample_value
    assert sample("localstate_lag_records", {"job": "ops"}) == 17
    assert sample("localstate_last_batch_duration_seconds", {"job": "ops"}) == 2.5
    assert sample("localstate_last_batch_timestamp_seconds", {"job": "ops"}) == 1735689600.0


# -- the writers of a run --------------------------------------------------------------------------------

def _result(batch: int) -> BatchResult:
    return BatchResult(batch, seconds=0.01, records_in=3, records_out=1, tasks=1)


def _damage_writers(directory: Path, outside: Path, name: str) -> None:
    """Plant ``name`` in a job's progress directory (created by a first observer)."""
    victim = outside / "victim"
    plants = {
        "progress is a file": lambda: (shutil.rmtree(directory), directory.write_text("x")),
        "progress is a symlink": lambda: (shutil.rmtree(directory), directory.symlink_to(outside)),
        "progress.jsonl is a directory": lambda: (directory / PROGRESS_FILE).unlink() or (directory / PROGRESS_FILE).mkdir(),
        "progress.jsonl is a FIFO": lambda: (directory / PROGRESS_FILE).unlink() or os.mkfifo(directory / PROGRESS_FILE),
        "progress.jsonl is a symlink": lambda: (directory / PROGRESS_FILE).unlink() or (directory / PROGRESS_FILE).symlink_to(victim),
        "progress.jsonl.1 is a symlink": lambda: ((directory / f"{PROGRESS_FILE}.1").unlink(missing_ok=True),
                                                  (directory / f"{PROGRESS_FILE}.1").symlink_to(victim)),
        "progress.jsonl.5 is a directory": lambda: (directory / f"{PROGRESS_FILE}.5").mkdir(),
        "progress.jsonl is garbage": lambda: (directory / PROGRESS_FILE).write_bytes(bytes(range(256)) * 50),
        "live.json is a directory": lambda: (directory / LIVE_FILE).unlink() or (directory / LIVE_FILE).mkdir(),
        "live.json is a symlink": lambda: (directory / LIVE_FILE).unlink() or (directory / LIVE_FILE).symlink_to(victim),
        "live.json is garbage": lambda: (directory / LIVE_FILE).write_bytes(b"\xff" * 1000),
        "live.json is read-only": lambda: (directory / LIVE_FILE).chmod(0o444),
    }
    plants[name]()


WRITER_DAMAGE = ["progress is a file", "progress is a symlink", "progress.jsonl is a directory",
                 "progress.jsonl is a FIFO", "progress.jsonl is a symlink", "progress.jsonl.1 is a symlink",
                 "progress.jsonl.5 is a directory", "progress.jsonl is garbage", "live.json is a directory",
                 "live.json is a symlink", "live.json is garbage", "live.json is read-only"]


@pytest.mark.parametrize("damage", WRITER_DAMAGE)
def test_the_writers_never_stop_a_run_nor_write_outside(job_file, tmp_path, caplog, damage):
    job = load_job_config(job_file)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious\n")
    with ProgressObserver(job, max_bytes=2500, keep=5) as first:  # a run before: the files exist
        for batch in range(3):
            first(_result(batch), [])
    _damage_writers(first.directory, outside, damage)
    before = snapshot(outside)
    with caplog.at_level(logging.DEBUG, logger="localstate.progress"):
        observer = ProgressObserver(job, max_bytes=2500, keep=5).start()
        for batch in range(12):  # rotates several times
            observer(_result(batch), [])
            observer.heartbeat.beat(batch)
        observer.close()
    assert snapshot(outside) == before
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) <= 2, warnings  # once per file, not once per batch or beat
    assert not [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG]  # no traceback
    directory = first.directory
    if damage in ("progress.jsonl is garbage", "live.json is garbage", "live.json is read-only"):
        assert not warnings, warnings  # a damaged file's content is replaced or appended after, not refused
        from localstate.runtime.driver.progress import read_last_progress, read_live

        assert read_last_progress(job).value["batch"] == 11
        assert read_live(job).value["state"] == "stopped"
    elif "symlink" in damage:
        assert any("symlink" in w for w in warnings), warnings
    if directory.is_dir() and not directory.is_symlink():
        for path in directory.iterdir():  # the rotation bound holds whatever was in the way
            assert not path.is_file() or path.stat().st_size <= 2500 or damage == "progress.jsonl is garbage"


def test_a_line_after_a_torn_one_starts_on_its_own_line(tmp_path):
    log = ProgressLog(tmp_path)
    log.append(sound_progress(batch=1))
    with open(tmp_path / PROGRESS_FILE, "ab") as handle:
        handle.write(b'{"batch": 2, "tor')
    log.append(sound_progress(batch=3))
    lines = (tmp_path / PROGRESS_FILE).read_bytes().split(b"\n")
    assert json.loads(lines[-2])["batch"] == 3 and lines[1] == b'{"batch": 2, "tor'


def test_heartbeat_never_raises_from_its_thread(tmp_path, caplog):
    directory = tmp_path / "progress"
    directory.write_text("a file where the folder should be")
    beat = Heartbeat(directory, "r", interval=0.02, anchor=tmp_path)
    with caplog.at_level(logging.DEBUG, logger="localstate.progress"):
        beat.start()
        time.sleep(0.3)
        beat.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a directory" in warnings[0].getMessage()
    assert stat.S_ISREG(os.lstat(directory).st_mode)


def test_progress_report_of_a_real_batch_passes_the_reader_checks(job_file):
    from localstate.runtime.driver.operating import progress_problems

    job = load_job_config(job_file)
    progress = ProgressReport.from_batch(job, _result(0), [], run_id="r")
    assert progress_problems(json.loads(json.dumps(progress))) == []
