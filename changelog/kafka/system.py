"""The Kafka changelog system: one compacted topic per changelog stream, one topic partition per
job partition. Production target: Apache Kafka; tests run against Tansu (see docs/kafka.md).

A job selects it with ``changelog = "kafka"`` and configures it under ``[changelogs.kafka]``::

    [job]
    changelog = "kafka"

    [changelogs.kafka]
    bootstrap_servers = "kafka-1:9092,kafka-2:9092"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_plain_username = "jobs"
    sasl_plain_password_env = "KAFKA_PASSWORD"   # secret read from the environment
    topic_prefix = "prod-"
    commit_timeout = "30s"
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Mapping

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from localstate.core.changelog import ChangelogSystem
from localstate.core.names import check_name
from localstate.core.options import Option, parse_duration, parse_size
from localstate.errors import ChangelogError, ConfigError

from .client import CONNECTION_OPTIONS, bootstrap_servers, client_settings, kafka_error
from .partition import KafkaChangelogPartition

__all__ = ["KafkaChangelogSystem", "check_cleanup_policy", "COMPRESSION"]

log = logging.getLogger(__name__)

COMPRESSION = ("none", "gzip", "snappy", "lz4", "zstd")
_MAX_TOPIC = 249


def _topic_prefix(value: str) -> str:
    if value and not all(c.isalnum() or c in "._-" for c in value):
        raise ValueError(f"may only contain letters, digits, '.', '_' and '-', got {value!r}")
    if len(value) > _MAX_TOPIC - 200:
        raise ValueError(f"must be at most {_MAX_TOPIC - 200} characters (Kafka topic names are limited to 249)")
    return value


def _topic_config(value: dict[str, Any]) -> dict[str, str]:
    config = {}
    for key, item in value.items():
        if isinstance(item, (dict, list)):
            raise ValueError(f"{key}: expected a string or number, got {type(item).__name__}")
        config[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
    if config.get("cleanup.policy", "compact") != "compact":
        raise ValueError("cleanup.policy of a changelog topic must be 'compact' (records must never expire)")
    return config


def check_cleanup_policy(topic: str, configs: Mapping[str, str], servers: str) -> None:
    """Check a changelog topic's described configuration.

    ``cleanup.policy`` must be exactly ``compact``: with ``delete`` (or ``compact,delete``) Kafka
    drops old records after the retention time and a restore would silently miss state. Raises
    ChangelogError. A broker that does not report the policy gets a logged warning: the policy is
    then unverified, not wrong. (Tansu reports only configs set explicitly on the topic, and with
    DescribeConfigs' default "modified" filter nothing at all.)
    """
    policy = configs.get("cleanup.policy")
    if policy is None:
        log.warning("changelog topic %s: the broker did not report cleanup.policy, so it cannot be verified "
                    "(Tansu reports only configs set on the topic); make sure it is 'compact'", topic)
        return
    if policy.replace(" ", "") != "compact":
        raise ChangelogError(
            f"changelog topic {topic!r} has cleanup.policy={policy!r}; a changelog needs 'compact'",
            topic=topic, bootstrap_servers=servers,
            hint=f"run: kafka-configs.sh --bootstrap-server {servers.split(',')[0]} --alter --entity-type topics "
                 f"--entity-name {topic} --add-config cleanup.policy=compact  (state may already be incomplete "
                 "if records expired: then `localstate reset` the job)")


class KafkaChangelogSystem(ChangelogSystem):
    """Changelogs as compacted Kafka topics, written with ``acks=all`` by a transactional producer
    per changelog partition (``changelog = "kafka"``)."""

    description = "compacted Kafka topics (kafka-python); acks=all, transactional zombie fencing"
    options: ClassVar[Mapping[str, Option]] = {
        **CONNECTION_OPTIONS,
        "topic_prefix": Option(str, default="", parse=_topic_prefix,
                               doc="prepended to every changelog stream name to form the topic name"),
        "create_topics": Option(bool, default=True,
                                doc="create missing topics (one partition per job partition, cleanup.policy=compact)"),
        "replication_factor": Option(int, default=-1, minimum=-1,
                                     doc="replication factor of created topics; -1 = the broker default"),
        "topic_config": Option(dict, default={}, parse=_topic_config,
                               doc="extra configs of created topics, e.g. {'min.insync.replicas' = '2'}"),
        "commit_timeout": Option((int, float, str), default=30.0, parse=parse_duration, minimum=0.1,
                                 doc="a changelog flush (at commit) that takes longer fails ('30s')"),
        "linger": Option((int, float, str), default=0.005, parse=parse_duration,
                         doc="producer linger: wait this long to fill batches ('5ms')"),
        "batch_size": Option((int, str), default=256 << 10, parse=parse_size, minimum=1024,
                             doc="producer batch size per partition"),
        "max_request_size": Option((int, str), default=1 << 20, parse=parse_size, minimum=1024,
                                   doc="largest produce request (and record); keep <= the topic's max.message.bytes"),
        "compression": Option(str, default="none", choices=COMPRESSION, doc="producer compression"),
        "fetch_bytes": Option((int, str), default=8 << 20, parse=parse_size, minimum=1024,
                              doc="bytes fetched per request when restoring"),
        "transactions": Option(bool, default=True,
                               doc="fence older writers of a partition with a transactional producer "
                                   "(needs transactional.id ACLs); false: idempotent producer, no fencing"),
        "transactional_id_prefix": Option(str, default="localstate-",
                                          doc="transactional.id = <prefix><topic>.<partition>"),
    }

    def __init__(self, options: Mapping[str, Any] | None = None, state_dir: Path | str = ".") -> None:
        # Options may arrive already validated (JobConfig keeps validated tables): None means unset.
        raw = {name: value for name, value in (options or {}).items() if value is not None}
        validated = self.validate(raw, "changelogs.kafka")
        super().__init__(validated, Path(state_dir))
        self.servers = bootstrap_servers(validated)
        #: kafka-python keyword arguments shared by every client (secrets resolved from the environment).
        self.client: dict[str, Any] = client_settings(validated, path="changelogs.kafka")
        self._admin: KafkaAdminClient | None = None
        self._streams: dict[str, int] = {}       # stream -> partition count, once created or checked
        self._open: list[KafkaChangelogPartition] = []

    @classmethod
    def validate(cls, raw: Mapping[str, Any], path: str) -> dict[str, Any]:
        validated = super().validate(raw, path)
        if validated["batch_size"] > validated["max_request_size"]:
            raise ConfigError.at(f"{path}.batch_size", "must not exceed max_request_size")
        return validated

    # ---------------------------------------------------------------- names

    def topic(self, stream: str) -> str:
        """The Kafka topic of a changelog stream: ``<topic_prefix><stream>``."""
        check_name(stream, "changelog stream", "changelog.stream")
        return f"{self.config['topic_prefix']}{stream}"

    def stream_location(self, stream: str) -> tuple[str, str]:
        """``("kafka", <topic>)``: where outputs must never write."""
        return "kafka", self.topic(stream)

    # ---------------------------------------------------------------- topics

    def admin(self) -> KafkaAdminClient:
        """The shared admin client (connects on first use; raises ChangelogError if unreachable)."""
        if self._admin is None:
            try:
                self._admin = KafkaAdminClient(**self.client)
            except KafkaError as exc:
                raise kafka_error(exc, "connect to Kafka for the changelogs", self.servers) from exc
        return self._admin

    def describe(self, stream: str) -> int | None:
        """The partition count of the stream's topic, or None if the topic does not exist."""
        topic = self.topic(stream)
        try:
            described = self.admin().describe_topics([topic])
        except KafkaError as exc:
            if type(exc).__name__ == "UnknownTopicOrPartitionError":
                return None
            raise kafka_error(exc, "describe the changelog topic", self.servers, topic=topic) from exc
        for entry in described:
            if entry.get("name") == topic:
                if entry.get("error_code"):
                    return None  # 3 = UNKNOWN_TOPIC_OR_PARTITION
                return len(entry.get("partitions") or [])
        return None

    def ensure_stream(self, stream: str, partitions: int) -> None:
        """Create the stream's topic (``partitions`` partitions, ``cleanup.policy=compact``) when
        missing and ``create_topics``; otherwise check its partition count and cleanup policy."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError.at("changelog.partitions", f"must be an integer >= 1, got {partitions!r}")
        topic = self.topic(stream)
        known = self._streams.get(stream)
        if known is None:
            known = self.describe(stream)
            if known is None:
                known = self._create(stream, topic, partitions)
            self._check_policy(topic)
            self._streams[stream] = known
        if known != partitions:
            raise ChangelogError(
                f"changelog topic {topic!r} has {known} partitions but the job uses {partitions}",
                stream=stream, topic=topic, bootstrap_servers=self.servers,
                hint="the partition count of a job cannot change (state is partitioned by it, and Kafka cannot "
                     "shrink a topic): run the job with its previous partition count, or start over with a new "
                     "job name or topic_prefix (or delete the topic, losing the changelog)")

    def _create(self, stream: str, topic: str, partitions: int) -> int:
        if not self.config["create_topics"]:
            raise ChangelogError(
                f"changelog topic {topic!r} does not exist", stream=stream, topic=topic,
                bootstrap_servers=self.servers,
                hint=f"create it with {partitions} partition(s) and cleanup.policy=compact, or set "
                     "create_topics = true in [changelogs.kafka]")
        configs = {**self.config["topic_config"], "cleanup.policy": "compact"}
        try:
            self.admin().create_topics([NewTopic(topic, partitions, self.config["replication_factor"],
                                                 topic_configs=configs)],
                                       timeout_ms=int(self.config["request_timeout"] * 1000))
            log.info("created changelog topic %s with %d partition(s), configs %s", topic, partitions, configs)
        except KafkaError as exc:
            if type(exc).__name__ != "TopicAlreadyExistsError":
                raise kafka_error(exc, "create the changelog topic", self.servers, topic=topic) from exc
            # Another instance created it between our describe and create: check what it made.
        count = self.describe(stream)
        if count is None:
            raise ChangelogError(f"changelog topic {topic!r} was created but cannot be described",
                                 topic=topic, bootstrap_servers=self.servers,
                                 hint="check the broker logs and the principal's DESCRIBE permission")
        return count

    def cleanup_policy(self, stream: str) -> str | None:
        """The topic's ``cleanup.policy`` as the broker reports it, or None when it does not report one."""
        return self._describe_configs(self.topic(stream)).get("cleanup.policy")

    def _check_policy(self, topic: str) -> None:
        check_cleanup_policy(topic, self._describe_configs(topic), self.servers)

    def _describe_configs(self, topic: str) -> dict[str, str]:
        try:
            # 'all': a topic left at the broker default (usually 'delete') must be reported too. No key
            # filter: Tansu drops the connection on a DescribeConfigs request that names keys.
            result = self.admin().describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)],
                                                   config_filter="all")
        except KafkaError as exc:
            if isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)):
                raise kafka_error(exc, "describe the changelog topic's configuration", self.servers,
                                  topic=topic) from exc
            # Not allowed (no DESCRIBE_CONFIGS ACL) or not supported: unverified, not wrong.
            log.warning("changelog topic %s: cannot read its configuration (%s: %s)", topic, type(exc).__name__, exc)
            return {}
        return _config_map(result, topic)

    def delete_stream(self, stream: str) -> bool:
        """Delete the stream's topic (what ``localstate reset`` needs for Kafka changelogs).
        Returns False if it did not exist. Every record is lost."""
        topic = self.topic(stream)
        try:
            self.admin().delete_topics([topic], timeout_ms=int(self.config["request_timeout"] * 1000))
        except KafkaError as exc:
            if type(exc).__name__ == "UnknownTopicOrPartitionError":
                return False
            raise kafka_error(exc, "delete the changelog topic", self.servers, topic=topic) from exc
        self._streams.pop(stream, None)
        log.info("deleted changelog topic %s", topic)
        return True

    # ---------------------------------------------------------------- partitions

    def _check_partition(self, stream: str, partition: int) -> None:
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ChangelogError(f"invalid partition {partition!r}", stream=stream, hint="partitions are integers >= 0")
        count = self._streams.get(stream)
        if count is None:
            count = self.describe(stream)
        if count is None:
            raise ChangelogError(f"changelog topic {self.topic(stream)!r} does not exist", stream=stream,
                                 bootstrap_servers=self.servers,
                                 hint="call ensure_stream() first (the runtime does), or create the topic")
        if partition >= count:
            raise ChangelogError(f"partition {partition} does not exist: topic {self.topic(stream)!r} has {count}",
                                 stream=stream, partition=partition, bootstrap_servers=self.servers,
                                 hint="use a partition number below the topic's partition count")

    def partition(self, stream: str, partition: int) -> KafkaChangelogPartition:
        """Open one partition for writing and reading; with ``transactions`` this fences every older
        writer of the same partition."""
        self._check_partition(stream, partition)
        opened = KafkaChangelogPartition(self, stream, partition, writable=True)
        self._open.append(opened)
        return opened

    def reader(self, stream: str, partition: int) -> KafkaChangelogPartition:
        """Open one partition read-only (no producer, fences nobody)."""
        self._check_partition(stream, partition)
        opened = KafkaChangelogPartition(self, stream, partition, writable=False)
        self._open.append(opened)
        return opened

    def release_partition(self, partition: KafkaChangelogPartition) -> None:
        """Stop tracking ``partition`` (opened by :meth:`partition` or :meth:`reader`): called by the
        partition's own ``close()``, so that :meth:`close` does not close it again. Idempotent."""
        if partition in self._open:
            self._open.remove(partition)

    def close(self) -> None:
        """Close every partition opened through this system, and the admin client."""
        for partition in list(self._open):
            partition.close()
        self._open.clear()
        if self._admin is not None:
            try:
                self._admin.close()
            except Exception:  # noqa: BLE001 - closing must not fail the caller
                log.debug("closing the Kafka admin client failed", exc_info=True)
            self._admin = None


def _config_map(result: Any, topic: str) -> dict[str, str]:
    """DescribeConfigs results as {name: value}; kafka-python's shape varies between versions."""
    if isinstance(result, dict):  # kafka-python 3: {'topic': {name: {name: value...}}}
        for kind in result.values():
            if isinstance(kind, dict) and topic in kind:
                entries = kind[topic]
                if isinstance(entries, dict):
                    return {str(k): (v.get("value") if isinstance(v, dict) else v) for k, v in entries.items()}
        return {}
    configs: dict[str, str] = {}
    for response in result if isinstance(result, list) else [result]:
        for resource in getattr(response, "resources", []) or []:
            # (error_code, error_message, resource_type, resource_name, config_entries)
            if len(resource) >= 5 and resource[3] == topic:
                for entry in resource[4]:
                    configs[str(entry[0])] = entry[1]
    return configs
