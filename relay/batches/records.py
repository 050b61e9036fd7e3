"""Records inside a decompressed records part: walked by their length varints, re-framed only
where an offset or timestamp delta changes, and one header appended to a record.

    Record => length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
              | keyLength varint | key | valueLength varint | value | headerCount varint
              | (headerKeyLength varint | headerKey | headerValueLength varint | headerValue)*
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from relay.batches.format import LOG_APPEND_TIME, SourceBatch
from relay.batches.varint import encode_varint, read_varint
from relay.provenance.header import PROVENANCE_HEADER, format_runs

SINGLE_BYTES = [bytes((b,)) for b in range(256)]  # an attributes byte as bytes, without slicing


class RecordAt(NamedTuple):
    """Where one record sits in a records part, with the two deltas a rebuild may change."""

    start: int  # its length varint
    body: int  # its attributes byte
    timestamp_delta: int
    offset_delta: int
    rest: int  # its key length varint: key, value and headers follow, unchanged
    end: int


def parse_at(buf: bytes, pos: int) -> RecordAt:
    length, body = read_varint(buf, pos)
    timestamp_delta, p = read_varint(buf, body + 1)
    offset_delta, rest = read_varint(buf, p)
    return RecordAt(pos, body, timestamp_delta, offset_delta, rest, body + length)


def last_record_start(buf: bytes, count: int) -> int:
    """Where the last of `count` records starts: only the length varints are read."""
    pos = 0
    for _ in range(count - 1):
        length, pos = read_varint(buf, pos)
        pos += length
    return pos


def reframe(buf: bytes, body: int, rest: int, end: int, ts_delta: int, offset_delta: int) -> bytes:
    """The record at `body` (its attributes byte) with new deltas: its key, value and headers
    bytes (`rest` to `end`) are reused as they are."""
    ts_bytes, offset_bytes = encode_varint(ts_delta), encode_varint(offset_delta)
    size = 1 + len(ts_bytes) + len(offset_bytes) + end - rest
    attributes = SINGLE_BYTES[buf[body]]
    return b"".join((encode_varint(size), attributes, ts_bytes, offset_bytes, buf[rest:end]))


def with_header(
    buf: bytes, at: RecordAt, timestamp_delta: int, offset_delta: int, header: bytes
) -> bytes:
    """The record with new deltas and one more header (`header`: an encoded key and value),
    appended after its own headers so that it is the record's last."""
    pos = at.rest
    key_length, pos = read_varint(buf, pos)
    pos += max(key_length, 0)
    value_length, pos = read_varint(buf, pos)
    pos += max(value_length, 0)
    count, headers = read_varint(buf, pos)
    body = b"".join(
        (
            buf[at.body : at.body + 1],
            encode_varint(timestamp_delta),
            encode_varint(offset_delta),
            buf[at.rest : pos],
            encode_varint(count + 1),
            buf[headers : at.end],
            header,
        )
    )
    return encode_varint(len(body)) + body


def encode_header(key: str, value: bytes) -> bytes:
    name = key.encode()
    return b"".join((encode_varint(len(name)), name, encode_varint(len(value)), value))


def provenance_header(
    cluster: str, topic: str, partition: int, runs: Iterable[tuple[int, int]]
) -> bytes:
    """The encoded `ktm.src` header (key and value, the batch form of relay.provenance.header)
    appended to a destination batch's last record."""
    return encode_header(PROVENANCE_HEADER, format_runs(cluster, topic, partition, runs))


class Record(Protocol):
    """A record as ktm reads it field by field: `Decoded` from a batch, kafka-python's
    ConsumerRecord (the relay's record path) or a StoredRecord from a segment (restore)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...


class Decoded(NamedTuple):
    """One record, decoded: for the few records a reader must look inside (a tail's last ones,
    the records a filter sees)."""

    offset: int  # in the log it was fetched from
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _field(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(buf, pos)
    if length < 0:
        return None, pos
    return bytes(buf[pos : pos + length]), pos + length


def decode_at(buf: bytes, at: RecordAt, base_offset: int, timestamp: int) -> Decoded:
    """The record at `at`; `timestamp` is its batch's first timestamp plus its delta, or the
    batch's append time."""
    key, pos = _field(buf, at.rest)
    value, pos = _field(buf, pos)
    count, pos = read_varint(buf, pos)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        name, pos = _field(buf, pos)
        header_value, pos = _field(buf, pos)
        headers.append(((name or b"").decode(), header_value))
    return Decoded(base_offset + at.offset_delta, timestamp, key, value, headers)


def decode_batch(batch: SourceBatch, last_only: bool = False) -> list[Decoded]:
    """A batch's records (or its last one), decoded."""
    header = batch.header
    count = header.record_count
    if count < 1 or batch.is_control:
        return []
    records = batch.records()
    append_time = header.max_timestamp if header.attributes & LOG_APPEND_TIME else None
    pos = last_record_start(records, count) if last_only else 0
    out = []
    for _ in range(1 if last_only else count):
        at = parse_at(records, pos)
        ts = header.first_timestamp + at.timestamp_delta if append_time is None else append_time
        out.append(decode_at(records, at, header.base_offset, ts))
        pos = at.end
    return out


def record_offsets(batch: SourceBatch) -> list[int]:
    """The offsets of a batch's records (only their length and offset varints are read when
    compaction left gaps inside it)."""
    header = batch.header
    if batch.is_control:
        return []
    if batch.contiguous:
        return list(range(header.base_offset, header.base_offset + header.record_count))
    records, pos, out = batch.records(), 0, []
    for _ in range(header.record_count):
        at = parse_at(records, pos)
        out.append(header.base_offset + at.offset_delta)
        pos = at.end
    return out
