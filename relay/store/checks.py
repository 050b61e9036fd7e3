"""Turning what goes wrong while decoding a segment into one SegmentError naming the file.

Shared by both formats. Decoding errors (ValueError, KeyError, ...; pyarrow's ArrowInvalid is a
ValueError) mean a corrupt file. An OSError is a corrupt file too (pyarrow reports a failed page
CRC as an OSError without errno) unless it comes from the filesystem itself: an errno, or the
"AWS Error" text of pyarrow's S3 client. Those pass through for the store to report as a
StoreError, so a network hiccup is never blamed on the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from relay.store.errors import SegmentError
from relay.store.records import SegmentMeta, StoredRecord

_MAX_CAUSE = 240
_DECODING_ERRORS = (ValueError, KeyError, TypeError, IndexError, EOFError, OSError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line, shortened: error messages must stay one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_CAUSE else text[: _MAX_CAUSE - 3] + "..."


def is_filesystem_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and (exc.errno is not None or "AWS Error" in str(exc))


@contextmanager
def segment_errors(where: str) -> Iterator[None]:
    """Re-raise decoding errors inside the block as SegmentError("segment <where>: <cause>")."""
    try:
        yield
    except SegmentError:
        raise
    except _DECODING_ERRORS as exc:
        if is_filesystem_error(exc):
            raise
        raise SegmentError(f"segment {where}: {one_line(exc)}") from exc


def checked_records(
    records: Iterator[StoredRecord], meta: SegmentMeta, where: str
) -> Iterator[StoredRecord]:
    """Pass records through, checking them against the metadata the file carries.

    This is what catches a JSON lines file cut at a line boundary, and rows that do not belong
    to the segment: offsets must rise strictly from meta.first to meta.last, meta.count of them.
    """
    count = 0
    previous = meta.first - 1
    for record in records:
        if record.offset <= previous or record.offset > meta.last:
            raise SegmentError(
                f"segment {where}: offset {record.offset} out of order or outside "
                f"{meta.first}-{meta.last} (after offset {previous})"
            )
        if count == 0 and record.offset != meta.first:
            raise SegmentError(
                f"segment {where}: first record has offset {record.offset}, metadata says "
                f"{meta.first}"
            )
        previous = record.offset
        count += 1
        yield record
    if count != meta.count or (count and previous != meta.last):
        raise SegmentError(
            f"segment {where}: truncated or inconsistent: {count} records up to offset "
            f"{previous}, metadata says {meta.count} up to {meta.last}"
        )
