"""The record model of a segment: a column-oriented buffer to write, records and metadata to read.

The backup loop appends every consumed record to a SegmentBuffer, so append() only pushes onto
plain lists (no per-record objects); the Parquet writer turns each list into one Arrow array.
Kafka's record fields are kept exactly: a null key or value (a tombstone) is not b"", headers keep
their order, duplicate names and null values, and both timestamp types are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from relay import __version__

SCHEMA_VERSION = 1
CREATE_TIME = 0
LOG_APPEND_TIME = 1

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One Kafka record as read back from a segment."""

    offset: int
    timestamp: int  # milliseconds since the epoch
    timestamp_type: int  # CREATE_TIME or LOG_APPEND_TIME
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True)
class SegmentMeta:
    """What a segment holds, stored inside the file and checked against its name when read.

    ``next_offset`` is the consume position after the segment. It may exceed ``last + 1``: the
    source log can skip offsets (compaction, transaction markers), so the next segment of the
    chain starts at ``next_offset``, not at ``last + 1``, and the skipped offsets are no hole.
    ``start`` is the first offset the segment accounts for: the previous segment's next offset.
    It is below ``first`` when offsets before the first record hold nothing to keep (records a
    backup filter dropped, or gaps of the source log), so the chain rule is start == previous
    next_offset, and filtered or skipped offsets never read as a hole.
    """

    cluster: str
    topic: str
    partition: int
    level: int
    first: int
    last: int
    next_offset: int
    count: int
    min_timestamp: int
    max_timestamp: int
    ktm_version: str = __version__
    schema_version: int = SCHEMA_VERSION
    start: int = -1  # -1: the same as first

    def __post_init__(self) -> None:
        if self.start == -1:
            object.__setattr__(self, "start", self.first)
        problems = []
        if not 0 <= self.start <= self.first:
            problems.append(f"start {self.start} must be >= 0 and <= first {self.first}")
        if not 0 <= self.first <= self.last < self.next_offset:
            problems.append(
                f"offsets must satisfy 0 <= first <= last < next_offset, "
                f"got {self.first}, {self.last}, {self.next_offset}"
            )
        if not 1 <= self.count <= self.last - self.first + 1:
            problems.append(f"count {self.count} does not fit offsets {self.first}-{self.last}")
        if self.partition < 0 or self.level < 0:
            problems.append(f"partition and level must be >= 0: {self.partition}, {self.level}")
        if self.min_timestamp > self.max_timestamp:
            problems.append(f"min_timestamp {self.min_timestamp} > max_timestamp")
        if problems:
            raise ValueError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SegmentMeta:
        """Inverse of to_dict; ValueError (naming the field) on a missing or mistyped field."""
        fields: dict[str, Any] = {}
        for name, kind in META_FIELD_TYPES.items():
            if name not in data:
                raise ValueError(f"metadata field {name!r} is missing")
            value = data[name]
            if type(value) is not kind:  # bool is an int subclass: reject it too
                expected = kind.__name__
                raise ValueError(f"metadata field {name!r}: expected {expected}, got {value!r}")
            fields[name] = value
        return cls(**fields)


META_FIELD_TYPES: dict[str, type] = {
    "cluster": str,
    "topic": str,
    "partition": int,
    "level": int,
    "first": int,
    "last": int,
    "next_offset": int,
    "count": int,
    "min_timestamp": int,
    "max_timestamp": int,
    "start": int,
    "ktm_version": str,
    "schema_version": int,
}


class SegmentContents(NamedTuple):
    """A segment being read: its metadata at once, its records lazily, in offset order."""

    meta: SegmentMeta
    records: Iterator[StoredRecord]


class Columns(NamedTuple):
    """Read-only view of a SegmentBuffer's lists, for format writers (not copies)."""

    offsets: Sequence[int]
    timestamps: Sequence[int]
    timestamp_types: Sequence[int]
    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    header_starts: Sequence[int]  # record i's headers are header_*[starts[i]:starts[i + 1]]
    header_names: Sequence[str]
    header_values: Sequence[bytes | None]


