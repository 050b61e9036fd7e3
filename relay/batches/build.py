"""Source batches of one partition into destination batches, with work per batch.

What each source batch becomes:
- a **control batch** (a transaction's commit or abort marker) is never copied: markers are the
  broker's business, and a produced batch may not be one;
- a **transactional data batch** is copied like any other (read_uncommitted: what a consumer
  that does not filter transactions sees is what arrives). Records of *aborted* transactions
  are therefore relayed too; dropping them would need the fetch response's aborted-transaction
  list and read_committed semantics, which the relay does not claim. The destination batch is
  not transactional: the destination producer is idempotent, not transactional;
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
from relay.batches.format import CONTROL, LOG_APPEND_TIME, SourceBatch, UnsupportedBatch, assemble
from relay.batches.provenance import provenance_header
from relay.batches.records import last_record_start, parse_at, reframe, with_header
from relay.batches.varint import read_varint

DEFAULT_BUDGET = 256 * 1024  # [target].batch_size's default
# A source batch whose records exceed this (or the budget, if larger) is split: a destination
# broker's max.message.bytes defaults to 1048588 bytes for a whole batch, and a batch compressed
# at the source may be sent uncompressed. A refused batch would be retried forever.
DEFAULT_LIMIT = 1_000_000
# Room kept in the budget: a re-framed record may grow (its offset and timestamp deltas become
# longer varints), and the last record takes the provenance header.
_GROWTH_PER_RECORD = 8
PROVENANCE_ROOM = 128
# A copyable source batch of at least this fraction of the budget is sent as it is rather than
# merged: merging re-frames every record (~1.5 µs each), copying re-frames one.
COPY_FRACTION = 16
_NO_STOP = 1 << 63

# (start, stop, offsets to drop): which records of the source batches a destination batch takes
_Bounds = tuple[int, "int | None", AbstractSet[int]]


@dataclass(frozen=True)
class Origin:
    """The source partition, as the provenance header names it."""

    cluster: str
    topic: str
    partition: int


@dataclass(frozen=True)
class DestBatch:
    payload: bytearray  # a whole batch: base offset 0, producer fields -1 until stamped
    count: int
    first_offset: int  # the first source offset it holds
    last_offset: int  # the last source offset it holds (the provenance range's end)
    records_size: int  # bytes of records before compression
    copied: bool  # the source records part was reused (see the module docstring)
    max_timestamp: int  # its records' latest timestamp (latency samples)


@dataclass(frozen=True)
class Rebuilt:
    batches: list[DestBatch]
    next_offset: int  # where the next fetch starts: past markers and gaps as well


class _Member:
    """A source batch taken into a destination batch, its records part decompressed."""

    __slots__ = ("batch", "records", "copyable")

    def __init__(self, batch: SourceBatch, start: int, stop: int | None, drop: AbstractSet[int]):
        if not batch.crc_ok():
            raise UnsupportedBatch(f"CRC mismatch in the batch at offset {batch.base_offset}")
        header = batch.header
        self.batch = batch
        self.records = batch.records()
        self.copyable = (
            header.base_offset >= start
            and (stop is None or batch.last_offset < stop)
            and not (drop and any(o in drop for o in range(batch.base_offset, batch.next_offset)))
            and header.record_count == header.last_offset_delta + 1  # no compaction gap
            and not header.attributes & LOG_APPEND_TIME
        )


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
    built: list[DestBatch] = []
    group: list[_Member] = []
    size = 0
    room = budget - PROVENANCE_ROOM
    limit = max(limit, budget)
    next_offset = start
    bounds = (start, stop, drop)
    for batch in batches:
        header = batch.header
        if stop is not None and header.base_offset >= stop:
            break
        batch_next = header.base_offset + header.last_offset_delta + 1
        if batch_next > next_offset:
            next_offset = batch_next if stop is None else min(batch_next, stop)
        if batch_next <= start or header.attributes & CONTROL or header.record_count == 0:
            continue
        member = _Member(batch, start, stop, drop)
        cost = len(member.records) + _GROWTH_PER_RECORD * header.record_count
        alone = cost > limit or (member.copyable and cost >= room // copy_fraction)
        if group and (alone or size + cost > room):
            built += _build(group, bounds, origin, codec)
            group, size = [], 0
        if cost > limit:
            built += _split(member, bounds, origin, codec, room)
        elif alone:
            built += _build([member], bounds, origin, codec)
        else:
            group.append(member)
            size += cost
    if group:
        built += _build(group, bounds, origin, codec)
    return Rebuilt(built, next_offset)


def _build(group: list[_Member], bounds: _Bounds, origin: Origin, codec: int) -> list[DestBatch]:
    if len(group) == 1 and group[0].copyable:
        return [_copy(group[0], origin, codec)]
    rebase = _Rebase(bounds)
    for member in group:
        rebase.take(member)
    rebased = rebase.finish(origin, codec)
    return [rebased] if rebased is not None else []


def _split(
    member: _Member, bounds: _Bounds, origin: Origin, codec: int, room: int
) -> list[DestBatch]:
    """One source batch too big for one destination batch, rebased into several."""
    out = []
    resume: tuple[int, int] | None = (0, 0)
    while resume is not None:
        rebase = _Rebase(bounds, room)
        resume = rebase.take(member, *resume)
        rebased = rebase.finish(origin, codec)
        if rebased is not None:
            out.append(rebased)
    return out


def _copy(member: _Member, origin: Origin, codec: int) -> DestBatch:
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


def finish_batch(part: bytes, codec: int, count: int, first_ts: int, max_ts: int) -> bytearray:
    if codec != codecs.NONE:
        compressed = codecs.compress(codec, part)
        if len(compressed) < len(part):
            return assemble(compressed, codec, count, first_ts, max_ts)
    return assemble(part, codecs.NONE, count, first_ts, max_ts)


class _Rebase:
    """Records of several source batches (or of one that cannot be copied) into one batch."""

    def __init__(self, bounds: _Bounds, room: int | None = None):
        self.start, self.stop, self.drop = bounds
        self.runs: list[list[int]] = []  # of the source offsets placed: [first, last]
        self.room = room  # bytes of records it may hold; None: whole members, any size
        self.size = 0
        self.frames: list[bytes] = []
        self.base_ts: int | None = None  # the destination batch's first timestamp
        self.max_ts = -1
        self.first_offset = -1
        # the last record placed: (its records part, its position, its new deltas)
        self.last: tuple[bytes, int, int, int] | None = None
        self.last_offset = -1

    def finish(self, origin: Origin, codec: int) -> DestBatch | None:
        if self.last is None or self.base_ts is None:
            return None  # every record lay before `start`
        records, pos, ts_delta, offset_delta = self.last
        at = parse_at(records, pos)
        runs = [(first, last) for first, last in self.runs]
        provenance = provenance_header(origin.cluster, origin.topic, origin.partition, runs)
        self.frames[-1] = with_header(records, at, ts_delta, offset_delta, provenance)
        part = b"".join(self.frames)
        count = len(self.frames)
        payload = finish_batch(part, codec, count, self.base_ts, self.max_ts)
        return DestBatch(
            payload, count, self.first_offset, self.last_offset, len(part), False, self.max_ts
        )

    def take(self, member: _Member, pos: int = 0, first: int = 0) -> tuple[int, int] | None:
        """Place the member's records at or after `start`, from record `first` at `pos`;
        returns where to go on when the room is full, None once the member is placed. The hot
        loop of merging: the record fields are read inline rather than through `parse_at`."""
        header, records = member.batch.header, member.records
        append_time = header.max_timestamp if header.attributes & LOG_APPEND_TIME else None
        frames, start, base_ts, room = self.frames, self.start, self.base_ts, self.room
        stop = _NO_STOP if self.stop is None else self.stop
        drop = self.drop
        runs = self.runs
        base_offset, first_ts = header.base_offset, header.first_timestamp
        for index in range(first, header.record_count):
            length, body = read_varint(records, pos)
            end = body + length
            if room is not None and frames and self.size + end - pos + _GROWTH_PER_RECORD > room:
                self.base_ts = base_ts
                return pos, index
            old_ts_delta, p = read_varint(records, body + 1)
            old_offset_delta, rest = read_varint(records, p)
            offset = base_offset + old_offset_delta
            if start <= offset < stop and offset not in drop:
                ts = first_ts + old_ts_delta if append_time is None else append_time
                if base_ts is None:
                    base_ts, self.first_offset = ts, offset
                ts_delta, offset_delta = ts - base_ts, len(frames)
                if ts > self.max_ts:
                    self.max_ts = ts
                if ts_delta == old_ts_delta and offset_delta == old_offset_delta:
                    frames.append(records[pos:end])
                else:
                    frames.append(reframe(records, body, rest, end, ts_delta, offset_delta))
                self.size += len(frames[-1])
                self.last = (records, pos, ts_delta, offset_delta)
                self.last_offset = offset
                if runs and runs[-1][1] + 1 == offset:
                    runs[-1][1] = offset
                else:
                    runs.append([offset, offset])
            pos = end
        self.base_ts = base_ts
        if pos != len(records):
            raise UnsupportedBatch(f"the batch at offset {base_offset} has bytes after its records")
        return None
