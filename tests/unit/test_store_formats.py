"""Both segment formats: exact round trips of awkward records, metadata, damaged files."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relay.errors import ConfigError
from relay.store.errors import SegmentError
from relay.store.formats import FORMATS, SegmentFormat, check_compression, get_format
from relay.store.parquet_format import COMPRESSIONS
from relay.store.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    SegmentBuffer,
    SegmentMeta,
    StoredRecord,
)

WHERE = "/backups/c/t/0/0/00000000000000000000-00000000000000000009.x"

NASTY = [
    StoredRecord(0, 1_700_000_000_000, CREATE_TIME, b"key", b"value", (("h", b"v"),)),
    StoredRecord(1, 1_700_000_000_001, CREATE_TIME, None, b"null key", ()),
    StoredRecord(2, 1_700_000_000_002, CREATE_TIME, b"tombstone", None, ()),
    StoredRecord(3, 1_700_000_000_003, CREATE_TIME, None, None, ()),
    StoredRecord(4, 1_600_000_000_000, LOG_APPEND_TIME, b"", b"", (("", b""),)),
    StoredRecord(
        6,  # offset 5 skipped: a gap inside the segment
        1_700_000_000_006,
        CREATE_TIME,
        bytes(range(256)),
        b"\x00\xff" * 1000,
        (("dup", b"1"), ("dup", None), ("dup", b"2"), ("ünï cödé ✓", b"\xfe"), ("a.b c", None)),
    ),
    StoredRecord(7, -1, CREATE_TIME, b"big", bytes(3 * 1024 * 1024), (("z", b"last"), ("a", b""))),
    StoredRecord(9, 0, LOG_APPEND_TIME, b'\n{"json": 1}\n', b"line\nbreaks\r\n", (("\n", b"\n"),)),
]


def make_buffer(records: list[StoredRecord] = NASTY) -> SegmentBuffer:
    buffer = SegmentBuffer()
    buffer.extend(records)
    return buffer


def encode(fmt: SegmentFormat, buffer: SegmentBuffer, meta: SegmentMeta, compression: str) -> bytes:
    sink = pa.BufferOutputStream()
    fmt.write(sink, [buffer], meta, compression)
    return bytes(sink.getvalue())


def read_all(fmt: SegmentFormat, data: bytes) -> tuple[SegmentMeta, list[StoredRecord]]:
    meta, records = fmt.read(pa.BufferReader(data), WHERE)
    return meta, list(records)


@pytest.fixture(params=sorted(FORMATS))
def fmt(request: pytest.FixtureRequest) -> SegmentFormat:
    return get_format(request.param)


@pytest.fixture
def nasty_meta() -> SegmentMeta:
    return make_buffer().meta("prod", "orders", 0, next_offset=12)


def test_round_trip_is_exact(fmt: SegmentFormat, nasty_meta: SegmentMeta) -> None:
    data = encode(fmt, make_buffer(), nasty_meta, fmt.compressions[0])
    meta, records = read_all(fmt, data)
    assert meta == nasty_meta
    assert records == NASTY
    assert fmt.read_meta(pa.BufferReader(data), WHERE) == nasty_meta


def test_meta_survives_with_gaps_and_timestamps(
    fmt: SegmentFormat, nasty_meta: SegmentMeta
) -> None:
    meta = fmt.read_meta(pa.BufferReader(encode(fmt, make_buffer(), nasty_meta, "none")), WHERE)
    assert (meta.first, meta.last, meta.next_offset, meta.count) == (0, 9, 12, 8)
    assert (meta.min_timestamp, meta.max_timestamp) == (-1, 1_700_000_000_006)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_parquet_compression_round_trips(compression: str, nasty_meta: SegmentMeta) -> None:
    parquet = get_format("parquet")
    assert read_all(parquet, encode(parquet, make_buffer(), nasty_meta, compression))[1] == NASTY


def test_parquet_schema_and_metadata_are_as_documented(nasty_meta: SegmentMeta) -> None:
    data = encode(get_format("parquet"), make_buffer(), nasty_meta, "zstd")
    parquet = pq.ParquetFile(pa.BufferReader(data))
    schema = parquet.schema_arrow
    assert schema.names == ["offset", "timestamp", "timestamp_type", "key", "value", "headers"]
    assert str(schema.field("headers").type.value_type) == (
        "struct<key: string not null, value: binary>"
    )
    metadata = parquet.metadata.metadata
    assert metadata[b"ktm.topic"] == b"orders" and metadata[b"ktm.next_offset"] == b"12"
    assert parquet.metadata.row_group(0).column(3).compression == "ZSTD"


def test_jsonl_is_readable_text(nasty_meta: SegmentMeta) -> None:
    buffer = make_buffer(NASTY[:4])
    meta = buffer.meta("prod", "orders", 0)
    lines = encode(get_format("jsonl"), buffer, meta, "none").decode().splitlines()
    assert len(lines) == 5 and '"topic": "orders"' in lines[0]
    assert '"key": null, "value": "bnVsbCBrZXk="' in lines[2]


def test_format_and_compression_choices() -> None:
    with pytest.raises(ConfigError, match="unknown segment format 'avro'.*parquet, jsonl"):
        get_format("avro")
    with pytest.raises(ConfigError, match="'zstd' is not available for the jsonl format"):
        check_compression(get_format("jsonl"), "zstd")
    assert check_compression(get_format("parquet"), "lz4") == "lz4"


# --- damaged files -------------------------------------------------------------------------


def _damaged(fmt: SegmentFormat, meta: SegmentMeta) -> Iterator[tuple[str, bytes]]:
    data = encode(fmt, make_buffer(), meta, "none")
    yield "empty", b""
    yield "garbage", b"this is not a segment\n"
    yield "cut in half", data[: len(data) // 2]
    yield "last byte missing", data[:-1]
    if fmt.name == "jsonl":
        lines = data.splitlines(keepends=True)
        yield "last record missing", b"".join(lines[:-1])
        yield "a record line garbled", b"".join([*lines[:3], b"{not json\n", *lines[4:]])
        yield "bad base64", data.replace(b'"key": "a2V5"', b'"key": "a2V5!"')
    else:
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0xFF  # inside the big value's data page: only the CRC knows
        yield "one byte flipped", bytes(flipped)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_damaged_files_raise_segment_error_naming_the_file(name: str) -> None:
    fmt = get_format(name)
    meta = make_buffer().meta("prod", "orders", 0)
    for damage, data in _damaged(fmt, meta):
        with pytest.raises(SegmentError) as caught:
            read_all(fmt, data)
        message = str(caught.value)
        assert message.startswith(f"segment {WHERE}"), (damage, message)
        assert "\n" not in message, damage


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_reading_only_the_metadata_of_a_damaged_file_fails_too(name: str) -> None:
    fmt = get_format(name)
    data = encode(fmt, make_buffer(), make_buffer().meta("prod", "orders", 0), "none")
    damaged = [b"", b"garbage\n", b"[1, 2]\n", b'{"cluster": "c"}\n']
    if name == "parquet":
        damaged.append(data[: len(data) // 2])
    for data in damaged:
        with pytest.raises(SegmentError, match=f"^segment {WHERE}: "):
            fmt.read_meta(pa.BufferReader(data), WHERE)


def test_records_disagreeing_with_the_metadata_are_caught(fmt: SegmentFormat) -> None:
    buffer = make_buffer(NASTY[:3])
    lying = SegmentMeta("prod", "orders", 0, 0, 0, 2, 3, 2, 0, 1_700_000_000_002)  # count 2
    with pytest.raises(SegmentError, match="truncated or inconsistent: 3 records"):
        read_all(fmt, encode(fmt, buffer, lying, "none"))
    shifted = SegmentMeta("prod", "orders", 0, 0, 1, 2, 3, 2, 0, 1_700_000_000_002)
    with pytest.raises(SegmentError, match="offset 0 out of order"):
        read_all(fmt, encode(fmt, buffer, shifted, "none"))


def test_a_parquet_file_without_ktm_metadata_is_not_a_segment() -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"offset": [1]}), sink)
    with pytest.raises(SegmentError, match="no ktm metadata"):
        get_format("parquet").read_meta(pa.BufferReader(sink.getvalue()), WHERE)
