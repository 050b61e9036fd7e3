"""Copies the destination will delete: ktm keeps the source's record timestamps (CreateTime), so
records older than a destination topic's `retention.ms` are written and then deleted by the
destination's next retention check (a backfill of last month into a topic keeping 7 days).

At the start of a relay (and in `ktm check`) each destination topic that deletes by time is
named with how many of the records still to copy into it are older than now - retention.ms:
counted on the source by timestamp (ListOffsets by time), from each partition's resume point to
its end; a restore counts them in the store (relay.pipelines.restore.retention). Pure: no Kafka
client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from relay.spec import PartitionRoute, SourcePartition


def retention_ms(configs: Mapping[str, str]) -> int | None:
    """How long a destination topic keeps a record by its timestamp; None when it never deletes
    by time (compacted only, retention.ms = -1) or stamps records itself (LogAppendTime)."""
    if "delete" not in configs.get("cleanup.policy", "delete").split(","):
        return None
    if configs.get("message.timestamp.type", "CreateTime") == "LogAppendTime":
        return None
    value = configs.get("retention.ms", "").strip()
    if not value.lstrip("-").isdigit() or int(value) < 0:
        return None
    return int(value)


@dataclass(frozen=True)
class AtRisk:
    """Records to copy into one destination topic that its retention will delete."""

    target_topic: str
    retention_ms: int
    records: int
    partitions: int  # source partitions holding some

    def line(self) -> str:
        return (
            f"destination topic {self.target_topic} deletes records older than retention.ms = "
            f"{self.retention_ms} ({_days(self.retention_ms)}): {self.records} of the records "
            f"to copy into it ({self.partitions} partition(s)) are older than that (ktm keeps "
            "source timestamps), and its next retention check will delete them; raise its "
            "retention.ms before copying them"
        )


def cutoffs(
    routes: list[PartitionRoute], retention: Mapping[str, int | None], now_ms: int
) -> dict[SourcePartition, int]:
    """The timestamp below which each route's records are at risk (routes whose destination
    deletes by time)."""
    found = {}
    for route in routes:
        keep = retention.get(route.target_topic)
        if keep is not None:
            found[route.key] = now_ms - keep
    return found


def at_risk(
    routes: list[PartitionRoute],
    retention: Mapping[str, int | None],
    nexts: Mapping[SourcePartition, int],
    ends: Mapping[SourcePartition, int],
    young: Mapping[SourcePartition, int | None],
) -> list[AtRisk]:
    """Per destination topic, the records from each partition's next offset to its end that
    come before `young` (its first offset recent enough to be kept; None: none is)."""
    counts = {}
    for route in routes:
        key = route.key
        if key in young and key in nexts and key in ends:
            first_kept = ends[key] if young[key] is None else min(young[key] or 0, ends[key])
            counts[key] = max(0, first_kept - nexts[key])
    return by_topic(routes, counts, retention)


def by_topic(
    routes: list[PartitionRoute],
    counts: Mapping[SourcePartition, int],
    retention: Mapping[str, int | None],
) -> list[AtRisk]:
    """Each partition's records at risk summed per destination topic (topics with none left
    out)."""
    records: dict[str, int] = {}
    partitions: dict[str, int] = {}
    for route in routes:
        count = counts.get(route.key, 0)
        if count:
            records[route.target_topic] = records.get(route.target_topic, 0) + count
            partitions[route.target_topic] = partitions.get(route.target_topic, 0) + 1
    return [
        AtRisk(topic, retention.get(topic) or 0, records[topic], partitions[topic])
        for topic in sorted(records)
    ]


def _days(ms: int) -> str:
    hours = ms / 3_600_000
    return f"{hours / 24:g}d" if hours >= 24 else f"{hours:g}h"
