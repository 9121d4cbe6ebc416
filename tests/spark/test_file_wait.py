"""The file inputs wait for appends in the kernel (inotify, :mod:`localstate.core.filewatch`) instead of
being probed: the jsonl and ``file`` inputs' ``wait_for_records`` wakes on an append and on a new
partition file, sleeps through a timeout at little CPU, is not woken for good by bytes below the
positions or an unterminated last line, falls back to probing where inotify cannot be used, and
closes its descriptor with the input. A continuous task waits on them in its busy phase too, and
still reads (and counts) every record through its normal reader."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from counting_job import write_counting_job
from localstate.core import filewatch
from localstate.core.config import load_job_config, parse_job_config
from localstate.core.stream import WaitableInput, open_input, open_output
from localstate.runtime.spark import continuous
from localstate.runtime.spark.continuous import BUSY_FOR, EpochPlan, _run_epoch

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="Linux: inotify, /proc/self/fd")


def _line(i: int) -> str:
    return json.dumps({"key": f"k{i}", "value": i, "ts": 1.0}) + "\n"


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def _jsonl(tmp_path: Path, partitions: int = 2) -> Any:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    job = parse_job_config({"job": {"name": "w", "partitions": partitions, "task": "m:T"},
                            "inputs": {"events": {"system": "jsonl", "path": "data"}}}, base_dir=tmp_path)
    return open_input(job, "events")


def _later(action: Callable[[], None], delay: float = 0.2) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), action()))
    thread.start()
    return thread


def _timed_wait(source: Any, positions: dict[int, int], timeout: float,
                during: Callable[[], None] | None = None) -> tuple[bool, float]:
    """The wait's result and the CPU seconds of the waiting thread; ``during``: done by another
    thread shortly after the wait began."""
    other = _later(during) if during is not None else None
    began = time.thread_time()
    result = source.wait_for_records(positions, timeout)
    cpu = time.thread_time() - began
    if other is not None:
        other.join()
    return result, cpu


def test_jsonl_wait_wakes_on_an_append_and_on_a_new_partition_file(tmp_path: Path) -> None:
    source = _jsonl(tmp_path)
    data = tmp_path / "data"
    _append(data / "0.jsonl", _line(0))
    try:
        assert isinstance(source, WaitableInput) and source.can_wait()
        assert source.wait_for_records({0: 0, 1: 0}, 5.0)  # already there: found at the watch's start
        woke, _ = _timed_wait(source, {0: 1, 1: 0}, 30.0, lambda: _append(data / "0.jsonl", _line(1)))
        assert woke and source.end_offset(0) == 2
        woke, _ = _timed_wait(source, {0: 2, 1: 0}, 30.0,  # partition 1's first file
                               lambda: _append(data / "1.jsonl", _line(2)))
        assert woke and source.end_offset(1) == 1
    finally:
        source.close()


def test_jsonl_wait_times_out_quietly_and_ignores_what_is_not_a_record_past_the_positions(tmp_path: Path) -> None:
    source = _jsonl(tmp_path, partitions=3)
    data = tmp_path / "data"
    _append(data / "0.jsonl", _line(0) + _line(1))
    try:
        # Idle: False after the timeout; the waiting thread sleeps in the kernel (a poll loop of 1 s
        # would use about as much CPU as the wait lasts).
        woke, cpu = _timed_wait(source, {0: 2, 1: 0}, 1.0)
        assert not woke and cpu < 0.1, cpu
        # An unterminated last line, and another partition's file (2 is not waited on), wake the
        # kernel wait but end it only with a complete line past a position.
        woke, cpu = _timed_wait(source, {0: 2, 1: 0}, 1.0, lambda: (_append(data / "0.jsonl", '{"key": "half'),
                                                                    _append(data / "2.jsonl", _line(3))))
        assert not woke and cpu < 0.1, cpu
        # Lines below the positions are no reason to wake either.
        assert not source.wait_for_records({0: 2}, 0.2)
        woke, _ = _timed_wait(source, {0: 2, 1: 0}, 30.0, lambda: _append(data / "0.jsonl", '"}\n'))
        assert woke and source.end_offset(0) == 3
    finally:
        source.close()


def test_file_input_wait_wakes_on_an_append_and_a_new_partition(tmp_path: Path) -> None:
    writer_job = parse_job_config({"job": {"name": "w", "partitions": 2, "task": "m:T"},
                                   "outputs": {"events": {"system": "file", "path": "log"}}}, base_dir=tmp_path)
    reader_job = parse_job_config({"job": {"name": "r", "partitions": 2, "task": "m:T"},
                                   "inputs": {"events": {"system": "file", "path": "log"}}}, base_dir=tmp_path)
    output = open_output(writer_job, "events")
    output.append(0, [("a", {"ts": 1.0})])
    source = open_input(reader_job, "events")
    try:
        assert isinstance(source, WaitableInput) and source.can_wait()
        assert not source.wait_for_records({0: 1, 1: 0}, 0.3)
        appender = _later(lambda: output.append(0, [("b", {"ts": 1.0})]))
        assert source.wait_for_records({0: 1, 1: 0}, 30.0)
        appender.join()
        creator = _later(lambda: output.append(1, [("c", {"ts": 1.0})]))  # partition 1's directory is new
        assert source.wait_for_records({0: 2, 1: 0}, 30.0)
        creator.join()
        assert (source.end_offset(0), source.end_offset(1)) == (2, 1)
    finally:
        source.close()
        output.close()


def test_without_inotify_the_input_says_so_and_the_task_probes(tmp_path: Path, monkeypatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    # A directory that cannot be watched (it is gone): the watch gives up with a warning, not an error.
    source = _jsonl(tmp_path)
    (tmp_path / "data").rmdir()
    try:
        assert source.wait_for_records({0: 0}, 5.0)  # True at once: the caller probes
        assert not source.can_wait() and source._watch.fd == -1
        assert continuous._waitable({"events": source}) == {}
        assert any("cannot wait for appends with inotify" in r.getMessage() for r in caplog.records)
    finally:
        source.close()
    # No inotify in the C library (not Linux): the same, logged at debug.
    monkeypatch.setattr(filewatch, "_libc", None)
    monkeypatch.setattr(filewatch.ctypes, "CDLL", lambda *a, **k: (_ for _ in ()).throw(OSError("no libc")))
    other = _jsonl(tmp_path)
    try:
        assert other.wait_for_records({0: 0}, 5.0) and not other.can_wait()
    finally:
        other.close()


def test_one_descriptor_per_input_closed_with_it(tmp_path: Path) -> None:
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    _jsonl(tmp_path).close()  # makes the directory
    _append(tmp_path / "data" / "0.jsonl", _line(0))
    before = fds()
    for _ in range(200):
        source = _jsonl(tmp_path)
        assert not source.wait_for_records({0: 1}, 0.0)
        assert source._watch.fd >= 0 and fds() == before + 1  # one inotify descriptor, whatever it waits on
        assert not source.wait_for_records({0: 1, 1: 0}, 0.0)
        assert fds() == before + 1
        source.close()
        assert source._watch.fd == -1
    assert fds() == before


def test_a_continuous_task_waits_in_its_busy_phase_and_reads_every_record(tmp_path: Path, monkeypatch) -> None:
    """An epoch run in this process on a jsonl input: records appended while it runs are all fed
    (read by the normal reader after the wait), and after the last of them the task waits on the
    input within BUSY_FOR instead of sleeping BUSY_POLL."""
    path = write_counting_job(tmp_path, "busy-wait", partitions=1, store={"backend": "memory"})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.jsonl").touch()
    (tmp_path / "control").mkdir()
    job = load_job_config(path)
    waits: list[tuple[float, float]] = []  # (when, timeout)
    real_wait = continuous._wait_for_records

    def recording(inputs, opened, timeout, turn):
        waits.append((time.monotonic(), timeout))
        return real_wait(inputs, opened, timeout, turn)

    monkeypatch.setattr(continuous, "_wait_for_records", recording)
    appended: list[float] = []

    def append_some() -> None:
        for batch in range(3):
            time.sleep(0.5)
            _append(tmp_path / "data" / "0.jsonl", "".join(_line(10 * batch + i) for i in range(10)))
            appended.append(time.monotonic())

    writer = threading.Thread(target=append_some)
    writer.start()
    plan = EpochPlan(0, (0,), time.time() + 3.5, "t", str(tmp_path / "control"))
    result = _run_epoch(job, plan)
    writer.join()
    assert result["records"] == {0: 30} and result["reason"] == "epoch"
    # Waits right after each append (within the busy phase), and fewer than a 1 ms poll would make.
    busy = [when for when, _ in waits if any(0 <= when - at < BUSY_FOR for at in appended)]
    assert busy, waits
    assert len(waits) < 200, len(waits)
