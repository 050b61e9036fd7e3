"""Executor-side reading of one source partition at a time (kafka-python).

A `PartitionReader` is cached per worker process and reused across epochs: it never subscribes
(no group rebalances), it is pointed at one partition per task with assign/seek, and it commits
the source group's offset only for records the destination acknowledged.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from relay.config import ClusterConfig
from relay.kafka_io import client_settings


class PartitionReader:
    def __init__(self, cluster: ClusterConfig, group_id: str, request_timeout: float = 10.0):
        self._consumer = KafkaConsumer(
            **client_settings(cluster, request_timeout),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Short fetch waits keep the loop responsive to its deadline; big fetches keep it fed.
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            max_poll_records=5000,
        )
        self._tp: TopicPartition | None = None
        self._closed = False

    def start(self, topic: str, partition: int, offset: int) -> None:
        tp = TopicPartition(topic, partition)
        if tp != self._tp:
            self._consumer.assign([tp])
            self._tp = tp
        self._consumer.seek(tp, offset)

    def poll(self, timeout: float) -> list[Any]:
        assert self._tp is not None
        batch = self._consumer.poll(timeout_ms=max(1, int(timeout * 1000)))
        return batch.get(self._tp, [])

    def position(self) -> int:
        assert self._tp is not None
        return self._consumer.position(self._tp)

    def highwater(self) -> int | None:
        assert self._tp is not None
        return self._consumer.highwater(self._tp)

    def commit(self, offset: int) -> None:
        assert self._tp is not None
        # Bounded: a dead source node must not hold the task (and the epoch) hostage.
        self._consumer.commit({self._tp: OffsetAndMetadata(offset, "", -1)}, timeout_ms=1500)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close(autocommit=False, timeout_ms=2000)
