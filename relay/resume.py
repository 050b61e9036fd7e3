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
from typing import Any

from relay import kafka_io
from relay.config import ClusterConfig
from relay.errors import RelayError
from relay.plan import (
    PartitionRoute,
    ResumePoint,
    SourcePartition,
    choose_start,
    last_relayed,
    last_relayed_records,
    same_record,
)

log = logging.getLogger(__name__)


class ContinuityError(RelayError):
    """A new source node does not line up with what was relayed: nothing is skipped silently."""


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


def relayed_records(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> dict[SourcePartition, tuple[int, Any]]:
    """The last source offset found in each destination partition's tail, per source partition,
    with the destination record carrying it.

    Several source partitions may feed one destination partition (a fixed partition, or two
    topics into one); the scan goes back until it has seen each of them or reached the start.
    """
    feeders: dict[tuple[str, int], set[SourcePartition]] = defaultdict(set)
    for route in routes:
        feeders[(route.target_topic, route.target_partition)].add(route.key)

    def satisfied(dest: tuple[str, int], records: list[Any]) -> bool:
        return set(last_relayed(records, feeders[dest])) == feeders[dest]

    tails = kafka_io.read_tails(target, sorted(feeders), satisfied, timeout)
    found: dict[SourcePartition, tuple[int, Any]] = {}
    for dest, records in tails.items():
        found.update(last_relayed_records(records, feeders[dest]))
    return found


def relayed_offsets(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> dict[SourcePartition, int]:
    return {key: offset for key, (offset, _) in relayed_records(target, routes, timeout).items()}


def resume_points(
    source: ClusterConfig,
    routes: list[PartitionRoute],
    group_id: str,
    offsets: SourceOffsets,
    relayed: dict[SourcePartition, int],
    timeout: float,
) -> dict[SourcePartition, ResumePoint]:
    """Each partition's start: after the last relayed offset, or the group's committed offset."""
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


def check_continuity(
    node: ClusterConfig,
    relayed: dict[SourcePartition, tuple[int, Any]],
    on_mismatch: str,
    timeout: float,
) -> None:
    """Refuse to resume on a node whose data differs from what was relayed.

    Identical nodes hold the same record at the same offset. The destination's copy of the last
    relayed record is compared with the node's record at that offset; any difference means the
    offsets do not line up, and resuming would skip or repeat records.
    """
    if not relayed:
        return
    wanted = {key: offset for key, (offset, _) in relayed.items()}
    found = kafka_io.records_at(node, wanted, timeout)
    for key, (offset, copy) in sorted(relayed.items()):
        record = found.get(key)
        if record is not None and same_record(copy, record):
            continue
        what = (
            "has no record" if record is None else "holds a different record (key/value/timestamp)"
        )
        message = (
            f"continuity check failed: source node {node.name} {what} at {key[0]}[{key[1]}] "
            f"offset {offset}, which the destination already holds; resuming there would skip "
            f'or repeat records ([source_pool].on_mismatch = "continue" resumes anyway)'
        )
        if on_mismatch != "continue":
            raise ContinuityError(message)
        log.warning("%s; continuing as configured", message)
