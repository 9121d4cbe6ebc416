"""Bad input in a batch (issue #35): hostile lines among good ones, read by the jsonl and file
inputs for a batch task (as columns: ``read_columns``) and for a per-record task (``read``). Each
undecodable row follows the input's ``on_error`` exactly as it does for the per-record task (the
dead letter keeps the row), and nothing else of the batch is lost or applied twice: the same store
contents, outputs, dead letters and counts. The runtime's feed is driven directly
(``run_partition``), without Spark."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.core.serdes import JsonSerde
from localstate.core.stream import open_input, open_output
from localstate.runtime.spark.affinity.kept import release_kept
from localstate.runtime.spark.runner import PartitionPlan, run_partition
from localstate.runtime.driver.views import committed_contents, store_config
from localstate.streams.jsonl import JsonLinesInput

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_poison_pills import DEEP, GOOD, POISON, _job, write_lines  # noqa: E402

#: Hostile lines beyond the poison pills, by what they exercise.
HOSTILE = {
    "deep nesting": b'{"key":"d","value":' + DEEP.encode() + b"}",
    "nesting at the limit": b'{"key":"d2","value":' + b"[" * 255 + b"]" * 255 + b"}",
    "bad utf-8": b'{"key":"u","value":"\xff\xfe"}',
    "encoded surrogate": b'{"key":"u2","value":"\xed\xa0\x80"}',
    "NaN": b'{"key":"n","value":NaN}',
    "Infinity": b'{"key":"i","value":[1,-Infinity]}',
    "huge line": b'{"key":"h","value":"' + b"x" * 2_000_000 + b'"}',
    "huge number": b'{"key":"big","value":' + b"9" * 40 + b"}",
    "int beyond 64 bits": b'{"key":"b64","value":18446744073709551617}',
    "not an object": b"[1,2,3]",
    "a bare number": b"42",
    "a bare string": b'"text"',
    "empty object": b"{}",
    "null key": b'{"key":null,"value":1}',
    "duplicate keys": b'{"key":"a","key":"dup","value":1,"value":{"x":2}}',
    "mixed value types": b'{"key":"m","value":7}',
    "string ts": b'{"key":"t","value":1,"ts":"12.5"}',
    "bool ts": b'{"key":"t2","value":1,"ts":true}',
    "trailing garbage": b'{"key":"g","value":1} x',
    "two objects": b'{"key":"g2"}{"key":"g3"}',
    "carriage return": b'{"key":"cr","value":1}\r',
    "escaped text": b'{"key":"e\\u00e9","value":"\\ud83d\\ude00"}',
}
CASES = {**HOSTILE, **{f"poison {i}": line for i, line in enumerate(POISON)}}


def _file_record(line: bytes) -> tuple[bytes, bytes]:
    """A file-log record: a JSON object's key and value as their JSON texts (written by a permissive
    encoder: NaN, lone surrogates), anything else as the value bytes."""
    try:
        data = json.loads(line)
        return json.dumps(data["key"]).encode(), json.dumps(data.get("value")).encode()
    except Exception:  # noqa: BLE001 - not an object with a key, undecodable, too deep: as it is
        return b'"raw"', line


def _write_input(tmp_path: Path, system: str, lines: list[bytes]) -> None:
    """The lines as a jsonl file, or as file-log records (:func:`_file_record`)."""
    write_lines(tmp_path, system, lines, _file_record)


def _run(tmp_path: Path, system: str, on_error: str, task: str, lines: list[bytes]) -> dict[str, Any]:
    """Run one batch over ``lines``; what it did: counts, store contents, outputs, dead letters."""
    tmp_path.mkdir()
    _write_input(tmp_path, system, lines)
    job = load_job_config(_job(tmp_path, system, on_error, task, dead_path="dead"))
    end = open_input(job, "events").end_offset(0)
    result = run_partition(job, PartitionPlan(batch=0, partition=0, ranges={"events": (0, end)}, limit=None))
    release_kept()
    if "error" in result:
        import pickle
        error = pickle.loads(result["error"])
        return {"error": (type(error).__name__, error.context.get("offset"))}
    checkpoint = Checkpoint(**result["checkpoint"])
    state = committed_contents(job, store_config(job, "last"), 0, checkpoint)
    return {"in": result["in"], "skipped": result.get("skipped"), "dead": result.get("dead"), "state": state,
            "out": list(open_output(job, "out").read(0)), "dead letters": list(open_output(job, "dead").read(0))}


def _both(tmp_path: Path, system: str, on_error: str, lines: list[bytes]) -> dict[str, Any]:
    per_record = _run(tmp_path / "record", system, on_error, "KeepLast", lines)
    batch = _run(tmp_path / "batch", system, on_error, "KeepLastBatch", lines)
    assert batch == per_record
    return per_record


@pytest.mark.parametrize("system", ["jsonl", "file"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_row_among_good_ones_is_handled_as_for_a_per_record_task(tmp_path: Path, system: str,
                                                                           case: str) -> None:
    lines = GOOD + [CASES[case]] + GOOD[::-1]
    seen = _both(tmp_path, system, "dead_letter", lines)
    assert seen["in"] == len(lines)
    # every good row reached the output, once each
    assert sum(1 for key, _ in seen["out"] if key in ("a", "b", "c")) == 2 * len(GOOD)
    assert len(seen["dead letters"]) == seen["dead"]
    for letter in seen["dead letters"]:
        assert letter[1]["offset"] == len(GOOD) and letter[1]["raw"] is not None


@pytest.mark.parametrize("on_error", ["skip", "fail"])
@pytest.mark.parametrize("case", ["bad utf-8", "deep nesting", "not an object", "Infinity", "NaN"])
def test_skip_and_fail_match_the_per_record_task(tmp_path: Path, on_error: str, case: str) -> None:
    lines = GOOD + [HOSTILE[case]] + GOOD
    seen = _both(tmp_path, "jsonl", on_error, lines)
    if on_error == "fail":
        assert seen == {"error": ("InputError", len(GOOD))}
    else:
        assert seen["skipped"] == 1 and seen["in"] == len(lines)


def test_every_row_of_a_batch_is_applied_once_across_chunks(tmp_path: Path) -> None:
    """More rows than one column chunk holds, bad rows scattered over the chunks."""
    lines = []
    for i in range(10_000):
        lines.append(POISON[i % len(POISON)] if i % 997 == 0 else
                     json.dumps({"key": f"k{i % 300}", "value": i if i % 3 else float(i)}).encode())
    seen = _both(tmp_path, "jsonl", "dead_letter", lines)
    assert seen["in"] == len(lines) and seen["dead"] == len(range(0, 10_000, 997))
    assert len(seen["out"]) == len(lines) - seen["dead"]


# -- the jsonl input's two readers, line by line ---------------------------------------------------
_PIECES = st.sampled_from([b'"s"', b"1", b"-0", b"1.5", b"1e400", b"NaN", b"null", b"true", b"[]", b"{}",
                           b"18446744073709551617", b"9223372036854775807", b"1234567890123456789",
                           b'"\\u00e9"', b'"\\ud800"', b'"\xff"', b'"\xc3\xa9"', b"[[[[1]]]]", b"0.1",
                           b'"12.5"', b"2.5e-3", b"-1E5"])


@st.composite
def _lines(draw: Any) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:  # anything at all
        return draw(st.binary(max_size=40)).replace(b"\n", b" ")
    fields = []
    if kind != 1:
        fields.append(b'"key":' + draw(_PIECES))
    if draw(st.booleans()):
        fields.append(b'"value":' + draw(_PIECES))
    if draw(st.booleans()):
        fields.append(b'"ts":' + draw(_PIECES))
    if kind == 2 and fields:
        fields.append(fields[0])  # a duplicate field
    body = b"{" + b",".join(draw(st.permutations(fields))) + b"}"
    return body if kind != 3 else body + draw(st.sampled_from([b" ", b"\r", b",", b"]"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_lines(), min_size=1, max_size=30))
def test_read_columns_yields_exactly_what_read_yields(tmp_path_factory: Any, lines: list[bytes]) -> None:
    tmp = tmp_path_factory.mktemp("cols")
    (tmp / "data").mkdir()
    (tmp / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (tmp / "job.toml").write_text('[job]\nname = "j"\npartitions = 1\ntask = "m:T"\n'
                                  '[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    source = open_input(load_job_config(tmp / "job.toml"), "events")
    assert isinstance(source, JsonLinesInput)
    records = list(source.read(0, 0, len(lines)))
    rows = []
    for chunk in source.read_columns(0, 0, len(lines)):
        keys, values, times = (c.to_pylist() if hasattr(c, "to_pylist") else c  # Arrow columns or lists
                               for c in (chunk.keys, chunk.values, chunk.timestamps))
        rows.extend(zip(chunk.offsets, keys, values, times))
        rows.extend((r.offset, r.error, r.raw) for r in chunk.bad)
    rows.sort(key=lambda row: row[0])
    expected = [(r.offset, r.key, r.value, r.ts) if r.error is None else (r.offset, r.error, r.raw) for r in records]
    # repr: 1 and 1.0, True and 1 are equal but not the same value
    assert repr(rows) == repr(expected)
    for row in expected:  # what was read is what the json serde writes again
        if len(row) == 4:
            JsonSerde().serialize(row[2])


@pytest.mark.parametrize("chunk", [
    [b'{"key":"a","ts":-0}', b'{"key":"b","ts":1.5}', b'{"key":"c","ts":-0.0}'],  # a float column (Arrow)
    [b'{"key":"a","ts":-0}', b'{"key":"b","ts":2}'],                               # an int column (Arrow)
    [b'{"key":"a","ts":-0.0}', b'{"key":"b","ts":"x"}', b'{"key":"c","ts":-0}'],     # a bad line among them
    [b'{"key":"a","ts":-0.0,"value":{"x":[1,{"y":2}]}}', b'{"key":"b","ts":-0}'],    # nested values
], ids=["floats", "ints", "with-a-bad-line", "nested"])
@pytest.mark.parametrize("unit", ["s", "ms"])
def test_a_negative_zero_timestamp_is_zero_on_every_path(tmp_path: Path, chunk: list[bytes], unit: str) -> None:
    """A ``ts`` of -0 or -0.0 is event time 0.0 (not -0.0) whichever reader reads it: a column
    reader cannot tell the two apart, and the row reader must give what the columns give."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in chunk))
    (tmp_path / "job.toml").write_text('[job]\nname = "j"\npartitions = 1\ntask = "m:T"\n'
                                       f'[inputs.events]\nsystem = "jsonl"\npath = "data"\ntimestamp_unit = "{unit}"\n')
    source = open_input(load_job_config(tmp_path / "job.toml"), "events")
    rows = [record.ts for record in source.read(0, 0, len(chunk)) if record.error is None]
    columns = []
    for part in source.read_columns(0, 0, len(chunk)):
        times = part.timestamps.to_pylist() if hasattr(part.timestamps, "to_pylist") else list(part.timestamps)
        columns.extend(times)
    zeros = [ts for ts in rows + columns if ts == 0.0]
    assert zeros and all(repr(ts) == "0.0" for ts in zeros), (rows, columns)
    assert repr(rows) == repr(columns)


