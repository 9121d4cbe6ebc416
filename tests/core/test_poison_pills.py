"""Poison pills: records the reader accepted but the serdes later refused (NaN, Infinity, 1e400,
lone surrogates, nesting that overflows the recursion limit) failed the job on every run, whatever
the input's on_error. Each must now be a bad record at reading, so on_error = "dead_letter" writes it
to the dead-letter output (which itself must accept it) and "skip" counts it; on the jsonl and the
file inputs. The runtime's on_error path is driven directly (``run_partition``), without Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.core.config import load_job_config
from localstate.core.serdes import JsonSerde
from localstate.runtime.spark.affinity.kept import release_kept
from localstate.runtime.spark.runner import PartitionPlan, run_partition
from localstate.core.stream import open_input, open_output
from localstate.errors import SerdeError

HERE = Path(__file__).parent
DEEP = "[" * 50_000 + "]" * 50_000
GOOD = [b'{"key":"a","value":1.5}', b'{"key":"b","value":{"x":[1,2,3]},"ts":1700000017}',
        b'{"key":"c","value":"\\u00e9\\ud83d\\ude00"}']  # a valid surrogate pair is fine
#: Lines a plain json.loads accepts (or dies on) but the serdes cannot encode again.
POISON = [
    b'{"key":"n1","value":NaN}',
    b'{"key":"n2","value":[1,Infinity]}',
    b'{"key":"n3","value":{"v":-Infinity}}',
    b'{"key":"n4","value":1e400}',
    b'{"key":"n5","value":-2.5E+999}',
    b'{"key":"n6","value":1' + b"0" * 400 + b'.0}',
    b'{"key":"n7","ts":1e400,"value":1}',
    b'{"key":"n8","ts":"NaN","value":1}',
    b'{"key":"n9","ts":"inf","value":1}',
    b'{"key":"n10","ts":' + b"9" * 400 + b',"value":1}',
    b'{"key":"s1","value":"\\ud800"}',
    b'{"key":"\\udfff","value":1}',
    b'{"key":"s3","value":{"\\udc80x":1}}',
    b'{"key":"s4","value":["ok","\\ud83d"]}',
    b'{"key":"d1","value":' + DEEP.encode() + b"}",
    DEEP.encode(),
    b'{"key":"d3","value":' + b"[" * 300 + b"]" * 300 + b"}",
]


def _job(tmp_path: Path, system: str, on_error: str, task: str = "KeepLast", dead_path: str = "out") -> Path:
    dead = '\ndead_letter = "dead"' if on_error == "dead_letter" else ""
    source = 'system = "jsonl"\npath = "data"' if system == "jsonl" else 'system = "file"\npath = "data"'
    (tmp_path / "job.toml").write_text(f"""
[job]
name = "poison"
partitions = 1
task = "poison_task:{task}"
state_dir = "state"
pythonpath = ["{HERE}"]

[inputs.events]
{source}
on_error = "{on_error}"{dead}

[outputs.out]
system = "file"
path = "out"

[outputs.dead]
system = "file"
path = "{dead_path}"

[stores.last]
engine = "kv"
key_serde = "json"
value_serde = "json"

""")
    return tmp_path / "job.toml"


def write_lines(tmp_path: Path, system: str, lines: list[bytes],
                file_record: Callable[[bytes], tuple[bytes, bytes]]) -> None:
    """The lines as ``data/0.jsonl`` (jsonl), or as the file input's records ``file_record(line)`` (file)."""
    if system == "jsonl":
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        return
    system_ = FileChangelogSystem({"path": str(tmp_path / "data")}, tmp_path)
    system_.ensure_stream("events", 1)
    writer = system_.partition("events", 0)
    for line in lines:
        writer.append(*file_record(line))
    writer.flush()
    writer.close()


def _file_record(line: bytes) -> tuple[bytes, bytes]:
    """The file input: key and value are the JSON texts of the line's key and value fields, as a
    producer with another JSON library (one that writes NaN, 1e400, lone surrogates) would write them."""
    try:
        data = json.loads(line)  # permissive: NaN, Infinity, 1e400 (inf), lone surrogates
    except RecursionError:
        return b'"k"', line
    value = {k: v for k, v in data.items() if k != "key"} if "ts" in data else data.get("value")
    return json.dumps(data["key"]).encode(), json.dumps(value).encode()  # writes NaN, Infinity


def _write_input(tmp_path: Path, system: str, lines: list[bytes]) -> None:
    write_lines(tmp_path, system, lines, _file_record)


def _run(tmp_path: Path, system: str, on_error: str, lines: list[bytes]) -> tuple[dict, object]:
    _write_input(tmp_path, system, lines)
    job = load_job_config(_job(tmp_path, system, on_error))
    end = open_input(job, "events").end_offset(0)
    assert end == len(lines)
    result = run_partition(job, PartitionPlan(batch=0, partition=0, ranges={"events": (0, end)}, limit=None))
    release_kept()
    return result, job


@pytest.mark.parametrize("system", ["jsonl", "file"])
def test_every_poison_pill_reaches_the_dead_letter_output(tmp_path: Path, system: str) -> None:
    lines = GOOD + POISON + GOOD[:1]
    result, job = _run(tmp_path, system, "dead_letter", lines)
    assert "error" not in result, result
    # a string ts is no event time on either input: a bad record (issue 43)
    assert result["in"] == len(lines) and result["dead"] == len(POISON)
    dead = [value for _, value in open_output(job, "dead").read(0) if isinstance(value, dict) and "raw" in value]
    assert len(dead) == result["dead"]
    # every dead-letter record is plain, writable JSON (a lone surrogate in raw is escaped)
    for record in dead:
        JsonSerde().serialize(record)
        assert record["stream"] == "events" and record["error"]
    assert sorted(record["offset"] for record in dead) == [
        offset for offset, line in enumerate(lines) if line in POISON]
    # the good records went through the task, its store and its output
    assert sorted(key for key, _ in open_output(job, "out").read(0) if key in ("a", "b", "c")) == ["a", "a", "b", "c"]


@pytest.mark.parametrize("system", ["jsonl", "file"])
def test_poison_pills_are_skipped_and_counted(tmp_path: Path, system: str) -> None:
    result, _ = _run(tmp_path, system, "skip", POISON + GOOD)
    assert "error" not in result, result
    assert result["skipped"] == len(POISON)
    assert result["in"] == len(POISON) + len(GOOD)


def test_poison_pill_fails_with_a_typed_error_when_on_error_is_fail(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "jsonl", "fail", GOOD + POISON[:1])
    import pickle
    error = pickle.loads(result["error"])
    assert type(error).__name__ == "InputError"
    assert error.context["offset"] == len(GOOD) and error.context["stream"] == "events"


@pytest.mark.parametrize("data", [b"NaN", b"[Infinity]", b"1e400", b'"\\ud800"', b"[" * 5000 + b"]" * 5000,
                                  b'{"\\udfff":1}', b"\xff"])
def test_json_serde_refuses_at_decoding_what_it_cannot_encode(data: bytes) -> None:
    with pytest.raises(SerdeError):
        JsonSerde().deserialize(data)


@pytest.mark.parametrize("data", [b"1.5", b"-0.0", b"1e300", b'"\\u00e9\\ud83d\\ude00"', b"[" * 200 + b"]" * 200,
                                  b'{"a":[1,{"b":null}]}'])
def test_json_serde_still_decodes_good_values(data: bytes) -> None:
    assert JsonSerde().deserialize(data) == json.loads(data)
