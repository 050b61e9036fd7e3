"""The segment format seam: one small protocol, two formats, chosen by name.

"parquet" (the default; parquet_format.py) is compact and fast; "jsonl" (jsonl_format.py) is
plain text for debugging. A format's name is also the extension of its files, so a listing tells
which format reads a segment without opening it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import pyarrow as pa

from relay.errors import ConfigError
from relay.store.fs import Sink
from relay.store.jsonl_format import JsonLinesFormat
from relay.store.layout import SEGMENT_EXTENSIONS
from relay.store.parquet_format import ParquetFormat
from relay.store.records import SegmentBuffer, SegmentContents, SegmentMeta

DEFAULT_FORMAT = "parquet"
DEFAULT_COMPRESSION = "zstd"


class SegmentFormat(Protocol):
    """How a segment is laid out in one file.

    ``write`` takes a writable binary file (or a path) and the records as buffers, consumed
    one at a time (a small segment is one buffer); ``read_meta`` and ``read`` take a
    readable random-access file and ``where``, the location named in errors. ``read`` returns
    the metadata at once and the records lazily, checked against it. Reading a corrupt or
    truncated file, or records that disagree with the metadata, raises SegmentError; errors of
    the filesystem itself (an errno, S3) pass through as OSError.
    """

    name: str
    extension: str
    compressions: tuple[str, ...]  # the first one is the default

    def write(
        self, sink: Sink, chunks: Iterable[SegmentBuffer], meta: SegmentMeta, compression: str
    ) -> None: ...

    def read_meta(self, source: pa.NativeFile, where: str) -> SegmentMeta: ...

    def read(self, source: pa.NativeFile, where: str) -> SegmentContents: ...


FORMATS: dict[str, SegmentFormat] = {f.name: f for f in (ParquetFormat(), JsonLinesFormat())}
assert all(f.extension == name for name, f in FORMATS.items())
assert set(FORMATS) == set(SEGMENT_EXTENSIONS)
assert FORMATS[DEFAULT_FORMAT].compressions[0] == DEFAULT_COMPRESSION


def get_format(name: str) -> SegmentFormat:
    """The format called ``name``; ConfigError naming the choices otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        choices = ", ".join(FORMATS)
        raise ConfigError(f"unknown segment format {name!r} (expected one of: {choices})") from None


def check_compression(segment_format: SegmentFormat, compression: str) -> str:
    """``compression`` if ``segment_format`` supports it; ConfigError naming the choices."""
    if compression not in segment_format.compressions:
        choices = ", ".join(segment_format.compressions)
        raise ConfigError(
            f"compression {compression!r} is not available for the {segment_format.name} "
            f"format (expected one of: {choices})"
        )
    return compression
