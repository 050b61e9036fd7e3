"""Source batches of one partition into destination batches, with work per batch.

What each source batch becomes:
- a **control batch** (a transaction's commit or abort marker) is never copied: markers are the
  broker's business, and a produced batch may not be one;
- a **transactional data batch** is copied like any other: under read_committed (the default)
  the reader has already dropped the batches of aborted transactions
  (`relay.batches.transactions`), and no fetch reaches past the last stable offset, so what
  arrives here is committed; their offsets are gaps, listed around in the provenance like
  compaction gaps. Under read_uncommitted every transaction's records arrive. The destination
  batch is not transactional: the destination producer is idempotent, not transactional;
- a batch wholly before `start` is skipped; one that starts before it (a fetch that began
  mid-batch after a restart) loses its records before `start`; records at or after `stop`
  (`--stop-at-end`) are left out the same way, and so are records a filter rejected (`drop`).

Small source batches are merged, in order, into destination batches of at most `budget` bytes
of records (uncompressed); a source batch that could be copied and holds at least 1/16 of the
budget stays alone (merging it would re-frame every record for little gain), and a source batch
larger than the budget stays whole, unless its records exceed `limit` (1,000,000 bytes by
default): then it is rebased into batches of the budget.

A destination batch made of one source batch that keeps every record, has no offset gap inside
(compaction) and uses CreateTime is **copied**: its records part is reused byte for byte, only
the last record is re-framed to carry the provenance header, and the batch keeps its first and
max timestamps. Every other destination batch is **rebased**: each record whose offset delta
(now its index in the destination batch, which must run 0..count-1 for the producer's sequence
numbers) or timestamp delta changes is re-framed; its key, value and headers bytes are reused.

Timestamps: the destination batch is always CreateTime. A record from a LogAppendTime source
batch gets its source append time (the batch's max timestamp, which is what a consumer of the
source sees) as its CreateTime: the destination keeps the time the source reports, whatever the
destination topic's own timestamp type then does with it.

The records part is decompressed and compressed once per batch, in the codec libraries; a
compressed part that is not smaller is sent uncompressed (as kafka-python does).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from relay.batches import codecs
from relay.batches.format import CONTROL, SourceBatch
from relay.batches.merge import (
    GROWTH_PER_RECORD,
    Bounds,
    DestBatch,
    Member,
    Origin,
    Rebase,
    finish_batch,
)
from relay.batches.records import last_record_start, parse_at, provenance_header, with_header

__all__ = ["DestBatch", "Origin", "Rebuilt", "finish_batch", "rebuild"]

DEFAULT_BUDGET = 256 * 1024  # [target].batch_size's default
# A source batch whose records exceed this (or the budget, if larger) is split: a destination
# broker's max.message.bytes defaults to 1048588 bytes for a whole batch, and a batch compressed
# at the source may be sent uncompressed. A refused batch would be retried forever.
DEFAULT_LIMIT = 1_000_000
# Room kept in the budget for the last record's provenance header.
PROVENANCE_ROOM = 128
# A copyable source batch of at least this fraction of the budget is sent as it is rather than
# merged: merging re-frames every record, copying re-frames one.
COPY_FRACTION = 16


@dataclass(frozen=True)
class Rebuilt:
    batches: list[DestBatch]
    next_offset: int  # where the next fetch starts: past markers and gaps as well


def rebuild(
    batches: Iterable[SourceBatch],
    start: int,
    origin: Origin,
    codec: int = codecs.NONE,
    budget: int = DEFAULT_BUDGET,
    limit: int = DEFAULT_LIMIT,
    stop: int | None = None,
    drop: AbstractSet[int] = frozenset(),
    copy_fraction: int = COPY_FRACTION,
) -> Rebuilt:
    """Destination batches for the records at or after `start` and before `stop` (None: no
    end), in order, less the offsets in `drop` (records a filter rejected). Each is built as
    soon as it is complete: one destination batch's records are held at a time.
    `copy_fraction` 1 merges every source batch smaller than the budget, copyable or not (the
    writer asks for that when the destination, not the CPU, holds the relay back)."""
    room = budget - PROVENANCE_ROOM
    packer = _Packer((start, stop, drop), origin, codec, room, max(limit, budget), copy_fraction)
    next_offset, add = start, packer.add
    for batch in batches:
        header = batch.header
        if stop is not None and header.base_offset >= stop:
            break
        batch_next = header.base_offset + header.last_offset_delta + 1
        if batch_next > next_offset:
            next_offset = batch_next if stop is None else min(batch_next, stop)
        if batch_next <= start or header.attributes & CONTROL or header.record_count == 0:
            continue
        add(Member(batch, start, stop, drop))
    return Rebuilt(packer.finish(), next_offset)


class _Packer:
    """Members packed, in order, into destination batches of at most `room` bytes of records,
    each built as soon as it is complete (see the module docstring for what stays alone)."""

    def __init__(
        self, bounds: Bounds, origin: Origin, codec: int, room: int, limit: int, fraction: int
    ):
        self.bounds, self.origin, self.codec = bounds, origin, codec
        self.room, self.limit, self.alone_from = room, limit, room // fraction
        self.built: list[DestBatch] = []
        self.group: list[Member] = []
        self.size = 0

    def add(self, member: Member) -> None:
        cost = len(member.records) + GROWTH_PER_RECORD * member.batch.header.record_count
        alone = cost > self.limit or (member.copyable and cost >= self.alone_from)
        if self.group and (alone or self.size + cost > self.room):
            self.built += _build(self.group, self.bounds, self.origin, self.codec)
            self.group, self.size = [], 0
        if cost > self.limit:
            self.built += _split(member, self.bounds, self.origin, self.codec, self.room)
        elif alone:
            self.built += _build([member], self.bounds, self.origin, self.codec)
        else:
            self.group.append(member)
            self.size += cost

    def finish(self) -> list[DestBatch]:
        if self.group:
            self.built += _build(self.group, self.bounds, self.origin, self.codec)
        return self.built


def _build(group: list[Member], bounds: Bounds, origin: Origin, codec: int) -> list[DestBatch]:
    if len(group) == 1 and group[0].copyable:
        return [_copy(group[0], origin, codec)]
    rebase = Rebase(bounds)
    for member in group:
        rebase.take(member)
    rebased = rebase.finish(origin, codec)
    return [rebased] if rebased is not None else []


def _split(
    member: Member, bounds: Bounds, origin: Origin, codec: int, room: int
) -> list[DestBatch]:
    """One source batch too big for one destination batch, rebased into several."""
    out = []
    resume: tuple[int, int] | None = (0, 0)
    while resume is not None:
        rebase = Rebase(bounds, room)
        resume = rebase.take(member, *resume)
        rebased = rebase.finish(origin, codec)
        if rebased is not None:
            out.append(rebased)
    return out


def _copy(member: Member, origin: Origin, codec: int) -> DestBatch:
    batch, records = member.batch, member.records
    header = batch.header
    last = parse_at(records, last_record_start(records, header.record_count))
    provenance = provenance_header(
        origin.cluster, origin.topic, origin.partition, ((batch.base_offset, batch.last_offset),)
    )
    tail = with_header(records, last, last.timestamp_delta, last.offset_delta, provenance)
    part = records[: last.start] + tail
    return DestBatch(
        finish_batch(
            part, codec, header.record_count, header.first_timestamp, header.max_timestamp
        ),
        header.record_count,
        batch.base_offset,
        batch.last_offset,
        len(part),
        True,
        header.max_timestamp,
    )
