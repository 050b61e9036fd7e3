"""The magic-2 record batch header, read and written with `struct`; a fetch split into batches.

offset  field                 notes
0       baseOffset      int64 assigned by the broker; 0 in a produced batch
8       batchLength     int32 bytes after this field
12      leaderEpoch     int32 set by the broker
16      magic           int8  2
17      crc             uint32 CRC-32C of everything from `attributes` to the end
21      attributes      int16 codec bits 0-2, timestampType bit 3, transactional 4, control 5
23      lastOffsetDelta int32
27      firstTimestamp  int64
35      maxTimestamp    int64
43      producerId      int64 stamped by the producer's sender (-1: none)
51      producerEpoch   int16
53      baseSequence    int32
57      recordCount     int32
61      records         varint-framed; the whole part compressed by the codec
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

from relay.batches import codecs

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what batchLength does not count
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
PRODUCER_OFFSET = 43
_PRODUCER = struct.Struct(">qhi")
_CRC = struct.Struct(">I")
_LENGTH = struct.Struct(">i")
# crc32c lets the GIL go for buffers of 32 KiB and more by default; a batch's CRC takes
# microseconds, and the task thread then waits for the GIL behind kafka-python's I/O thread for
# up to a switch interval (5 ms). Seen as 7% of a worker's time at 2,000 partitions.
_KEEP_GIL = 0

CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
NO_LEADER_EPOCH = -1  # what the Java producer writes; the broker sets it


class UnsupportedBatch(ValueError):
    """Bytes that are not a magic-2 batch (an old message set), or a corrupt batch."""


class BatchHeader(NamedTuple):
    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


class SourceBatch:
    """One fetched batch: its header, read once, and a view of its bytes (no copy)."""

    __slots__ = ("header", "data")

    def __init__(self, header: BatchHeader, data: memoryview):
        self.header, self.data = header, data

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.base_offset + self.header.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def codec(self) -> int:
        return self.header.attributes & CODEC_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.header.attributes & CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.header.attributes & TRANSACTIONAL)

    @property
    def log_append_time(self) -> bool:
        return bool(self.header.attributes & LOG_APPEND_TIME)

    @property
    def contiguous(self) -> bool:
        """Every offset from base to last holds a record (compaction left no gap inside)."""
        return self.header.record_count == self.header.last_offset_delta + 1

    def crc_ok(self) -> bool:
        return crc32c(self.data[ATTRIBUTES_OFFSET:], 0, _KEEP_GIL) == self.header.crc

    def records(self) -> bytes:
        """The records part, decompressed."""
        codec = self.header.attributes & CODEC_MASK
        if codec == codecs.NONE:
            return bytes(self.data[HEADER_SIZE:])
        return codecs.decompress(codec, self.data[HEADER_SIZE:])


def split_batches(data: bytes | bytearray | memoryview) -> tuple[list[SourceBatch], int]:
    """The complete batches in a fetched partition's bytes, and how many bytes they span.

    A fetch response may end with a partial batch (the broker cuts at the byte limit): it is
    left out, and the caller fetches again from the next offset after the last whole batch.
    """
    view = memoryview(data)
    size = len(view)
    batches = []
    pos = 0
    while size - pos >= LOG_OVERHEAD + 5:  # up to and including the magic byte
        (length,) = _LENGTH.unpack_from(view, pos + 8)
        end = pos + LOG_OVERHEAD + length
        if end > size:
            break
        magic = view[pos + 16]
        if magic != 2:
            raise UnsupportedBatch(f"message format v{magic} at byte {pos}: only v2 batches")
        if end - pos < HEADER_SIZE:
            raise UnsupportedBatch(f"a batch of {end - pos} bytes at byte {pos}: corrupt")
        header = BatchHeader._make(HEADER.unpack_from(view, pos))
        batches.append(SourceBatch(header, view[pos:end]))
        pos = end
    return batches, pos


def assemble(
    records: bytes, codec: int, count: int, first_timestamp: int, max_timestamp: int
) -> bytearray:
    """A produced batch around a records part: CreateTime, offset deltas 0..count-1, no producer
    id (the sender stamps it, see `stamp_producer`), CRC set."""
    buf = bytearray(HEADER_SIZE + len(records))
    HEADER.pack_into(
        buf,
        0,
        0,
        len(buf) - LOG_OVERHEAD,
        NO_LEADER_EPOCH,
        2,
        0,
        codec,
        count - 1,
        first_timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        count,
    )
    buf[HEADER_SIZE:] = records
    _set_crc(buf)
    return buf


def stamp_producer(
    buf: bytearray, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool
) -> None:
    """Write the idempotent producer's fields into a built batch and fix its CRC (they are
    inside the CRC's range), as kafka-python's builder does when the sender closes a batch."""
    _PRODUCER.pack_into(buf, PRODUCER_OFFSET, producer_id, producer_epoch, base_sequence)
    (attributes,) = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)
    attributes = attributes | TRANSACTIONAL if transactional else attributes & ~TRANSACTIONAL
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attributes)
    _set_crc(buf)


def _set_crc(buf: bytearray) -> None:
    _CRC.pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:], 0, _KEEP_GIL))
