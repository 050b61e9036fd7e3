"""One source partition compared with the records ktm wrote for it, in one pass of each.

The destination is read in its own order; each of its records names the source offset it
copies (the provenance header, `relay.batches.provenance`). A `Checker` per source partition
takes those claims as they come and reads the source alongside, only as far as the highest
offset claimed so far: the source records read but not yet claimed wait in `pending` (a record
claimed later is out of order; one never claimed is missing). So memory holds the records
between the source's read position and the destination's, not the partition.

Records are compared byte for byte as they are framed in their batches: key, value and headers
(ktm's own provenance header aside), which a relay copies unchanged, and the timestamp. No
record is decoded (only those the filters must see); the field that differs is named.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from relay.batches import SourceBatch, last_provenance
from relay.batches.format import LOG_APPEND_TIME
from relay.batches.provenance import Provenance
from relay.batches.records import Decoded, RecordAt, decode_at, decode_batch, parse_at
from relay.batches.varint import encode_varint, read_varint
from relay.pipelines.verify.spec import Feeder, Finding, PartitionReport

FIELDS = ("key", "value", "headers", "timestamp")
# Claimed offsets remembered to tell a second copy (duplicated) from a record no source explains
# (unexpected): a copy further back than this many claims is reported as unexpected.
RECENT = 100_000
# Source records read ahead of their claim; past this the oldest is reported missing (a
# destination this far out of order is not a copy anyone would call exact).
MAX_PENDING = 500_000

Copy = tuple[bytes, int]  # a record's framed key, value and headers; its timestamp


class NotVerified(Exception):
    """A source record could not be judged (a filter raised on it): the partition is reported
    as not verified, never as exact."""


def _records(batch: SourceBatch) -> Iterator[tuple[bytes, RecordAt, int, int]]:
    """(records part, record, offset, timestamp) of each record of a data batch: only the
    varints that frame a record are read, nothing is decoded."""
    header = batch.header
    if batch.is_control or header.record_count < 1:
        return
    buf = batch.records()
    append_time = header.max_timestamp if header.attributes & LOG_APPEND_TIME else None
    pos = 0
    for _ in range(header.record_count):
        at = parse_at(buf, pos)
        ts = header.first_timestamp + at.timestamp_delta if append_time is None else append_time
        yield buf, at, header.base_offset + at.offset_delta, ts
        pos = at.end


def copy_of(buf: bytes, at: RecordAt, timestamp: int, strip: bool = False) -> Copy:
    """A record's key, value and headers as they are framed in their batch (the bytes a relay
    copies unchanged), and its timestamp. `strip`: without its last header (the provenance
    header ktm appended: `relay.batches.records.with_header` in reverse)."""
    if not strip:
        return buf[at.rest : at.end], timestamp
    key_length, pos = read_varint(buf, at.rest)
    value_length, pos = read_varint(buf, pos + max(key_length, 0))
    pos += max(value_length, 0)
    count, first = read_varint(buf, pos)
    last = first
    for _ in range(count - 1):
        last = _header_end(buf, last)
    return buf[at.rest : pos] + encode_varint(count - 1) + buf[first:last], timestamp


def differing_field(wanted: Copy, got: Copy) -> str | None:
    """The first of key, value, headers, timestamp in which two copies differ (None: equal)."""
    if wanted == got:
        return None
    for name, a, b in zip(FIELDS, _fields(wanted[0]), _fields(got[0]), strict=False):
        if a != b:
            return name
    return "timestamp"


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
    start: int,
    end: int,
    kept: Callable[[Decoded], bool] | None,
) -> Iterator[tuple[int, Copy]]:
    """The source records in [start, end) that must be at the destination (those the config's
    filters keep; `kept` None: no filters), in offset order."""
    for chunk in batches:
        for batch in chunk:
            if batch.next_offset <= start:
                continue
            base = batch.header.base_offset
            for buf, at, offset, ts in _records(batch):
                if offset >= end:
                    return
                if offset < start:
                    continue
                if kept is None or kept(decode_at(buf, at, base, ts)):
                    yield offset, copy_of(buf, at, ts)


class Claim(NamedTuple):
    provenance: Provenance | None  # None: the record names no source
    source_offset: int
    dest_offset: int
    copy: Copy


def claims(batch: SourceBatch) -> Iterator[Claim]:
    """What a destination batch holds: each record with the source offset it copies. The
    batch form's header (on the last record) lists the runs of offsets of all its records;
    otherwise each record carries its own (the record form)."""
    last = decode_batch(batch, last_only=True)
    if not last:
        return
    found = last_provenance(last[0].headers)
    records = list(_records(batch))
    if found is not None and found.batch:
        offsets = [o for first, end in found.runs for o in range(first, end + 1)]
        fits = len(offsets) == len(records)
        for index, (buf, at, offset, ts) in enumerate(records):
            copy = copy_of(buf, at, ts, strip=index == len(records) - 1)
            yield Claim(found if fits else None, offsets[index] if fits else -1, offset, copy)
        return
    base = batch.header.base_offset
    for buf, at, offset, ts in records:
        own = last_provenance(decode_at(buf, at, base, ts).headers)
        if own is None or own.batch:
            yield Claim(None, -1, offset, copy_of(buf, at, ts))
        else:
            yield Claim(own, own.first, offset, copy_of(buf, at, ts, strip=True))


class Checker:
    """One source partition's check over [start, end): `claim` each destination record that
    names it, in destination order, then `finish`."""

    def __init__(self, feeder: Feeder, dest: tuple[str, int], source: Iterator[tuple[int, Copy]]):
        self.feeder, self.dest = feeder, dest
        self._source = source
        self._cursor = feeder.start  # the next source offset not read yet
        self._pending: dict[int, Copy] = {}  # read, not claimed yet (in offset order)
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._highest = -1
        self.compared = self.equal = 0
        self.counts: Counter[str] = Counter()
        self.first: dict[str, Finding] = {}
        self.not_verified = ""

    def claim(self, source_offset: int, dest_offset: int, got: Copy) -> None:
        if self.not_verified or not self.feeder.start <= source_offset < self.feeder.end:
            return  # outside the range checked (older than the source's log, or newer)
        self.compared += 1
        if not self._read_through(source_offset):
            return
        wanted = self._pending.pop(source_offset, None)
        if wanted is None:
            kind = "duplicated" if source_offset in self._recent else "unexpected"
            self._found(kind, source_offset, dest_offset)
            return
        self._remember(source_offset)
        if source_offset < self._highest:
            self._found("out_of_order", source_offset, dest_offset)
            return
        self._highest = source_offset
        differs = differing_field(wanted, got)
        if differs is not None:
            self._found(f"different:{differs}", source_offset, dest_offset)
        else:
            self.equal += 1

    def finish(self) -> PartitionReport:
        """Every source record never claimed is missing."""
        if self._read_through(self.feeder.end - 1):
            for offset in self._pending:
                self._found("missing", offset, -1)
            self._pending.clear()
        return PartitionReport(
            self.feeder.key, self.dest, self.feeder.start, self.feeder.end, self.compared,
            self.equal, tuple(sorted(self.counts.items())),
            tuple(sorted(self.first.values(), key=lambda f: f.kind)), self.not_verified,
        )  # fmt: skip

    def _read_through(self, offset: int) -> bool:
        """Read the source up to `offset` (included); False once the partition cannot be
        verified."""
        try:
            while self._cursor <= offset:
                found = next(self._source, None)
                if found is None:
                    self._cursor = self.feeder.end
                    break
                self._pending[found[0]] = found[1]
                self._cursor = found[0] + 1
                if len(self._pending) > MAX_PENDING:
                    oldest = next(iter(self._pending))
                    del self._pending[oldest]
                    self._found("missing", oldest, -1)
        except NotVerified as exc:
            self.not_verified = str(exc)
        return not self.not_verified

    def _remember(self, offset: int) -> None:
        self._recent[offset] = None
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)

    def _found(self, kind: str, source_offset: int, dest_offset: int) -> None:
        self.counts[kind] += 1
        self.first.setdefault(kind, Finding(kind, source_offset, dest_offset))
