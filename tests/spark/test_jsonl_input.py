"""The JSON-lines input decodes every kind of line exactly like ``json.loads`` would (its fast path
calls the decoder's scanner directly and must fall back for anything it does not take whole)."""

from __future__ import annotations

import json

from localstate.core.config import parse_job_config
from localstate.core.stream import open_input

LINES = [
    b'{"key":"a","value":{"page":"/p/1"},"ts":1700000000}\n',
    b'  {"key": "b", "value": 2, "ts": 1.5}  \n',                 # padded
    b'{"key":"c","value":null}\r\n',                              # CRLF
    b'{"key":"d","value":1} {"key":"e"}\n',                       # extra data
    b"{this is not json\n",
    b"[1, 2, 3]\n",                                               # not an object
    b"5\n",
    b"\n",                                                        # empty
    b'{"value":1}\n',                                             # no key
    b'{"key":null,"value":1}\n',                                  # null key
    b'{"key":"\xc3\xa9t\xc3\xa9","value":"\\u00e9","ts":NaN}\n',   # unicode, NaN (refused: not JSON)
    b'{"key":"\xc3\xa9t\xc3\xa9","value":"\\u00e9","ts":1}\n',     # unicode
    b'{"key":"f","value":1}\xff\n',                               # invalid UTF-8
    b'{"key":["g",1],"value":{"deep":[{"x":true}]},"ts":"7"}\n',
]


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _expected(offset: int, line: bytes) -> tuple:
    """Independent reference: json.loads on the decoded line (NaN and Infinity refused: the json serde
    could not encode them again)."""
    try:
        data = json.loads(line.decode("utf-8"), parse_constant=_refuse)
        key = data["key"]
        if key is None:
            raise KeyError("key")
        ts = data.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            return offset, None, None, None, "timestamp"  # a timestamp that is no number: a bad record
        return offset, key, data.get("value"), float(ts) if ts is not None else None, None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return offset, None, None, None, "missing key" if isinstance(exc, KeyError) else f"undecodable: {exc}"


def test_every_line_decodes_like_json_loads(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.jsonl").write_bytes(b"".join(LINES) + b'{"key":"partial"')  # last line incomplete
    job = parse_job_config({"job": {"name": "j", "partitions": 1, "task": "x:Y"},
                            "inputs": {"events": {"system": "jsonl", "path": str(tmp_path / "in"),
                                                  "on_error": "skip"}}}, base_dir=tmp_path)
    source = open_input(job, "events")
    assert source.end_offset(0) == len(LINES)
    records = list(source.read(0, 0, len(LINES)))
    got = [(r.offset, r.key, r.value, r.ts, r.error) for r in records]
    expected = [_expected(i, line) for i, line in enumerate(LINES)]
    for g, e in zip(got, expected):
        if e[3] != e[3]:  # NaN
            assert g[3] != g[3] and g[:3] + g[4:] == e[:3] + e[4:]
        elif e[4] == "timestamp":
            assert g[4] is not None and "not a number" in str(g[4]), g
        else:
            assert g == e
    assert len(got) == len(expected)
    assert sum(r.error is None for r in records) == 4  # the fifth good-looking line's ts is a string
    # Resuming mid-file (the next batch) gives the same records.
    again = [(r.offset, r.error is None) for r in source.read(0, 5, len(LINES))]
    assert again == [(e[0], e[4] is None) for e in expected[5:]]