class SegmentBuffer:
    """Records of one partition, in strictly increasing offset order, stored column by column."""

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._timestamp_types: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._header_starts: list[int] = [0]
        self._header_names: list[str] = []
        self._header_values: list[bytes | None] = []
        self._size = 0
        self._opened_at: float | None = None
        self._min_timestamp = 0  # meaningful only once a record is in
        self._max_timestamp = 0

    def __len__(self) -> int:
        return len(self._offsets)

    def __repr__(self) -> str:
        return f"SegmentBuffer(count={self.count}, first={self.first}, last={self.last})"

    def append(
        self,
        offset: int,
        timestamp: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
    ) -> None:
        """Add one record; ValueError if ``offset`` does not follow the last one."""
        if self._offsets:
            if offset <= self._offsets[-1]:
                raise ValueError(f"offset {offset} does not follow offset {self._offsets[-1]}")
        else:
            self._opened_at = time.monotonic()
            self._min_timestamp = self._max_timestamp = timestamp
        self._offsets.append(offset)
        self._timestamps.append(timestamp)
        self._timestamp_types.append(timestamp_type)
        self._keys.append(key)
        self._values.append(value)
        size = len(key or b"") + len(value or b"")
        for name, header_value in headers:
            self._header_names.append(name)
            self._header_values.append(header_value)
            size += len(name) + len(header_value or b"")
        self._header_starts.append(len(self._header_names))
        self._size += size
        # Plain comparisons: min()/max() calls cost more on this per-record path.
        if timestamp < self._min_timestamp:
            self._min_timestamp = timestamp
        elif timestamp > self._max_timestamp:
            self._max_timestamp = timestamp

    def extend(self, records: Iterable[StoredRecord]) -> None:
        """Append records read back from segments (compaction merges segments this way)."""
        for r in records:
            self.append(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)

    @property
    def count(self) -> int:
        return len(self._offsets)

    @property
    def first(self) -> int | None:
        return self._offsets[0] if self._offsets else None

    @property
    def last(self) -> int | None:
        return self._offsets[-1] if self._offsets else None

    @property
    def size_bytes(self) -> int:
        """Approximate payload size: keys, values, header names and values."""
        return self._size

    @property
    def min_timestamp(self) -> int | None:
        return self._min_timestamp if self._offsets else None

    @property
    def max_timestamp(self) -> int | None:
        return self._max_timestamp if self._offsets else None

    @property
    def opened_at(self) -> float | None:
        """time.monotonic() of the first append: the age that triggers a time-based flush."""
        return self._opened_at

    def columns(self) -> Columns:
        return Columns(
            self._offsets,
            self._timestamps,
            self._timestamp_types,
            self._keys,
            self._values,
            self._header_starts,
            self._header_names,
            self._header_values,
        )

    def records(self) -> Iterator[StoredRecord]:
        starts, names, values = self._header_starts, self._header_names, self._header_values
        for i, offset in enumerate(self._offsets):
            start, end = starts[i], starts[i + 1]
            headers = tuple(zip(names[start:end], values[start:end], strict=True))
            yield StoredRecord(
                offset,
                self._timestamps[i],
                self._timestamp_types[i],
                self._keys[i],
                self._values[i],
                headers,
            )

    def meta(
        self,
        cluster: str,
        topic: str,
        partition: int,
        *,
        next_offset: int | None = None,
        level: int = 0,
        start: int | None = None,
    ) -> SegmentMeta:
        """The metadata of a segment holding exactly this buffer; ValueError if it is empty.

        ``next_offset`` defaults to last + 1; pass the consumer's position when the source log
        skipped offsets after the last record. ``start`` defaults to the first offset; pass the
        previous segment's next offset when records before the first one were left out.
        """
        if not self._offsets:
            raise ValueError("an empty buffer makes no segment")
        last = self._offsets[-1]
        return SegmentMeta(
            cluster=cluster,
            topic=topic,
            partition=partition,
            level=level,
            first=self._offsets[0],
            last=last,
            next_offset=last + 1 if next_offset is None else next_offset,
            count=len(self._offsets),
            min_timestamp=self._min_timestamp,
            max_timestamp=self._max_timestamp,
            start=self._offsets[0] if start is None else start,
        )
