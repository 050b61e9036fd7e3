"""One source partition compared with the records ktm wrote for it, in one pass of each.

The destination is read in its own order; each of its records names the source offset it
copies (the provenance header, `relay.batches.provenance`; in a store, the record's own
offset). A `Checker` per source partition takes those claims as they come and reads the source
alongside, only as far as the highest offset claimed so far: the source records read but not
yet claimed wait in `pending` (a record claimed later is out of order; one never claimed is
missing). So memory holds the records between the source's read position and the
destination's, not the partition.

Records are compared byte for byte as they are framed in their batches: key, value and headers
(ktm's own provenance header aside), which a relay copies unchanged, and the timestamp (and its
type where the copy keeps it: in a store). No record is decoded (only those the filters must
see); the field that differs is named.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from relay.batches import SourceBatch, last_provenance
from relay.batches.encode import frame_fields
from relay.batches.format import LOG_APPEND_TIME
from relay.batches.provenance import Provenance
from relay.batches.records import Decoded, RecordAt, decode_at, decode_batch, parse_at
from relay.batches.varint import encode_varint, read_varint
from relay.pipelines.verify.spec import (
    Copy,
    Feeder,
    FeederState,
    Finding,
    PartitionReport,
    Scope,
)

FIELDS = ("key", "value", "headers", "timestamp", "timestamp_type")
# Claimed offsets remembered to tell a second copy (duplicated) from a record no source explains
# (unexpected): a copy further back than this many claims is reported as unexpected.
RECENT = 100_000
# Source records read ahead of their claim; past this the oldest is reported missing (a
# destination this far out of order is not a copy anyone would call exact).
MAX_PENDING = 500_000

# A Copy is a record's framed key, value and headers; its timestamp; its timestamp type (-1
# where the copy does not keep it: ktm writes CreateTime to Kafka, whatever the source's type).
Expected = tuple[int, Copy | None]  # a source record that must be copied (None: not checked)
_ABSENT: Any = object()


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


def copy_of(buf: bytes, at: RecordAt, timestamp: int, kind: int = -1, strip: bool = False) -> Copy:
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


def stored_copy(record: Any, keep_type: bool) -> Copy:
    """A stored record (relay.store.StoredRecord) framed as a batch frames it."""
    kind = record.timestamp_type if keep_type else -1
    return frame_fields(record.key, record.value, record.headers), record.timestamp, kind


def differing_field(wanted: Copy, got: Copy) -> str | None:
    """The first of key, value, headers, timestamp and its type in which two copies differ
    (None: equal)."""
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
    """The source records of a Kafka partition in [start, end) that must be at the destination
    (those the config's filters keep; `kept` None: no filters), in offset order; those outside
    the scope (`--sample`, the time window) come as None: read, not checked."""
    topic, partition = feeder.key
    for chunk in batches:
        for batch in chunk:
            if batch.next_offset <= feeder.start:
                continue
            header = batch.header
            if not scope.picks_any(feeder.key, header.base_offset, batch.next_offset):
                continue  # --sample: nothing in it is checked, and claims of it are ignored
            kind = (1 if header.attributes & LOG_APPEND_TIME else 0) if keep_type else -1
            for buf, at, offset, ts in _records(batch):
                if offset >= feeder.end:
                    return
                if offset < feeder.start:
                    continue
                if not scope.covers(topic, partition, offset, ts):
                    yield offset, None
                elif kept is None or kept(decode_at(buf, at, header.base_offset, ts)):
                    yield offset, copy_of(buf, at, ts, kind)


def expected_stored(
    records: Iterable[Any], feeder: Feeder, scope: Scope, keep_type: bool = False
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


class Claim(NamedTuple):
    provenance: Provenance | None  # None: the record names no source
    source_offset: int
    dest_offset: int
    copy: Copy


def claims(
    batch: SourceBatch, wanted: Callable[[Provenance], bool] | None = None
) -> Iterator[Claim]:
    """What a destination batch holds: each record with the source offset it copies. The
    batch form's header (on the last record) lists the runs of offsets of all its records;
    otherwise each record carries its own (the record form). `wanted`: a batch-form batch it
    refuses is skipped unread (`--sample`)."""
    last = decode_batch(batch, last_only=True)
    if not last:
        return
    found = last_provenance(last[0].headers)
    if found is not None and found.batch:
        if wanted is not None and not wanted(found):
            return
        records = list(_records(batch))
        offsets = [o for first, end in found.runs for o in range(first, end + 1)]
        fits = len(offsets) == len(records)
        for index, (buf, at, offset, ts) in enumerate(records):
            copy = copy_of(buf, at, ts, strip=index == len(records) - 1)
            yield Claim(found if fits else None, offsets[index] if fits else -1, offset, copy)
        return
    base = batch.header.base_offset
    for buf, at, offset, ts in _records(batch):
        own = last_provenance(decode_at(buf, at, base, ts).headers)
        if own is None or own.batch:
            yield Claim(None, -1, offset, copy_of(buf, at, ts))
        else:
            yield Claim(own, own.first, offset, copy_of(buf, at, ts, strip=True))


class ClaimedRuns:
    """The source offsets claimed lately, as runs (claims mostly come in order, so a few runs
    hold many offsets): a claim of one of them again is a duplicate."""

    def __init__(self, runs: Iterable[tuple[int, int]] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._total = 0
        for first, last in runs:
            self._starts.append(first)
            self._ends.append(last)
            self._total += last - first + 1

    def add(self, offset: int) -> None:
        if self._ends and offset == self._ends[-1] + 1:
            self._ends[-1] = offset
        else:  # a gap, or out of order: a run of its own where it belongs
            at = bisect.bisect(self._starts, offset)
            self._starts.insert(at, offset)
            self._ends.insert(at, offset)
        self._total += 1
        while self._total > RECENT and len(self._starts) > 1:
            self._total -= self._ends[0] - self._starts.pop(0) + 1
            self._ends.pop(0)

    def __contains__(self, offset: int) -> bool:
        at = bisect.bisect(self._starts, offset) - 1
        return at >= 0 and offset <= self._ends[at]

    def runs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._starts, self._ends, strict=True))


class Checker:
    """One source partition's check over [start, end): `claim` each destination record that
    names it, in destination order, then `finish` (the whole range is read). A check spread
    over passes hands its `state` from one to the next, `settle`d at the end of each."""

    def __init__(
        self,
        feeder: Feeder,
        dest: tuple[str, int],
        source: Iterator[Expected],
        scope: Scope,
        state: FeederState | None = None,
    ):
        self.feeder, self.dest, self.scope = feeder, dest, scope
        self._source = source
        self._cursor = feeder.start if state is None else state.cursor  # next offset not read
        self._pending: dict[int, Copy | None] = {}  # read, not claimed yet (in offset order)
        self._recent = ClaimedRuns()
        self._highest = -1
        self.compared = self.equal = 0
        self.counts: Counter[str] = Counter()
        self.first: dict[str, Finding] = {}
        self.not_verified = ""
        if state is not None:
            self._resume(state)

    def _resume(self, state: FeederState) -> None:
        r = state.report
        self._pending = dict(state.pending)
        self._recent = ClaimedRuns(state.recent)
        self._highest = state.highest
        self.compared, self.equal, self.not_verified = r.compared, r.equal, r.not_verified
        self.counts = Counter(dict(r.counts))
        self.first = {f.kind: f for f in r.first}

    def claim(self, source_offset: int, dest_offset: int, got: Copy, where: str = "") -> None:
        if self.not_verified or not self.feeder.start <= source_offset < self.feeder.end:
            return  # outside the range checked (older than the source's log, or newer)
        if not self.scope.picked(self.feeder.key, source_offset):
            return  # --sample: a block of offsets not checked
        if not self._read_through(source_offset):
            return
        wanted = self._pending.pop(source_offset, _ABSENT)
        if wanted is None:
            return  # outside the time window: not checked
        self.compared += 1
        if wanted is _ABSENT:
            kind = "duplicated" if source_offset in self._recent else "unexpected"
            self._found(kind, source_offset, dest_offset, where)
            return
        self._recent.add(source_offset)
        if source_offset < self._highest:
            self._found("out_of_order", source_offset, dest_offset, where)
            return
        self._highest = source_offset
        differs = differing_field(wanted, got)
        if differs is not None:
            self._found(f"different:{differs}", source_offset, dest_offset, where)
        else:
            self.equal += 1

    def finish(self) -> PartitionReport:
        """Every source record never claimed is missing."""
        if self._read_through(self.feeder.end - 1):
            self._missing(self.feeder.end)
        return self.report()

    def settle(self, margin: int) -> FeederState:
        """The end of a pass: source records more than `margin` offsets below the highest one
        claimed are missing (a copy writes a partition in order; a later claim of one would
        be out of order); the rest, and where the source read stands, go to the next pass."""
        if not self.not_verified:
            self._missing(self._highest - margin)
        ahead = [o for o in self._pending if o > self._highest]
        cursor = ahead[0] if ahead else self._cursor  # re-read what lies past the highest claim
        for offset in ahead:
            del self._pending[offset]
        self._cursor = cursor
        return FeederState(self.report(), cursor, self._highest, tuple(self._pending.items()),
                           self._recent.runs())  # fmt: skip

    @property
    def verified_next(self) -> int:
        """The first source offset not judged yet."""
        return next(iter(self._pending)) if self._pending else self._cursor

    def report(self) -> PartitionReport:
        return PartitionReport(
            self.feeder.key, self.dest, self.feeder.start, self.feeder.end, self.compared,
            self.equal, tuple(sorted(self.counts.items())),
            tuple(sorted(self.first.values(), key=lambda f: f.kind)), self.not_verified,
        )  # fmt: skip

    def _missing(self, before: int) -> None:
        for offset in [o for o in self._pending if o < before]:
            if self._pending.pop(offset) is not None:
                self._found("missing", offset, -1)

    def _read_through(self, offset: int) -> bool:
        """Read the source up to `offset` (included); False once the partition cannot be
        verified."""
        try:
            while self._cursor <= offset:
                found = next(self._source, None)
                if found is None:
                    self._cursor = max(self._cursor, min(offset + 1, self.feeder.end))
                    break
                self._pending[found[0]] = found[1]
                self._cursor = found[0] + 1
                if len(self._pending) > MAX_PENDING:
                    oldest = next(iter(self._pending))
                    if self._pending.pop(oldest) is not None:
                        self._found("missing", oldest, -1)
        except NotVerified as exc:
            self.not_verified = str(exc)
        return not self.not_verified

    def _found(self, kind: str, source_offset: int, dest_offset: int, where: str = "") -> None:
        self.counts[kind] += 1
        self.first.setdefault(kind, Finding(kind, source_offset, dest_offset, where))
