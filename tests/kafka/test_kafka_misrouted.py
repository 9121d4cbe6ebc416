"""A Kafka input's co-partitioning checked (issue 43 item 7), on a real broker (Tansu): a record
produced to another partition than murmur2 of its key gives (a producer with another partitioner)
is a MisroutedRecordError naming the record, or, with ``on_misrouted = "skip"``, skipped and counted.
The executor's feed is driven directly (``run_partition``), without Spark."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.options import validate_options
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.core.stream import open_input
from localstate.errors import MisroutedRecordError
from localstate.runtime.spark.affinity.kept import release_kept
from localstate.runtime.spark.runner import PartitionPlan, run_partition


pytestmark = pytest.mark.kafka


def _settings(servers: str) -> dict:
    return client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "test"))


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_record_in_the_wrong_topic_partition(tmp_path: Path, kafka_broker, topic_prefix, policy: str) -> None:  # noqa: ANN001
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = f"{topic_prefix}misrouted-{policy}"
    assert ensure_topic(settings, topic, 2, -1, create=True) == 2
    keys = [f"k{i}" for i in range(12)]
    stray = next(key for key in keys if partition_for(key, 2) == 1)
    records = [(key.encode(), json.dumps({"ts": 1_700_000_000 + i}).encode(), partition_for(key, 2))
               for i, key in enumerate(keys)]
    records.append((stray.encode(), json.dumps({"ts": 1_700_000_100}).encode(), 0))  # another partitioner's choice
    produce(settings, topic, records)
    job = load_job_config(write_counting_job(
        tmp_path, f"kafka-misrouted-{policy}", partitions=2, events={"on_misrouted": policy},
        kafka={"bootstrap_servers": kafka_broker.bootstrap_servers, "topic": topic},
        store={"backend": "memory", "changelog": False}))
    end = open_input(job, "events").end_offset(0)
    result = run_partition(job, PartitionPlan(batch=0, partition=0, ranges={"events": (0, end)}, limit=None))
    release_kept()
    if policy == "fail":
        error = pickle.loads(result["error"])
        assert isinstance(error, MisroutedRecordError)
        assert (error.context["stream"], error.context["partition"], error.context["offset"],
                error.context["owner"]) == ("events", 0, end - 1, 1)
    else:
        assert result["in"] == end and result["skipped"] == 1 and result["counts"] == {"misrouted": {"events": 1}}
