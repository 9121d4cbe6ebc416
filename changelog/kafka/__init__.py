"""Kafka changelog system (kafka-python): compacted topics, acks=all, transactional fencing.
See docs/kafka.md.

``client`` holds the connection options and client settings; ``io`` the Kafka I/O shared by the
changelog, the ``kafka`` input/output streams (``streams``) and the PySpark Data Source
(``spark_source``): client pools, end-offset probing around Tansu's ListOffsets quirk, exact range
reads, an acknowledged writer. ``devbroker`` starts a throwaway Tansu broker for tests and trying
jobs out.
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
