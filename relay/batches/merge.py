"""Records of several source batches re-framed into one destination batch: the hot loop of
merging small batches, where the relay's CPU per record goes when sources write tiny batches.

A destination batch's records need offset deltas 0..count-1 and timestamp deltas from its
first timestamp, so every record of a merged source batch but the first's is re-framed: its
length, timestamp delta and offset delta varints are written anew, its key, value and headers
bytes are reused. The common member, a whole contiguous CreateTime batch (`Member.copyable`),
takes a loop of its own: its offset deltas are its record indexes and its timestamps move by
one shift, so no per-record bookkeeping of runs, bounds or maximum timestamps is needed, and a
member whose shifts are both zero (the first of a destination batch) is appended whole.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from relay.batches import codecs
from relay.batches.format import LOG_APPEND_TIME, SourceBatch, UnsupportedBatch, assemble
from relay.batches.records import (
    SINGLE_BYTES,
    last_record_start,
    parse_at,
    provenance_header,
    reframe,
    with_header,
)
from relay.batches.varint import ENCODED, TABLE_SIZE, encode_varint, read_varint

# Room kept per record in a budget: a re-framed record may grow (its offset and timestamp
# deltas become longer varints).
GROWTH_PER_RECORD = 8
_NO_STOP = 1 << 63

# (start, stop, offsets to drop): which records of the source batches a destination batch takes
Bounds = tuple[int, "int | None", AbstractSet[int]]


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
    copied: bool  # the source records part was reused (see relay.batches.build)
    max_timestamp: int  # its records' latest timestamp (latency samples)


class Member:
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


def add_to_runs(runs: list[list[int]], offset: int) -> None:
    """`offset`, the next one placed, into `runs` ([first, last] of consecutive offsets)."""
    if runs and runs[-1][1] + 1 == offset:
        runs[-1][1] = offset
    else:
        runs.append([offset, offset])


def finish_batch(part: bytes, codec: int, count: int, first_ts: int, max_ts: int) -> bytearray:
    if codec != codecs.NONE:
        compressed = codecs.compress(codec, part)
        if len(compressed) < len(part):
            return assemble(compressed, codec, count, first_ts, max_ts)
    return assemble(part, codecs.NONE, count, first_ts, max_ts)


class Rebase:
    """Records of several source batches (or of one that cannot be copied) into one batch."""

    def __init__(self, bounds: Bounds, room: int | None = None):
        self.start, self.stop, self.drop = bounds
        self.runs: list[list[int]] = []  # of the source offsets placed: [first, last]
        self.room = room  # bytes of records it may hold; None: whole members, any size
        self.size = 0  # bytes of records placed: counted where a room bounds them
        self.parts: list[bytes] = []  # re-framed records and whole records parts, in order
        self.count = 0
        self.base_ts: int | None = None  # the destination batch's first timestamp
        self.max_ts = -1
        self.first_offset = -1
        # the last record placed: (its records part, its position, its new deltas), and the
        # bytes it takes at the end of `parts` (finish replaces them to add the provenance)
        self.last: tuple[bytes, int, int, int] | None = None
        self.last_size = 0
        self.last_offset = -1

    def finish(self, origin: Origin, codec: int) -> DestBatch | None:
        if self.last is None or self.base_ts is None:
            return None  # every record lay before `start`
        records, pos, ts_delta, offset_delta = self.last
        runs = [(first, last) for first, last in self.runs]
        provenance = provenance_header(origin.cluster, origin.topic, origin.partition, runs)
        tail = with_header(records, parse_at(records, pos), ts_delta, offset_delta, provenance)
        part = b"".join(self.parts)
        part = part[: len(part) - self.last_size] + tail
        payload = finish_batch(part, codec, self.count, self.base_ts, self.max_ts)
        return DestBatch(
            payload, self.count, self.first_offset, self.last_offset, len(part), False, self.max_ts
        )

    def take(self, member: Member, pos: int = 0, first: int = 0) -> tuple[int, int] | None:
        """Place the member's records at or after `start`, from record `first` at `pos`;
        returns where to go on when the room is full, None once the member is placed."""
        if member.copyable and self.room is None:
            self._take_whole(member)
            return None
        return self._take_some(member, pos, first)

    def _take_whole(self, member: Member) -> None:
        """Every record of a contiguous CreateTime batch: offset delta = index, one shift."""
        header, records = member.batch.header, member.records
        count = header.record_count
        if self.base_ts is None:
            self.base_ts = header.first_timestamp + parse_at(records, 0).timestamp_delta
            self.first_offset = header.base_offset
        ts_shift, index = header.first_timestamp - self.base_ts, self.count
        if ts_shift == 0 and index == 0:
            last = last_record_start(records, count)
            at = parse_at(records, last)
            self.parts.append(records)
            self.last = (records, last, at.timestamp_delta, count - 1)
            self.last_size = at.end - last
        else:
            self._reframe_all(records, count, ts_shift, index)
        self.count += count
        self.max_ts = max(self.max_ts, header.max_timestamp)
        self.last_offset = header.base_offset + count - 1
        runs = self.runs
        if runs and runs[-1][1] + 1 == header.base_offset:
            runs[-1][1] = self.last_offset
        else:
            runs.append([header.base_offset, self.last_offset])

    def _reframe_all(self, records: bytes, count: int, ts_shift: int, index: int) -> None:
        """The hot loop: varints decoded inline where they are one byte, encoded by lookup."""
        parts, table, single = self.parts, ENCODED, SINGLE_BYTES
        pos = 0
        start = ts = offset = frame = 0
        size_bytes = b""
        for offset in range(index, index + count):
            start = pos
            b = records[pos]
            if b < 0x80:
                length, body = b >> 1, pos + 1
            else:
                length, body = read_varint(records, pos)
            pos = body + length  # the record's end
            b = records[body + 1]
            if b < 0x80:
                ts, rest = ((b >> 1) ^ -(b & 1)) + ts_shift, body + 2
            else:
                ts, rest = read_varint(records, body + 1)
                ts += ts_shift
            rest = rest + 1 if records[rest] < 0x80 else read_varint(records, rest)[1]
            ts_bytes = table[ts] if 0 <= ts < TABLE_SIZE else encode_varint(ts)
            offset_bytes = table[offset] if offset < TABLE_SIZE else encode_varint(offset)
            frame = 1 + len(ts_bytes) + len(offset_bytes) + pos - rest
            size_bytes = table[frame] if frame < TABLE_SIZE else encode_varint(frame)
            parts += (size_bytes, single[records[body]], ts_bytes, offset_bytes, records[rest:pos])
        if pos != len(records):
            raise UnsupportedBatch("a batch has bytes after its records")
        self.last = (records, start, ts, offset)
        self.last_size = len(size_bytes) + frame

    def _take_some(self, member: Member, pos: int, first: int) -> tuple[int, int] | None:
        """Records one by one: bounds, dropped offsets, gaps, append times and room."""
        header, records = member.batch.header, member.records
        append_time = header.max_timestamp if header.attributes & LOG_APPEND_TIME else None
        parts, start, base_ts, room = self.parts, self.start, self.base_ts, self.room
        stop = _NO_STOP if self.stop is None else self.stop
        drop, runs = self.drop, self.runs
        base_offset, first_ts = header.base_offset, header.first_timestamp
        for index in range(first, header.record_count):
            length, body = read_varint(records, pos)
            end = body + length
            if room is not None and self.count and self.size + end - pos + GROWTH_PER_RECORD > room:
                self.base_ts = base_ts
                return pos, index
            old_ts_delta, p = read_varint(records, body + 1)
            old_offset_delta, rest = read_varint(records, p)
            offset = base_offset + old_offset_delta
            if start <= offset < stop and offset not in drop:
                ts = first_ts + old_ts_delta if append_time is None else append_time
                if base_ts is None:
                    base_ts, self.first_offset = ts, offset
                ts_delta, offset_delta = ts - base_ts, self.count
                if ts > self.max_ts:
                    self.max_ts = ts
                if ts_delta == old_ts_delta and offset_delta == old_offset_delta:
                    frame = records[pos:end]
                else:
                    frame = reframe(records, body, rest, end, ts_delta, offset_delta)
                parts.append(frame)
                self.count += 1
                self.size += len(frame)
                self.last, self.last_size = (records, pos, ts_delta, offset_delta), len(frame)
                self.last_offset = offset
                add_to_runs(runs, offset)
            pos = end
        self.base_ts = base_ts
        if pos != len(records):
            raise UnsupportedBatch(f"the batch at offset {base_offset} has bytes after its records")
        return None
