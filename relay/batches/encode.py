"""Records given field by field (restore reads them from segments) into destination batches,
with the same batch-form provenance as the relay's rebuilt batches: the last record of each
batch lists the source offsets the batch holds.

Each record is framed once (a few varints and a join), with no object of kafka-python's per
record; compression, the batch header and the CRC are per batch (`relay.batches.build`).
Timestamps are kept as CreateTime, whatever type the source recorded, as restore always did.
"""

from __future__ import annotations

from collections.abc import Sequence

from relay.batches.build import DEFAULT_BUDGET, PROVENANCE_ROOM, DestBatch, Origin, finish_batch
from relay.batches.merge import add_to_runs
from relay.batches.records import Record, provenance_header
from relay.batches.varint import encode_varint

_NULL = encode_varint(-1)


def encode_records(
    records: Sequence[Record], origin: Origin, codec: int, budget: int = DEFAULT_BUDGET
) -> list[DestBatch]:
    """Destination batches for `records` (each with `offset`, `timestamp`, `key`, `value` and
    `headers`), in order, of at most `budget` bytes of records before compression (a record
    larger than that goes alone)."""
    out: list[DestBatch] = []
    room = budget - PROVENANCE_ROOM
    batch: list[Record] = []
    frames: list[bytes] = []
    size = 0
    for record in records:
        delta = record.timestamp - batch[0].timestamp if batch else 0
        frame = _frame(record, delta, len(batch), b"")
        if batch and size + len(frame) > room:
            out.append(_close(batch, frames, origin, codec))
            batch, frames, size = [], [], 0
            frame = _frame(record, 0, 0, b"")
        batch.append(record)
        frames.append(frame)
        size += len(frame)
    if batch:
        out.append(_close(batch, frames, origin, codec))
    return out


def _close(batch: list[Record], frames: list[bytes], origin: Origin, codec: int) -> DestBatch:
    """The batch, its last record framed again with the provenance header."""
    runs: list[list[int]] = []
    for record in batch:
        add_to_runs(runs, record.offset)
    base_ts, last = batch[0].timestamp, batch[-1]
    spans = [(first, last) for first, last in runs]
    header = provenance_header(origin.cluster, origin.topic, origin.partition, spans)
    frames[-1] = _frame(last, last.timestamp - base_ts, len(batch) - 1, header)
    part = b"".join(frames)
    max_ts = max(record.timestamp for record in batch)
    payload = finish_batch(part, codec, len(batch), base_ts, max_ts)
    return DestBatch(payload, len(batch), batch[0].offset, last.offset, len(part), False, max_ts)


def _frame(record: Record, timestamp_delta: int, offset_delta: int, extra_header: bytes) -> bytes:
    """One record: attributes 0, its deltas, key, value, its headers and `extra_header` (an
    encoded header, or b"") after them."""
    body = b"".join(
        (
            b"\x00",
            encode_varint(timestamp_delta),
            encode_varint(offset_delta),
            frame_fields(record.key, record.value, record.headers or (), extra_header),
        )
    )
    return encode_varint(len(body)) + body


def frame_fields(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    extra_header: bytes = b"",
) -> bytes:
    """A record's key, value and headers framed as in a batch (what follows its deltas): the
    bytes a relay copies unchanged, which ktm verify compares."""
    parts = [
        _NULL if key is None else encode_varint(len(key)) + key,
        _NULL if value is None else encode_varint(len(value)) + value,
        encode_varint(len(headers) + (1 if extra_header else 0)),
    ]
    for name, header_value in headers:
        encoded = name.encode()
        parts.append(encode_varint(len(encoded)) + encoded)
        parts.append(
            _NULL if header_value is None else encode_varint(len(header_value)) + header_value
        )
    parts.append(extra_header)
    return b"".join(parts)
