"""Where each source partition resumes: read from the destination, never assumed.

On start (and after a failed epoch) the driver reads the tail of every destination partition,
finds the last source offset each source partition delivered (the `ktm.src` provenance header)
and resumes right after it. kaf-relay assumes destination offset N == source offset N; that
breaks with filters, fixed partitions, fan-in, other writers or a log not starting at 0.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from relay import kafka_io
from relay.config import ClusterConfig
from relay.plan import PartitionRoute, ResumePoint, SourcePartition, choose_start, last_relayed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceOffsets:
    begin: dict[SourcePartition, int]
    end: dict[SourcePartition, int]  # the real log end (confirmed by a fetch)


def source_offsets(
    cluster: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> SourceOffsets:
    keys = [route.key for route in routes]
    begin, end = kafka_io.offset_bounds(cluster, keys, timeout)
    return SourceOffsets(begin, end)


def relayed_offsets(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> dict[SourcePartition, int]:
    """The last source offset found in each destination partition's tail, per source partition.

    Several source partitions may feed one destination partition (a fixed partition, or two
    topics into one); the scan goes back until it has seen each of them or reached the start.
    """
    feeders: dict[tuple[str, int], set[SourcePartition]] = defaultdict(set)
    for route in routes:
        feeders[(route.target_topic, route.target_partition)].add(route.key)

    def satisfied(dest: tuple[str, int], records: list[object]) -> bool:
        return set(last_relayed(records, feeders[dest])) == feeders[dest]

    tails = kafka_io.read_tails(target, sorted(feeders), satisfied, timeout)
    found: dict[SourcePartition, int] = {}
    for dest, records in tails.items():
        found.update(last_relayed(records, feeders[dest]))
    return found


def resume_points(
    source: ClusterConfig,
    target: ClusterConfig,
    routes: list[PartitionRoute],
    group_id: str,
    offsets: SourceOffsets,
    timeout: float,
) -> dict[SourcePartition, ResumePoint]:
    relayed = relayed_offsets(target, routes, timeout)
    committed = kafka_io.committed_offsets(source, group_id, [r.key for r in routes], timeout)
    points = {}
    for route in routes:
        key = route.key
        points[key] = choose_start(
            key, relayed.get(key), committed.get(key), offsets.begin[key], offsets.end[key]
        )
        log.info(
            "resume topic=%s partition=%s offset=%s from=%s end=%s",
            key[0],
            key[1],
            points[key].offset,
            points[key].reason,
            offsets.end[key],
        )
    return points
