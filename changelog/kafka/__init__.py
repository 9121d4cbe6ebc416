"""Kafka changelog system (kafka-python): compacted topics, acks=all, transactional fencing.
See docs/kafka.md.

``client`` holds the connection options and client settings shared with the Kafka input/output
streams; ``devbroker`` starts a throwaway Tansu broker for tests and trying jobs out.
"""

from __future__ import annotations

from .client import CONNECTION_OPTIONS, client_settings, kafka_error
from .partition import KafkaChangelogPartition
from .system import KafkaChangelogSystem, check_cleanup_policy

__all__ = [
    "KafkaChangelogSystem",
    "KafkaChangelogPartition",
    "CONNECTION_OPTIONS",
    "client_settings",
    "kafka_error",
    "check_cleanup_policy",
]
