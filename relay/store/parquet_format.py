"""Segments as Parquet files: one row per record, the SegmentMeta in the file's key-value metadata.

Columns: offset int64, timestamp int64, timestamp_type int8, key binary, value binary (both
nullable: null is a null key or a tombstone, b"" is an empty one), headers
list<struct<key: string not null, value: binary>> (order, duplicates and null values kept).

Facts about pyarrow that shaped this module:
- Parquet has no checksums unless asked: a zeroed range inside a compressed data page was read
  back as 100,000 "valid" rows. Pages are written with CRCs (write_page_checksum) and verified on
  read (page_checksum_verification); a mismatch surfaces as an OSError without errno.
- Arrays are built from whole Python lists (pa.array on a list of bytes, the headers through
  ListArray.from_arrays over the flat name/value lists): a dict per row is several times slower.
- Dictionary encoding only pays for header names (a few distinct values); keys and values skip
  it, and statistics are written for offset and timestamp only (min/max of values is noise).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from relay.store.checks import checked_records, segment_errors
from relay.store.records import (
    META_FIELD_TYPES,
    SegmentBuffer,
    SegmentContents,
    SegmentMeta,
    StoredRecord,
)

if TYPE_CHECKING:
    from relay.store.fs import Sink

META_PREFIX = "ktm."
HEADER_TYPE = pa.list_(
    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
)
SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestamp_type", pa.int8(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE, nullable=False),
    ]
)
COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")
ROW_GROUP_BYTES = 64 * 1024 * 1024  # bounds the memory a reader needs per row group
READ_BATCH_ROWS = 16_384


def _headers_array(
    starts: Sequence[int], names: Sequence[str], values: Sequence[bytes | None]
) -> pa.Array:
    entries = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())],
        fields=list(HEADER_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(starts, pa.int32()), entries, type=HEADER_TYPE)


def to_table(buffer: SegmentBuffer, meta: SegmentMeta) -> pa.Table:
    """The buffer as an Arrow table, column by column, with the metadata on its schema."""
    c = buffer.columns()
    arrays = [
        pa.array(c.offsets, pa.int64()),
        pa.array(c.timestamps, pa.int64()),
        pa.array(c.timestamp_types, pa.int8()),
        pa.array(c.keys, pa.binary()),
        pa.array(c.values, pa.binary()),
        _headers_array(c.header_starts, c.header_names, c.header_values),
    ]
    metadata = {f"{META_PREFIX}{k}": str(v) for k, v in meta.to_dict().items()}
    return pa.Table.from_arrays(arrays, schema=SCHEMA.with_metadata(metadata))


def meta_from_metadata(metadata: dict[bytes, bytes] | None) -> SegmentMeta:
    """SegmentMeta from a Parquet key-value metadata map; ValueError when absent or malformed."""
    texts: dict[str, str] = {}
    for raw_key, raw_value in (metadata or {}).items():
        key = raw_key.decode()
        if key.startswith(META_PREFIX):
            texts[key[len(META_PREFIX) :]] = raw_value.decode()
    if not texts:
        raise ValueError("no ktm metadata (not a ktm segment)")
    fields: dict[str, str | int] = dict(texts)
    for name, kind in META_FIELD_TYPES.items():
        if kind is int and name in texts:
            fields[name] = _parse_int(name, texts[name])
    return SegmentMeta.from_dict(fields)


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"metadata field {name!r}: expected an integer, got {text!r}") from None


class ParquetFormat:
    """The default segment format (see the module docstring)."""

    name = "parquet"
    extension = "parquet"
    compressions: tuple[str, ...] = COMPRESSIONS

    def write(
        self, sink: Sink, chunks: Iterable[SegmentBuffer], meta: SegmentMeta, compression: str
    ) -> None:
        """Write the records of ``chunks``, in order, as one segment to ``sink`` (a path or a
        writable binary file): a chunk at a time, so a big segment never sits in memory whole."""
        metadata = {f"{META_PREFIX}{k}": str(v) for k, v in meta.to_dict().items()}
        with pq.ParquetWriter(
            sink,
            SCHEMA.with_metadata(metadata),
            compression=compression,
            use_dictionary=["headers.list.element.key"],
            write_statistics=["offset", "timestamp"],
            write_page_checksum=True,
        ) as writer:
            for chunk in chunks:
                if chunk.count:
                    rows = max(1024, ROW_GROUP_BYTES * chunk.count // max(1, chunk.size_bytes))
                    writer.write_table(to_table(chunk, meta), row_group_size=rows)

    def read_meta(self, source: pa.NativeFile, where: str) -> SegmentMeta:
        """The metadata only: reads the footer (a few ranged reads on S3), no record data."""
        with segment_errors(where):
            return meta_from_metadata(pq.read_metadata(source).metadata)

    def read(self, source: pa.NativeFile, where: str) -> SegmentContents:
        """The metadata, and every record in offset order (decoded a batch of rows at a time)."""
        with segment_errors(where):
            parquet = pq.ParquetFile(source, page_checksum_verification=True)
            meta = meta_from_metadata(parquet.metadata.metadata)
            if not parquet.schema_arrow.remove_metadata().equals(SCHEMA):
                raise ValueError(f"unexpected columns: {parquet.schema_arrow.names}")
            batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS)
        records = _batches_records(batches, where)
        return SegmentContents(meta, checked_records(records, meta, where))


def _batches_records(batches: Iterator[pa.RecordBatch], where: str) -> Iterator[StoredRecord]:
    # The guard wraps the decoding only, not the yield: the consumer's errors are its own.
    while True:
        with segment_errors(where):
            batch = next(batches, None)
            if batch is None:
                return
            records = _batch_records(batch)
        yield from records


def _batch_records(batch: pa.RecordBatch) -> list[StoredRecord]:
    offsets, timestamps, types, keys, values, headers = batch.columns
    starts = headers.offsets.to_pylist()  # absolute positions into headers.values
    names, header_values = (field.to_pylist() for field in headers.values.flatten())
    pairs = list(zip(names, header_values, strict=True))
    return [
        StoredRecord(offset, timestamp, ts_type, key, value, tuple(pairs[start:end]))
        for offset, timestamp, ts_type, key, value, start, end in zip(
            offsets.to_pylist(),
            timestamps.to_pylist(),
            types.to_pylist(),
            keys.to_pylist(),
            values.to_pylist(),
            starts,
            itertools.islice(starts, 1, None),
            strict=False,  # starts has one more entry than there are rows
        )
    ]
