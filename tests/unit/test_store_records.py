"""SegmentBuffer bookkeeping and SegmentMeta validation."""

from __future__ import annotations

import time

import pytest

from relay import __version__
from relay.store.records import (
    LOG_APPEND_TIME,
    SCHEMA_VERSION,
    SegmentBuffer,
    SegmentMeta,
    StoredRecord,
)


def test_an_empty_buffer_has_no_range_and_makes_no_segment() -> None:
    buffer = SegmentBuffer()
    assert (buffer.count, buffer.first, buffer.last, buffer.size_bytes) == (0, None, None, 0)
    assert buffer.min_timestamp is None and buffer.max_timestamp is None
    assert buffer.opened_at is None
    with pytest.raises(ValueError, match="empty"):
        buffer.meta("c", "t", 0)


def test_buffer_tracks_range_size_timestamps_and_age() -> None:
    buffer = SegmentBuffer()
    before = time.monotonic()
    buffer.append(10, 2_000, 0, b"k", b"value", [("h", b"12"), ("n", None)])
    buffer.append(12, 1_000, 0, None, None)
    buffer.append(15, 3_000, LOG_APPEND_TIME, b"", b"xy", [])
    assert (buffer.count, buffer.first, buffer.last) == (3, 10, 15)
    assert buffer.size_bytes == (1 + 5 + 1 + 2 + 1) + 0 + 2
    assert (buffer.min_timestamp, buffer.max_timestamp) == (1_000, 3_000)
    assert buffer.opened_at is not None and before <= buffer.opened_at <= time.monotonic()
    assert len(buffer) == 3 and "first=10" in repr(buffer)


def test_offsets_must_increase() -> None:
    buffer = SegmentBuffer()
    buffer.append(5, 0, 0, None, b"v")
    with pytest.raises(ValueError, match="offset 5 does not follow offset 5"):
        buffer.append(5, 0, 0, None, b"v")


def test_records_come_back_as_appended() -> None:
    records = [
        StoredRecord(1, 7, 0, None, b"a", (("x", b"1"), ("x", None))),
        StoredRecord(4, 6, 1, b"k", None, ()),
    ]
    buffer = SegmentBuffer()
    buffer.extend(records)
    assert list(buffer.records()) == records


def test_meta_from_buffer() -> None:
    buffer = SegmentBuffer()
    buffer.extend([StoredRecord(3, 50, 0, None, b"a"), StoredRecord(8, 40, 0, None, b"b")])
    meta = buffer.meta("c", "t", 2, next_offset=20, level=1)
    assert meta == SegmentMeta("c", "t", 2, 1, 3, 8, 20, 2, 40, 50, __version__, SCHEMA_VERSION)
    assert buffer.meta("c", "t", 2).next_offset == 9


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"first": 9}, "first <= last"),
        ({"next_offset": 8}, "last < next_offset"),
        ({"count": 0}, "count 0"),
        ({"count": 7}, "count 7"),
        ({"partition": -1}, "partition and level"),
        ({"min_timestamp": 99}, "min_timestamp"),
    ],
)
def test_meta_rejects_impossible_values(changes: dict[str, int], message: str) -> None:
    fields = {**_meta().to_dict(), **changes}
    with pytest.raises(ValueError, match=message):
        SegmentMeta(**fields)


def test_meta_dict_round_trip_and_type_checks() -> None:
    meta = _meta()
    assert SegmentMeta.from_dict(meta.to_dict()) == meta
    with pytest.raises(ValueError, match="'count' is missing"):
        SegmentMeta.from_dict({k: v for k, v in meta.to_dict().items() if k != "count"})
    with pytest.raises(ValueError, match="'first': expected int"):
        SegmentMeta.from_dict({**meta.to_dict(), "first": True})


def _meta() -> SegmentMeta:
    return SegmentMeta("c", "t", 0, 0, 3, 8, 9, 6, 10, 20)
