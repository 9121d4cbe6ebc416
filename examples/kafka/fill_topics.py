"""Fill the input topics of a job's Kafka variant with the records of its original inputs.

    python examples/kafka/fill_topics.py examples/windowed_counts/job.toml examples/windowed_counts/job_kafka.toml

For every ``system = "kafka"`` input of the second job, the same-named input of the first job
(usually the deterministic ``generator``) is copied into the topic: partition ``p`` to topic
partition ``p`` (the topic is created with the job's partition count when missing), keys and
values encoded with the Kafka input's serdes. The Kafka job then reads exactly the records the
original job reads, so both produce the same results.
"""

from __future__ import annotations

import argparse
import sys

from localstate.core.config import load_job_config
from localstate.core.stream import open_input
from localstate.changelog.kafka.streams import KafkaInput, copy_input_to_topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="job file whose inputs hold the records (e.g. the generator job)")
    parser.add_argument("kafka_job", help="job file with the Kafka inputs to fill")
    args = parser.parse_args(argv)
    source = load_job_config(args.source)
    target = load_job_config(args.kafka_job)
    if source.partitions != target.partitions:
        print(f"the jobs have different partition counts ({source.partitions} vs {target.partitions})",
              file=sys.stderr)
        return 2
    for name in sorted(target.inputs):
        kafka = open_input(target, name)
        if not isinstance(kafka, KafkaInput):
            continue
        if name not in source.inputs:
            print(f"skipping input {name!r}: {args.source} has no input of that name", file=sys.stderr)
            continue
        copied = copy_input_to_topic(source, name, kafka.settings, kafka.topic,
                                     key_serde=kafka.config["key_serde"], value_serde=kafka.config["value_serde"])
        print(f"{name}: {copied:,} records -> topic {kafka.topic!r} on {kafka.servers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
