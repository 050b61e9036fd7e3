"""Record batches crafted for unit tests: built with kafka-python's DefaultRecordBatchBuilder,
patched by hand where a producer cannot write them (control batches, LogAppendTime, compaction
gaps)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from relay.batches import codecs

T0 = 1_700_000_000_000


class Rec(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def recs(first: int, count: int, step: int = 1, size: int = 100) -> list[Rec]:
    out = []
    for i in range(count):
        offset = first + i * step
        value = (b"v%08d-" % offset) * (size // 10)
        headers: list[tuple[str, bytes | None]] = [("h1", b"x%d" % offset), ("h2", None)]
        out.append(Rec(offset, T0 + offset * 7, b"k%d" % offset, value, headers))
    return out


def make_batch(
    records: Sequence[Rec],
    codec: str = "none",
    *,
    attributes: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    """One batch at base offset records[0].offset; `attributes` bits OR-ed in afterwards."""
    base = records[0].offset
    builder = DefaultRecordBatchBuilder(
        2, codecs.BY_NAME[codec], bool(attributes & 0x10), *producer, batch_size=1 << 30
    )
    for r in records:
        builder.append(r.offset - base, r.timestamp, r.key, r.value, r.headers)
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    if attributes:
        (old,) = struct.unpack_from(">h", buf, 21)
        struct.pack_into(">h", buf, 21, old | attributes)
        struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def control_batch(offset: int, commit: bool = True, producer_id: int = 7) -> bytes:
    """A transaction marker of `producer_id`: one control record, key (version 0, type 1 for
    COMMIT or 0 for ABORT), as a broker writes it."""
    marker = Rec(offset, T0, struct.pack(">hh", 0, int(commit)), b"\x00\x00\x00\x00\x00\x00", [])
    return make_batch([marker], attributes=0x30, producer=(producer_id, 0, -1))


def txn_batch(records: Sequence[Rec], producer_id: int, codec: str = "none") -> bytes:
    """A transactional data batch of `producer_id`."""
    return make_batch(records, codec, attributes=0x10, producer=(producer_id, 0, 0))


def cleaned(data: bytes, kept: Sequence[int]) -> bytes:
    """One batch as a compacted topic's log cleaner leaves it (Kafka's MemoryRecords.filterTo):
    only the records at the offsets `kept`, each at its own offset, and the batch's base offset,
    last offset, producer and timestamp type kept; no record at all leaves its header alone."""
    (base,) = struct.unpack_from(">q", data, 0)
    (last_delta,) = struct.unpack_from(">i", data, 23)
    producer = struct.unpack_from(">qhi", data, 43)
    builder = DefaultRecordBatchBuilder(2, 0, False, *producer, batch_size=1 << 30)
    for record in _records(data):
        if record.offset in kept:
            builder.append(record.offset - base, record.timestamp, record.key, record.value,
                           record.headers)  # fmt: skip
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    struct.pack_into(">i", buf, 23, last_delta)
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", buf, 21, attributes & ~0x07)  # its timestamp type; uncompressed
    if attributes & 0x08:  # LogAppendTime: the append time stays the batch's max timestamp
        buf[35:43] = data[35:43]
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def _records(data: bytes) -> list[Rec]:
    from kafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(data)
    return [Rec(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