_ordinary_value = st.one_of(
    st.integers(-10 ** 6, 10 ** 6), st.text(alphabet="abc /-é", max_size=4), st.booleans(), st.none(),
    st.lists(st.integers(0, 9), max_size=3), st.fixed_dictionaries({"page": st.text(alphabet="ab", max_size=3)}),
    st.fixed_dictionaries({"a": st.integers(0, 3), "b": st.integers(0, 3)}), st.floats(-10, 10))


@st.composite
def _ordinary_lines(draw: Any) -> bytes:
    """Mostly lines an ordinary producer writes (Arrow's reader takes such chunks whole), with now and
    then one that must send the chunk another way: two objects on a line, an object over two lines,
    fields in another order, a missing key, a duplicate field."""
    fields = {"key": draw(st.one_of(st.text(alphabet="kxy", min_size=1, max_size=3), st.integers(0, 99)))}
    if draw(st.booleans()):
        fields["value"] = draw(_ordinary_value)
    if draw(st.booleans()):
        fields["ts"] = draw(st.one_of(st.integers(0, 10 ** 6), st.floats(0, 10 ** 6), st.none()))
    odd = draw(st.integers(0, 30))
    if odd == 1:
        return json.dumps(fields).encode() + json.dumps(fields).encode()  # two objects on one line
    if odd == 2:
        return b'{"key":"s","value":[1,'  # an object continued on the next line ...
    if odd == 3:
        return b'2]}'                      # ... and its end
    if odd == 4:
        fields = dict(reversed(list(fields.items())))
    if odd == 5:
        fields.pop("key")
    text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    return text[:-1] + b',"key":"dup"}' if odd == 6 else text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_ordinary_lines(), min_size=1, max_size=40))
