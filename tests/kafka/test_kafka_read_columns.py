"""The Kafka input read as columns for a batch task (issue #35), on a real broker (Tansu): chunks
hold exactly the records ``read`` yields, good rows as columns and bad ones (undecodable, keyless)
as records, in offset order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.config import parse_job_config
from localstate.core.stream import open_input
from localstate.core.options import validate_options
from localstate.core.stream import ColumnarInput

pytestmark = pytest.mark.kafka


def test_read_columns_holds_exactly_what_read_yields(tmp_path: Path, kafka_broker, topic_prefix) -> None:
    servers, topic = kafka_broker.bootstrap_servers, topic_prefix + "columns"
    settings = client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "test"))
    assert ensure_topic(settings, topic, 1, -1, create=True) == 1
    records = []
    for i in range(30):
        if i % 11 == 5:
            records.append((b'"k"', b'{"v": NaN}', 0))         # undecodable by the json serde
        elif i % 11 == 7:
            records.append((None, json.dumps({"v": i}).encode(), 0))  # no key
        else:
            records.append((json.dumps(f"k{i % 4}").encode(), json.dumps({"v": i, "ts": 1_700_000_000 + i / 2}).encode(), 0))
    produce(settings, topic, records)
    job = parse_job_config({
        "job": {"name": "kafka-columns", "partitions": 1, "task": "m:T"},
        "inputs": {"events": {"system": "kafka", "bootstrap_servers": servers, "topic": topic,
                              "key_serde": "json", "value_serde": "json", "ts_field": "ts",
                              "connect_timeout": "1s"}},
    }, base_dir=tmp_path)
    source = open_input(job, "events")
    assert isinstance(source, ColumnarInput)
    end = source.end_offset(0)
    assert end == 30
    expected = list(source.read(0, 0, end))
    rows = []
    for chunk in source.read_columns(0, 0, end):
        rows += [(o, k, v, t, None, None) for o, k, v, t in zip(chunk.offsets, chunk.keys, chunk.values,
                                                                chunk.timestamps)]
        rows += [tuple(record) for record in chunk.bad]
        assert chunk.end == max([*chunk.offsets, *(r.offset for r in chunk.bad)]) + 1
    assert sorted(rows, key=lambda row: row[0]) == [tuple(record) for record in expected]
    assert sum(1 for record in expected if record.error) == 6  # offsets 5, 16, 27 and 7, 18, 29
