"""Where each source partition resumes: read from the destination, never assumed.

This module owns the rule, and speaks of the **next offset** only: the first source offset not
yet at the destination. The destination's tail is read as record batches, and the `ktm.src`
provenance header says which source offsets each holds (`relay.provenance.copies` has the rule
for either form of `relay.provenance.header`).

A batch is appended to a partition atomically, so the tail always ends on a record whose header
is complete. A source partition resumes at the next offset after the highest one found, or at
the group's committed offset when that is later (the last records may all have been filtered
out). kaf-relay assumes destination offset N == source offset N; that breaks with filters,
fixed partitions, fan-in, other writers or a log not starting at 0.

A compacted destination's log cleaner removes records a later one supersedes (and tombstones),
in closed segments only: it may remove the record at a batch's last offset, which carries the
batch form's header, and keeps the batch's last offset (Kafka's MemoryRecords.filterTo; a batch
it empties is dropped, unless it is its producer's last). Such a batch has **lost its
provenance**: its surviving records copied source offsets nothing names any more (the header
its last survivor may carry is an earlier hop's, never this hop's). The active segment is
never cleaned, so a destination partition's last batch keeps its header: a partition fed by
one source partition resumes exactly. With several, one may have written its last copies long
ago; when a batch after them lost its provenance or is gone, the destination cannot say
whether it was that source partition's (**unsettled**), and the relay group's committed offset
(committed after the destination acknowledged) decides.

Used by the driver (start-up, after a failed round, on failover) and by a retried task.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from relay.batches import SourceBatch
from relay.batches.records import Record
from relay.clients import admin, tails
from relay.config import ClusterConfig
from relay.errors import KafkaSetupError, RelayError
from relay.provenance.copies import origins, provenance_lost
from relay.provenance.header import PROVENANCE_HEADER
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)


class ContinuityError(RelayError):
    """A new source node does not line up with what was relayed: nothing is skipped silently."""


@dataclass(frozen=True)
class Delivered:
    """The last record the destination holds from one source partition."""

    next_offset: int  # the source offset after it
    record: Record  # the destination's copy (key, value, timestamp compared on failover)
    # Its batch is LogAppendTime (a destination topic with message.timestamp.type=
    # LogAppendTime): its timestamp is the broker's append time, not the source's.
    broker_time: bool = False
    incarnation: int = 0  # of the source topic (relay.provenance.header)

    @property
    def offset(self) -> int:
        return self.next_offset - 1


def unsettled_in(batches: list[SourceBatch], wanted: set[SourcePartition]) -> set[SourcePartition]:
    """The wanted source partitions whose next offset `batches` (a destination partition's
    tail, in order) cannot settle: after the last batch naming them (or anywhere, for one
    none names) lies a batch that lost its provenance, or a gap in offsets (batches the
    cleaner dropped whole): either may have been theirs."""
    named: dict[SourcePartition, int] = {}
    doubt = -1  # the index of the last batch with a doubt just before or in it
    for index, batch in enumerate(batches):
        gap = index > 0 and batch.base_offset > batches[index - 1].next_offset
        if gap or provenance_lost(batch):
            doubt = index
        for provenance, _ in origins(batch):
            named[(provenance.topic, provenance.partition)] = index
    return {key for key in wanted if named.get(key, -1) < doubt}


def delivered_in(
    batches: Iterable[SourceBatch], wanted: set[SourcePartition]
) -> dict[SourcePartition, Delivered]:
    """Per wanted source partition, the highest source offset the batches hold of its latest
    incarnation (a followed topic's copies start over at its log start: relay.provenance.header),
    and the destination record that holds it."""
    found: dict[SourcePartition, Delivered] = {}
    for batch in batches:
        for p, record in origins(batch):
            key = (p.topic, p.partition)
            if key not in wanted:
                continue
            last = found.get(key)
            newest = last is None or (p.incarnation, p.next_offset) >= (
                last.incarnation,
                last.next_offset,
            )
            if newest:
                found[key] = Delivered(p.next_offset, record, batch.log_append_time, p.incarnation)
    return found


class AtDestination(NamedTuple):
    """What the destination's tails say of each source partition."""

    # those it holds records of in their route's incarnation, or a later one (the route is
    # then behind: `later`)
    delivered: dict[SourcePartition, Delivered]
    unsettled: frozenset[SourcePartition]  # those whose next offset it cannot settle
    tails: dict[tuple[str, int], list[SourceBatch]]  # what was read of each partition
    feeders: dict[tuple[str, int], set[SourcePartition]]  # the source partitions of each

    @property
    def next_offsets(self) -> dict[SourcePartition, int]:
        return {key: d.next_offset for key, d in self.delivered.items()}

    def later(self, routes: Iterable[PartitionRoute]) -> list[PartitionRoute]:
        """`routes` at the incarnation the destination holds copies of, where that is later
        (a restart after ktm followed a recreated topic)."""
        held = self.delivered
        return [
            replace(r, incarnation=held[r.key].incarnation)
            if r.key in held and held[r.key].incarnation > r.incarnation
            else r
            for r in routes
        ]


def at_destination(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> AtDestination:
    """What each source partition delivered, from the tail of the destination partitions.

    Several source partitions may feed one destination partition (a fixed partition, or two
    topics into one); the scan goes back until it has seen each of them or reached the start.
    """
    routes = list(routes)
    feeders: dict[tuple[str, int], set[SourcePartition]] = defaultdict(set)
    for route in routes:
        feeders[(route.target_topic, route.target_partition)].add(route.key)

    def satisfied(dest: tuple[str, int], batches: list[SourceBatch]) -> bool:
        return set(delivered_in(batches, feeders[dest])) == feeders[dest]

    found_tails = tails.read_tails(target, sorted(feeders), satisfied, timeout)
    found: dict[SourcePartition, Delivered] = {}
    unsettled: set[SourcePartition] = set()
    for dest, batches in found_tails.items():
        found.update(delivered_in(batches, feeders[dest]))
        unsettled |= unsettled_in(batches, feeders[dest])
    # the copies of an earlier incarnation than the route's say nothing of where it resumes
    incarnations = {route.key: route.incarnation for route in routes}
    found = {k: d for k, d in found.items() if d.incarnation >= incarnations[k]}
    return AtDestination(found, frozenset(unsettled), found_tails, dict(feeders))


def delivered(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> dict[SourcePartition, Delivered]:
    """`at_destination`'s records delivered."""
    return at_destination(target, routes, timeout).delivered


def destination_next_offsets(
    target: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> dict[SourcePartition, int]:
    """The next offset of each source partition the destination holds records of."""
    return at_destination(target, routes, timeout).next_offsets


@dataclass(frozen=True)
class ResumePoint:
    next_offset: int
    reason: str  # "destination" (provenance), "committed" (group offset) or "beginning"


def choose_start(
    key: SourcePartition,
    destination: int | None,
    committed: int | None,
    begin: int,
    end: int,
) -> ResumePoint:
    """Where to resume a source partition, from three next offsets.

    The provenance tail is exact. The group offset is committed only after the destination
    acknowledged, so it is never ahead of the truth either; it matters when the last records were
    all filtered out (nothing in the destination names them). Take the later of the two; the log
    start only when neither says anything. A copy that stopped before the log start resumes
    where it stopped: the first fetch finds the records retention deleted meanwhile, and counts
    them (relay.losses), rather than skip them unsaid.
    """
    candidates = []  # on a tie, max() keeps the first: the most exact reason
    if destination is not None:
        candidates.append(ResumePoint(destination, "destination"))
    if committed is not None:
        candidates.append(ResumePoint(committed, "committed"))
    if not candidates:
        candidates.append(ResumePoint(begin, "beginning"))
    best = max(candidates, key=lambda point: point.next_offset)
    if best.next_offset > end:
        raise KafkaSetupError(
            f"{key[0]}[{key[1]}]: the destination already holds source offsets up to "
            f"{best.next_offset} ({best.reason}) but the source ends at {end}; was the source "
            "topic recreated? Refusing to guess: delete the destination records or the consumer "
            "group offsets."
        )
    return best


@dataclass(frozen=True)
class SourceOffsets:
    begin: dict[SourcePartition, int]
    # Where reading stops (confirmed by a fetch): the log end, or under read_committed the last
    # stable offset
    end: dict[SourcePartition, int]
    # read_committed: a partition's log end, read only for a partition copied past `end`
    log_end: Callable[[SourcePartition], int] | None = None

    def limit(self, key: SourcePartition, copied: int) -> int:
        """The end a copy holding offsets up to `copied` must not pass. Under read_committed, a
        copy an older ktm made read_uncommitted may hold an open transaction's records past the
        last stable offset: only past the log end would it mean a recreated topic."""
        end = self.end[key]
        if copied > end and self.log_end is not None:
            return max(end, self.log_end(key))
        return end


def source_offsets(
    cluster: ClusterConfig, routes: Iterable[PartitionRoute], timeout: float
) -> SourceOffsets:
    begin, end = admin.offset_bounds(cluster, [route.key for route in routes], timeout)
    if not cluster.read_committed:
        return SourceOffsets(begin, end)
    whole = replace(cluster, isolation_level="read_uncommitted")
    return SourceOffsets(begin, end, lambda key: admin.offset_bounds(whole, [key], timeout)[1][key])


def resume_points(
    routes: list[PartitionRoute],
    offsets: SourceOffsets,
    found: dict[SourcePartition, int],
    committed: dict[SourcePartition, int | None],
    unsettled: frozenset[SourcePartition] = frozenset(),
) -> dict[SourcePartition, ResumePoint]:
    """Each partition's next offset: after what the destination holds (`found`), or the
    committed one.

    `offsets` must have been read after `found` and `committed`: both only grow while other
    members relay, so read earlier they cannot pass the end unless the topic was recreated
    (choose_start refuses that), while read later they could, falsely.

    One summary line; each partition's at debug (thousands of lines otherwise), and one
    warning naming those the destination could not settle and no committed offset did."""
    points = {}
    for route in routes:
        key = route.key
        held, done = found.get(key), committed.get(key)
        end = offsets.limit(key, max(held or 0, done or 0))
        point = choose_start(key, held, done, offsets.begin[key], end)
        points[key] = point
        log.debug(
            "resume topic=%s partition=%s next_offset=%s from=%s end=%s",
            key[0],
            key[1],
            point.next_offset,
            point.reason,
            offsets.end[key],
        )
    if points:
        log.info("%s", resume_summary(points, offsets.end))
    warn_unsettled({key: point.next_offset for key, point in points.items()}, unsettled)
    return points


def warn_unsettled(
    nexts: dict[SourcePartition, int], unsettled: frozenset[SourcePartition]
) -> None:
    """One line naming the source partitions that resume where neither the destination nor a
    committed offset could settle (relay.provenance.attribution: survivors of batches that lost
    their provenance may be their records)."""
    doubtful = sorted(key for key in unsettled if key in nexts)
    if not doubtful:
        return
    named = ", ".join(f"{t}[{p}]@{nexts[(t, p)]}" for t, p in doubtful[:5])
    log.warning(
        "%d source partition(s) resume where a compacted destination cannot settle (%s%s): "
        "records after it may be there already, their provenance removed by its log cleaner, "
        "and be copied again",
        len(doubtful),
        named,
        ", ..." if len(doubtful) > 5 else "",
    )


def resume_summary(
    points: dict[SourcePartition, ResumePoint], ends: dict[SourcePartition, int]
) -> str:
    """'resume 2000 partitions of 400 topics: 1990 after the destination's tail, ...'"""
    reasons: dict[str, int] = defaultdict(int)
    for point in points.values():
        reasons[point.reason] += 1
    topics = len({topic for topic, _ in points})
    lag = sum(max(0, ends[key] - point.next_offset) for key, point in points.items())
    how = ", ".join(f"{count} {REASONS[reason]}" for reason, count in sorted(reasons.items()))
    return (
        f"resume {len(points)} partition(s) of {topics} topic(s): {how}; {lag} records behind "
        "the source end (each partition: --debug)"
    )


REASONS = {
    "destination": "after the destination's tail",
    "committed": "at the group's committed offset",
    "beginning": "from the log start",
}


def same_record(copy: Record, source: Record, broker_time: bool = False) -> bool:
    """Continuity fingerprint: a relayed record and a source record are the same record.

    Key, value and CreateTime travel unchanged, so they identify the record across identical
    nodes without trusting offsets alone. `broker_time`: the copy's timestamp is its
    destination's append time (a LogAppendTime topic overwrote what ktm wrote), which says
    nothing of the source record: key, value and headers are compared, not the timestamp.
    """
    if (copy.key, copy.value) != (source.key, source.value):
        return False
    if without_provenance(copy.headers or ()) != list(source.headers or ()):
        return False
    return broker_time or copy.timestamp == source.timestamp


def without_provenance(
    headers: Iterable[tuple[str, bytes | None]],
) -> list[tuple[str, bytes | None]]:
    """A copy's headers less the `ktm.src` header this hop appended after the record's own
    (an earlier hop's, before it, stays: the source record has it too)."""
    found = list(headers)
    return found[:-1] if found and found[-1][0] == PROVENANCE_HEADER else found


def check_continuity(
    node: ClusterConfig,
    at_destination: dict[SourcePartition, Delivered],
    on_mismatch: str,
    timeout: float,
) -> None:
    """Refuse to resume on a node whose data differs from what was relayed.

    Identical nodes hold the same record at the same offset. The destination's copy of the last
    relayed record is compared with the node's record at that offset; any difference means the
    offsets do not line up, and resuming would skip or repeat records.
    """
    if not at_destination:
        return
    found = admin.records_at(node, {k: d.offset for k, d in at_destination.items()}, timeout)
    for key, last in sorted(at_destination.items()):
        record = found.get(key)
        if record is not None and same_record(last.record, record, last.broker_time):
            continue
        compared = "key/value/headers" if last.broker_time else "key/value/headers/timestamp"
        what = "has no record" if record is None else f"holds a different record ({compared})"
        message = (
            f"continuity check failed: source node {node.name} {what} at {key[0]}[{key[1]}] "
            f"offset {last.offset}, which the destination already holds; resuming there would "
            f'skip or repeat records ([source_pool].on_mismatch = "continue" resumes anyway)'
        )
        if on_mismatch != "continue":
            raise ContinuityError(message)
        log.warning("%s; continuing as configured", message)
