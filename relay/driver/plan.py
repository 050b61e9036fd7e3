"""Planning: which source partition goes where, from which offset, up to which offset.

Pure logic, no Kafka and no Spark: the driver feeds it metadata and tail records, and it returns
small picklable task specs for the executors. Exactness rests on the provenance header every
produced record carries, never on destination offsets equalling source offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relay.config import ClusterConfig, TargetConfig, TopicRoute
from relay.errors import KafkaSetupError
from relay.filters import FilterSpec

log = logging.getLogger(__name__)

PROVENANCE_HEADER = "ktm.src"

SourcePartition = tuple[str, int]  # (source topic, partition)


def provenance_prefix(cluster: str, topic: str, partition: int) -> bytes:
    """Header value up to the offset: `cluster/topic/partition/`. Topic names cannot hold '/'."""
    return f"{cluster}/{topic}/{partition}/".encode()


def parse_provenance(value: bytes) -> tuple[str, str, int, int] | None:
    """(cluster, topic, partition, offset) from a header value, None if it is not ktm's."""
    try:
        cluster, topic, partition, offset = value.decode().rsplit("/", 3)
        return cluster, topic, int(partition), int(offset)
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class PartitionRoute:
    topic: str
    partition: int
    target_topic: str
    target_partition: int

    @property
    def key(self) -> SourcePartition:
        return (self.topic, self.partition)


def plan_routes(
    routes: Iterable[TopicRoute],
    source_counts: Mapping[str, int],
    target_counts: Mapping[str, int],
    source_name: str,
    target_name: str = "the target",
) -> list[PartitionRoute]:
    """Expand topic routes into partition routes, refusing anything that would lose records."""
    planned: list[PartitionRoute] = []
    for route in routes:
        if route.source not in source_counts:
            raise KafkaSetupError(
                f"[topics].{route.source}: source topic {route.source!r} does not exist "
                f"on {source_name}"
            )
        if route.target not in target_counts:
            raise KafkaSetupError(
                f"[topics].{route.source}: destination topic {route.target!r} does not exist on "
                "the target (ktm never creates topics; create it with as many partitions as "
                "the source)"
            )
        n_source, n_target = source_counts[route.source], target_counts[route.target]
        if route.partition is None and n_target < n_source:
            raise KafkaSetupError(
                f"[topics].{route.source}: destination {route.target!r} has {n_target} partitions, "
                f"fewer than the source's {n_source}; partition numbers are kept, so add "
                f'partitions or map to a fixed one ("{route.target}:N")'
            )
        if route.partition is not None and route.partition >= n_target:
            raise KafkaSetupError(
                f'[topics].{route.source}: partition {route.partition} of "{route.target}" does '
                f"not exist (it has {n_target} partitions: 0..{n_target - 1})"
            )
        for p in range(n_source):
            dest = p if route.partition is None else route.partition
            planned.append(PartitionRoute(route.source, p, route.target, dest))
    return planned


def last_relayed_records(
    records: Iterable[Any], wanted: set[SourcePartition]
) -> dict[SourcePartition, tuple[int, Any]]:
    """Per wanted source partition: the highest source offset in provenance headers, and the
    destination record that carries it."""
    found: dict[SourcePartition, tuple[int, Any]] = {}
    for record in records:
        for name, value in getattr(record, "headers", None) or ():
            if name != PROVENANCE_HEADER:
                continue
            parsed = parse_provenance(value)
            if parsed is None:
                continue
            _, topic, partition, offset = parsed
            key = (topic, partition)
            if key in wanted and offset >= found.get(key, (-1, None))[0]:
                found[key] = (offset, record)
    return found


def last_relayed(
    records: Iterable[Any], wanted: set[SourcePartition]
) -> dict[SourcePartition, int]:
    """The highest source offset found in provenance headers, per wanted source partition."""
    return {key: offset for key, (offset, _) in last_relayed_records(records, wanted).items()}


def same_record(relayed: Any, source: Any) -> bool:
    """Continuity fingerprint: a relayed record and a source record are the same record.

    Key, value and CreateTime travel unchanged, so they identify the record across identical
    nodes without trusting offsets alone.
    """
    return (relayed.key, relayed.value, relayed.timestamp) == (
        source.key,
        source.value,
        source.timestamp,
    )


@dataclass(frozen=True)
class ResumePoint:
    offset: int
    reason: str  # "destination" (provenance), "committed" (group offset) or "beginning"


def choose_start(
    key: SourcePartition,
    relayed: int | None,
    committed: int | None,
    begin: int,
    end: int,
) -> ResumePoint:
    """Where to resume a source partition.

    The provenance tail is exact. The group offset is committed only after the destination
    acknowledged, so it is never ahead of the truth either; it matters when the last records were
    all filtered out (nothing in the destination names them). Take the later of the two.
    """
    candidates = []  # on a tie, max() keeps the first: the most exact reason
    if relayed is not None:
        candidates.append(ResumePoint(relayed + 1, "destination"))
    if committed is not None:
        candidates.append(ResumePoint(committed, "committed"))
    candidates.append(ResumePoint(begin, "beginning"))
    best = max(candidates, key=lambda point: point.offset)
    if best.offset > end:
        raise KafkaSetupError(
            f"{key[0]}[{key[1]}]: the destination already holds source offset {best.offset - 1} "
            f"({best.reason}) but the source ends at {end}; was the source topic recreated? "
            "Refusing to guess: delete the destination records or the consumer group offsets."
        )
    return best


@dataclass(frozen=True)
class PartitionTask:
    """Everything one executor task needs; pickled to the executor, so keep it small."""

    source: ClusterConfig
    target: TargetConfig
    route: PartitionRoute
    start: int
    stop: int | None  # exclusive; None = relay until the deadline
    deadline: float  # seconds this epoch may run
    group_id: str
    filters: tuple[FilterSpec, ...] = ()


@dataclass(frozen=True)
class TaskResult:
    """What an executor task reports back: small, so the driver can keep every epoch's."""

    key: SourcePartition
    start: int
    next_offset: int  # first source offset NOT yet acknowledged by the destination
    consumed: int = 0
    produced: int = 0
    produced_bytes: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    highwater: int | None = None
    reached_stop: bool = False
    error_kind: str | None = None  # "source", "target", "filter", "internal"
    error: str | None = None
    retriable: bool = False
    elapsed: float = 0.0
    worker_pid: int = 0
    latencies: tuple[float, ...] = ()  # sampled source-timestamp -> destination-ack seconds
