"""Source offsets by record timestamp (ListOffsets by time), for the retention check of a copy
(relay.retention)."""

from __future__ import annotations

from kafka import TopicPartition

from relay.clients.admin import probe_consumer
from relay.clients.batch_fetch import TP
from relay.config import ClusterConfig


def offsets_from(
    cluster: ClusterConfig, times: dict[TP, int], timeout: float
) -> dict[TP, int | None]:
    """The first offset of each partition whose record timestamp is at or after its time in
    ms (None: no such record)."""
    wanted = {TopicPartition(*tp): ms for tp, ms in times.items()}
    if not wanted:
        return {}
    with probe_consumer(cluster, timeout) as consumer:
        found = consumer.offsets_for_times(wanted, timeout_ms=int(timeout * 1000))
    return {(tp.topic, tp.partition): None if at is None else at.offset for tp, at in found.items()}