def test_read_columns_of_ordinary_lines_is_exactly_read(tmp_path_factory: Any, lines: list[bytes]) -> None:
    test_read_columns_yields_exactly_what_read_yields.hypothesis.inner_test(tmp_path_factory, lines)


def test_ordinary_lines_are_read_by_arrow_as_columns(tmp_path: Path) -> None:
    import pyarrow as pa

    (tmp_path / "data").mkdir()
    lines = [json.dumps({"key": f"u{i % 7}", "value": {"page": f"/p{i}"}, "ts": 1_700_000_000 + i}).encode() for i in range(50)]
    (tmp_path / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (tmp_path / "job.toml").write_text('[job]\nname = "j"\npartitions = 1\ntask = "m:T"\n'
                                       '[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    [chunk] = open_input(load_job_config(tmp_path / "job.toml"), "events").read_columns(0, 0, 50)
    assert isinstance(chunk.keys, pa.Array) and isinstance(chunk.values, pa.Array)
    assert chunk.values.to_pylist() == [{"page": f"/p{i}"} for i in range(50)]
    assert chunk.timestamps.to_pylist() == [float(1_700_000_000 + i) for i in range(50)] and chunk.end == 50


@pytest.mark.parametrize("poison", [None, 0, 5_000, 9_999])
def test_a_read_larger_than_a_column_chunk_is_exactly_read(tmp_path: Path, poison: int | None) -> None:
    """A read of more lines than a column chunk holds: ordinary lines come as one Arrow batch; one
    line Arrow cannot take sends the read through chunks of ``COLUMN_ROWS`` lines, and every row is
    still exactly what :meth:`read` yields, each once, in order."""
    import pyarrow as pa

    from localstate.core.stream import COLUMN_ROWS
    from localstate.streams.jsonl import READ_ROWS

    n = min(READ_ROWS, 10_000)
    assert n > COLUMN_ROWS
    lines = [json.dumps({"key": f"u{i % 7}", "value": {"page": f"/p{i}"}, "ts": 1_700_000_000 + i}).encode() for i in range(n)]
    if poison is not None:
        lines[poison] = POISON[1]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (tmp_path / "job.toml").write_text('[job]\nname = "j"\npartitions = 1\ntask = "m:T"\n'
                                       '[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    test_read_columns_yields_exactly_what_read_yields.hypothesis.inner_test(
        _Factory(tmp_path / "again"), lines)
    chunks = list(open_input(load_job_config(tmp_path / "job.toml"), "events").read_columns(0, 0, n))
    if poison is None:
        [chunk] = chunks
        assert isinstance(chunk.keys, pa.Array) and chunk.end == n and len(chunk.offsets) == n
    else:
        assert len(chunks) == -(-n // COLUMN_ROWS) and sum(len(c.bad) for c in chunks) == 1
        assert [c.end for c in chunks] == [min(n, (i + 1) * COLUMN_ROWS) for i in range(len(chunks))]


class _Factory:
    """``tmp_path_factory`` for one direct call of the hypothesis test's body."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path


_SHAPES = [
    [b'{"key":"a","value":{"page":"x"},"ts":1}', b'{"key":"b","value":{"page":"y"},"ts":2}'],
    [b'{"key":1,"value":{"page":"x"},"ts":1}', b'{"key":2,"value":{"page":"y"},"ts":2.5}'],
    [b'{"key":"a","value":{"page":1},"ts":1}', b'{"key":"b","value":{"page":2}}'],
    [b'{"key":"a","value":"s"}', b'{"key":"b","value":null,"ts":null}'],
    [b'{"key":"a","value":{"page":"x","q":1},"ts":1}', b'{"key":"b","value":{"page":"y"},"ts":1,"z":2}'],
    [b'{"key":"a","value":{}}', b'{"key":"b"}'],
    [b'{"key":"a","value":[1,2]}', b'{"key":"b","value":[]}'],
    [b'{"key":"a","value":{"page":"x"},"ts":99999999999999999999}', b'{"key":"b","value":9223372036854775807}'],
    [b'{"key":"a","value":{"page":null},"ts":1}', b'{"key":"b","value":{"page":"y"},"ts":1}'],
    [b'{"key":"a","ts":1234567890123456789}', b'{"key":"b","ts":-9223372036854775808}'],  # beyond 2**53
]


@pytest.mark.parametrize("before", range(len(_SHAPES)))
def test_the_schema_remembered_from_a_chunk_never_changes_what_the_next_reads(tmp_path: Path, before: int) -> None:
    """The Arrow schema kept from one chunk of an input is tried first on the next: whatever shape
    the next chunk has, every row is still exactly what :meth:`read` yields."""
    for index, after in enumerate(_SHAPES):
        for turn, shape in enumerate((_SHAPES[before], after)):  # the first chunk's schema is remembered
            test_read_columns_yields_exactly_what_read_yields.hypothesis.inner_test(
                _Factory(tmp_path / f"{index}-{turn}"), shape * 3)


def test_a_read_stops_at_its_byte_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Long lines: a read takes lines only up to ``READ_BYTES`` (whole column chunks of them), and
    the rows are still every line, once, in order."""
    from localstate.core.stream import COLUMN_ROWS
    from localstate.streams import jsonl

    monkeypatch.setattr(jsonl, "READ_BYTES", 3 * COLUMN_ROWS * 100)
    n = 10 * COLUMN_ROWS
    lines = [json.dumps({"key": f"u{i % 7}", "value": "x" * 80, "ts": 1_700_000_000 + i}).encode() for i in range(n)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (tmp_path / "job.toml").write_text('[job]\nname = "j"\npartitions = 1\ntask = "m:T"\n'
                                       '[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    chunks = list(open_input(load_job_config(tmp_path / "job.toml"), "events").read_columns(0, 0, n))
    assert [c.end for c in chunks] == [min(n, i * 3 * COLUMN_ROWS) for i in range(1, len(chunks) + 1)]
    assert [key for c in chunks for key in c.keys.to_pylist()] == [f"u{i % 7}" for i in range(n)]
