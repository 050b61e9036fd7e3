"""Segments as JSON lines: for debugging, and for tools that cannot read Parquet.

Line 1 is the SegmentMeta as a JSON object; then one object per record:
    {"offset": 5, "timestamp": 1700000000000, "timestamp_type": 0,
     "key": "<base64>" | null, "value": "<base64>" | null, "headers": [["name", "<base64>" | null]]}
Binary fields are base64 so any bytes survive; null stays null (a tombstone is not ""). The
file is plain text, so it takes no compression ("none" only).
"""

from __future__ import annotations

import io
import json
from base64 import b64decode, b64encode
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa

from relay.store.checks import checked_records, segment_errors
from relay.store.records import SegmentBuffer, SegmentContents, SegmentMeta, StoredRecord

if TYPE_CHECKING:
    from relay.store.fs import Sink

LINES_PER_WRITE = 4096
_RECORD_FIELDS = {"offset", "timestamp", "timestamp_type", "key", "value", "headers"}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"expected base64 text or null, got {text!r}")
    return b64decode(text, validate=True)  # binascii.Error is a ValueError: a corrupt file


def record_line(record: StoredRecord) -> str:
    return json.dumps(
        {
            "offset": record.offset,
            "timestamp": record.timestamp,
            "timestamp_type": record.timestamp_type,
            "key": _b64(record.key),
            "value": _b64(record.value),
            "headers": [[name, _b64(value)] for name, value in record.headers],
        },
        ensure_ascii=False,
    )


def parse_record(line: str) -> StoredRecord:
    """A record from one line; ValueError/KeyError/TypeError if it is not one."""
    data = json.loads(line)
    if not isinstance(data, dict) or set(data) != _RECORD_FIELDS:
        raise ValueError(f"not a record line: {line[:80]!r}")
    headers = []
    for name, value in data["headers"]:
        if not isinstance(name, str):
            raise ValueError(f"header name must be a string, got {name!r}")
        headers.append((name, _unb64(value)))
    numbers = (data["offset"], data["timestamp"], data["timestamp_type"])
    if any(type(n) is not int for n in numbers):
        raise ValueError(f"offset, timestamp and timestamp_type must be integers: {numbers}")
    return StoredRecord(*numbers, _unb64(data["key"]), _unb64(data["value"]), tuple(headers))


def _lines(source: pa.NativeFile | BinaryIO) -> Iterator[str]:
    """Complete lines of ``source`` without their newline; ValueError on a cut-off last line."""
    # pyarrow's files claim to be io.BufferedIOBase but cannot readline(): wrap them.
    reader = io.BufferedReader(source) if isinstance(source, pa.NativeFile) else source
    for raw in reader:
        if not raw.endswith(b"\n"):
            raise ValueError("truncated: the last line has no newline")
        yield raw[:-1].decode("utf-8")


class JsonLinesFormat:
    """The debugging format (see the module docstring)."""

    name = "jsonl"
    extension = "jsonl"
    compressions: tuple[str, ...] = ("none",)

    def write(
        self, sink: Sink, chunks: Iterable[SegmentBuffer], meta: SegmentMeta, compression: str
    ) -> None:
        if compression != "none":
            raise ValueError(f"the jsonl format takes no compression, got {compression!r}")
        lines = [json.dumps(meta.to_dict(), ensure_ascii=False)]
        for chunk in chunks:
            for record in chunk.records():
                lines.append(record_line(record))
                if len(lines) >= LINES_PER_WRITE:
                    sink.write(("\n".join(lines) + "\n").encode("utf-8"))
                    lines.clear()
        if lines:
            sink.write(("\n".join(lines) + "\n").encode("utf-8"))

    def read_meta(self, source: pa.NativeFile, where: str) -> SegmentMeta:
        with segment_errors(where):
            return _parse_meta(next(_lines(source), None))

    def read(self, source: pa.NativeFile, where: str) -> SegmentContents:
        lines = _lines(source)
        with segment_errors(where):
            meta = _parse_meta(next(lines, None))
        return SegmentContents(meta, checked_records(_records(lines, where), meta, where))


def _parse_meta(line: str | None) -> SegmentMeta:
    if line is None:
        raise ValueError("empty file")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("the first line is not a metadata object")
    return SegmentMeta.from_dict(data)


def _records(lines: Iterator[str], where: str) -> Iterator[StoredRecord]:
    number = 1
    while True:
        number += 1
        with segment_errors(f"{where} line {number}"):
            line = next(lines, None)
            if line is None:
                return
            record = parse_record(line)
        yield record
