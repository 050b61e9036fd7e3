"""The records ktm verify compares, as each side gives them: a source's records in offset order
(`expected`: those the copy must hold), and a copy's records with the source offset each names
(`claims`: the provenance header of a Kafka destination's batch, or a store's own offsets).

A record is compared as the bytes a relay copies unchanged: its key, value and headers as
framed in its batch (`Copy`), with its timestamp (and the timestamp's type where the copy keeps
it). Nothing is decoded but the records a filter must see. A destination batch in LogAppendTime
(a topic with `message.timestamp.type=LogAppendTime`) holds the broker's append time, not the
timestamp ktm wrote: its records' timestamps are not compared.

Whole batches: a relay copies a source batch that needs no change byte for byte but for its
last record (`relay.batches.build`). A source batch every record of which must be in the copy
comes as a `Whole`, and a destination batch whose provenance names one run of source offsets
record for record as a `BatchClaim`; the checker compares such a pair without parsing their
records (relay.pipelines.verify.compare), and falls back to record by record otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple, overload

from relay.batches import SourceBatch
from relay.batches.encode import frame_fields
from relay.batches.format import CONTROL, LOG_APPEND_TIME
from relay.batches.records import Decoded, RecordAt, decode_at, last_record_start, parse_at
from relay.batches.varint import encode_varint, read_varint
from relay.pipelines.verify.spec import Copy, Feeder, Scope
from relay.provenance.header import Provenance, last_provenance

if TYPE_CHECKING:  # executors import the store only to restore
    from relay.store.records import StoredRecord

FIELDS = ("key", "value", "headers", "timestamp", "timestamp_type")


class Whole(NamedTuple):
    """A source batch every record of which the copy must hold, not read record by record."""

    first: int  # its first offset (contiguous: every offset up to `last` holds a record)
    last: int
    first_timestamp: int
    part: bytes  # the records part, decompressed
    record_count: int
    kind: int  # the timestamp type compared (-1: not compared)

    def records(self) -> Iterator[tuple[int, Copy]]:
        pos = 0
        for _ in range(self.record_count):
            at = parse_at(self.part, pos)
            yield (
                self.first + at.offset_delta,
                copy_of(self.part, at, self.first_timestamp + at.timestamp_delta, self.kind),
            )
            pos = at.end


# A source record the copy must hold (None: outside the scope, not checked), or a whole batch.
Expected = tuple[int, Copy | None] | Whole


class Claim(NamedTuple):
    provenance: Provenance | None  # None: the record names no source
    source_offset: int
    dest_offset: int
    copy: Copy


class BatchClaim(NamedTuple):
    """A destination batch whose provenance names one run of source offsets, one per record."""

    provenance: Provenance
    dest_first: int
    first_timestamp: int
    part: bytes
    record_count: int

    def claims(self) -> Iterator[Claim]:
        """Record by record (when it cannot be checked whole)."""
        offsets = (o for first, last in self.provenance.runs for o in range(first, last + 1))
        pos = 0
        for index, source_offset in zip(range(self.record_count), offsets, strict=False):
            at = parse_at(self.part, pos)
            ts = self.first_timestamp + at.timestamp_delta
            copy = copy_of(self.part, at, ts, strip=index == self.record_count - 1)
            yield Claim(self.provenance, source_offset, self.dest_first + at.offset_delta, copy)
            pos = at.end

    def last_claim(self, last_start: int) -> Claim:
        at = parse_at(self.part, last_start)
        copy = copy_of(self.part, at, self.first_timestamp + at.timestamp_delta, strip=True)
        return Claim(self.provenance, self.provenance.last, self.dest_first + at.offset_delta, copy)


def _records(batch: SourceBatch, buf: bytes) -> Iterator[tuple[RecordAt, int, int]]:
    """(record, offset, timestamp) of each record of a data batch whose records part is `buf`:
    only the varints that frame a record are read, nothing is decoded."""
    header = batch.header
    append_time = header.max_timestamp if header.attributes & LOG_APPEND_TIME else None
    pos = 0
    for _ in range(header.record_count):
        at = parse_at(buf, pos)
        ts = header.first_timestamp + at.timestamp_delta if append_time is None else append_time
        yield at, header.base_offset + at.offset_delta, ts
        pos = at.end


def copy_of(
    buf: bytes, at: RecordAt, timestamp: int | None, kind: int = -1, strip: bool = False
) -> Copy:
    """A record's key, value and headers as they are framed in their batch (the bytes a relay
    copies unchanged), its timestamp and type. `strip`: without its last header (the
    provenance header ktm appended: `relay.batches.records.with_header` in reverse)."""
    if not strip:
        return buf[at.rest : at.end], timestamp, kind
    key_length, pos = read_varint(buf, at.rest)
    value_length, pos = read_varint(buf, pos + max(key_length, 0))
    pos += max(value_length, 0)
    count, first = read_varint(buf, pos)
    last = first
    for _ in range(count - 1):
        last = _header_end(buf, last)
    return buf[at.rest : pos] + encode_varint(count - 1) + buf[first:last], timestamp, kind


def stored_copy(record: StoredRecord, keep_type: bool) -> Copy:
    """A stored record (relay.store.StoredRecord) framed as a batch frames it."""
    kind = record.timestamp_type if keep_type else -1
    return frame_fields(record.key, record.value, record.headers), record.timestamp, kind


def differing_field(wanted: Copy, got: Copy) -> str | None:
    """The first of key, value, headers, timestamp and its type in which two copies differ
    (None: equal). A copy with no timestamp (the broker's append time) is compared without."""
    if got[1] is None:
        wanted = (wanted[0], None, wanted[2])
    if wanted == got:
        return None
    for name, a, b in zip(FIELDS, _fields(wanted[0]), _fields(got[0]), strict=False):
        if a != b:
            return name
    return "timestamp" if wanted[1] != got[1] else "timestamp_type"


def _fields(body: bytes) -> tuple[bytes, bytes, bytes]:
    key_length, pos = read_varint(body, 0)
    key_end = pos + max(key_length, 0)
    value_length, value_at = read_varint(body, key_end)
    value_end = value_at + max(value_length, 0)
    return body[:key_end], body[key_end:value_end], body[value_end:]


def _header_end(buf: bytes, pos: int) -> int:
    name_length, pos = read_varint(buf, pos)
    value_length, pos = read_varint(buf, pos + name_length)
    return pos + max(value_length, 0)


def expected(
    batches: Iterable[list[SourceBatch]],
    feeder: Feeder,
    scope: Scope,
    kept: Callable[[Decoded], bool] | None,
    keep_type: bool = False,
) -> Iterator[Expected]:
    """The source records of a Kafka partition in [start, end) that must be in the copy (those
    the config's filters keep; `kept` None: no filters), in offset order; those outside the
    scope (`--sample`, the time window) come as None: read, not checked. A batch all of
    whose records are to be checked as they are comes whole."""
    whole = kept is None and scope.everything and not keep_type
    for chunk in batches:
        for batch in chunk:
            if batch.next_offset <= feeder.start or batch.header.attributes & CONTROL:
                continue
            if batch.header.base_offset >= feeder.end:
                return
            if not scope.picks_any(feeder.key, batch.base_offset, batch.next_offset):
                continue  # --sample: nothing in it is checked, and claims of it are ignored
            if whole and _whole(batch, feeder):
                h = batch.header
                yield Whole(
                    h.base_offset,
                    batch.last_offset,
                    h.first_timestamp,
                    batch.records(),
                    h.record_count,
                    -1,
                )
                continue
            yield from _expected_records(batch, feeder, scope, kept, keep_type)


def _whole(batch: SourceBatch, feeder: Feeder) -> bool:
    h = batch.header
    return (
        h.record_count > 1
        and batch.contiguous
        and not h.attributes & LOG_APPEND_TIME
        and feeder.start <= h.base_offset
        and batch.next_offset <= feeder.end
    )


def _expected_records(
    batch: SourceBatch,
    feeder: Feeder,
    scope: Scope,
    kept: Callable[[Decoded], bool] | None,
    keep_type: bool,
) -> Iterator[tuple[int, Copy | None]]:
    topic, partition = feeder.key
    header = batch.header
    kind = (1 if header.attributes & LOG_APPEND_TIME else 0) if keep_type else -1
    buf = batch.records()
    for at, offset, ts in _records(batch, buf):
        if offset >= feeder.end:
            return
        if offset < feeder.start:
            continue
        if not scope.covers(topic, partition, offset, ts):
            yield offset, None
        elif kept is None or kept(decode_at(buf, at, header.base_offset, ts)):
            yield offset, copy_of(buf, at, ts, kind)


def expected_stored(
    records: Iterable[StoredRecord], feeder: Feeder, scope: Scope, keep_type: bool = False
) -> Iterator[Expected]:
    """The same for a stored partition (restore's source): its records in [start, end)."""
    topic, partition = feeder.key
    for record in records:
        offset = record.offset
        if offset >= feeder.end:
            return
        if offset < feeder.start:
            continue
        if scope.covers(topic, partition, offset, record.timestamp):
            yield offset, stored_copy(record, keep_type)
        else:
            yield offset, None


@overload
def claims(
    batch: SourceBatch, wanted: Callable[[Provenance], bool] | None = None
) -> Iterator[Claim]: ...
@overload
def claims(
    batch: SourceBatch, wanted: Callable[[Provenance], bool] | None, whole: bool
) -> Iterator[Claim | BatchClaim]: ...
def claims(
    batch: SourceBatch, wanted: Callable[[Provenance], bool] | None = None, whole: bool = False
) -> Iterator[Claim | BatchClaim]:
    """What a destination batch holds: each record with the source offset it copies. The
    batch form's header (on the last record) lists the runs of offsets of all its records;
    otherwise each record carries its own (the record form). `wanted`: a batch-form batch it
    refuses is skipped unread (`--sample`). `whole`: a batch naming one run, a record per
    offset, comes whole (a BatchClaim)."""
    header = batch.header
    if batch.is_control or header.record_count < 1:
        return
    buf = batch.records()
    at = parse_at(buf, last_record_start(buf, header.record_count))
    last = decode_at(buf, at, header.base_offset, header.first_timestamp + at.timestamp_delta)
    found = last_provenance(last.headers)
    if found is not None and found.batch:
        if wanted is not None and not wanted(found):
            return
        one = BatchClaim(
            found, header.base_offset, header.first_timestamp, buf, header.record_count
        )
        fits = found.records == header.record_count
        if whole and fits and len(found.runs) == 1 and not header.attributes & LOG_APPEND_TIME:
            yield one
        elif fits and not header.attributes & LOG_APPEND_TIME:
            yield from one.claims()
        else:
            yield from _batch_form(batch, buf, found if fits else None)
        return
    for at, offset, ts in _records(batch, buf):
        own = last_provenance(decode_at(buf, at, header.base_offset, ts).headers)
        if own is None or own.batch:
            yield Claim(None, -1, offset, copy_of(buf, at, _compared(batch, ts)))
        else:
            yield Claim(own, own.first, offset, copy_of(buf, at, _compared(batch, ts), strip=True))


def _compared(batch: SourceBatch, timestamp: int) -> int | None:
    """A destination record's timestamp as compared: None where its batch is LogAppendTime
    (the destination broker's time, not the one ktm wrote)."""
    return None if batch.header.attributes & LOG_APPEND_TIME else timestamp


def _batch_form(batch: SourceBatch, buf: bytes, found: Provenance | None) -> Iterator[Claim]:
    """A batch-form batch read record by record: its timestamps as the batch says (none where
    it is LogAppendTime), and each record's source offset from the runs (when they fit its
    records)."""
    offsets = [o for first, end in found.runs for o in range(first, end + 1)] if found else []
    count = batch.header.record_count
    for index, (at, offset, ts) in enumerate(_records(batch, buf)):
        copy = copy_of(buf, at, _compared(batch, ts), strip=index == count - 1)
        yield Claim(found, offsets[index] if found else -1, offset, copy)
