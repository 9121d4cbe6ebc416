"""`localstate reset --yes` never deletes a Kafka topic that is also one of the job's inputs or
outputs, even when a store's changelog is named so that its topic is that topic (real broker)."""

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from tests.kafka.test_kafka_runtime import write_reset_job


def test_reset_keeps_a_changelog_topic_that_is_the_input_topic(tmp_path, kafka_broker, topic_prefix, capsys):
    job_file = write_reset_job(tmp_path, "resetsafe", kafka_broker, topic_prefix,
                               inputs=f'[inputs.events]\nsystem = "kafka"\ntopic = "{topic_prefix}events"\n',
                               store='changelog = "events"\n')
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    system.ensure_stream("events", 1)  # the input topic, as the producer of the input created it
    assert main(["reset", str(job_file), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "keeping changelog 'events'" in out and "input or output topic" in out
    assert system.describe("events") == 1
    system.close()
