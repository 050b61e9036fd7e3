"""What the segment-store tests on a directory and on S3 check alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from relay.store import SegmentBuffer
from relay.store.store import SegmentStore


def assert_broken_streams_publish_nothing(
    store: SegmentStore,
    buffer_of: Callable[[int, int], SegmentBuffer],
    published: Callable[[], list[str]],
) -> None:
    """A streamed segment whose chunks fail halfway, or do not match its metadata, leaves
    nothing behind in `published()` (the backend's files or objects)."""
    meta = buffer_of(0, 29).meta("prod", "orders", 0, level=1)

    def failing() -> Iterator[SegmentBuffer]:
        yield buffer_of(0, 9)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.write_segment_chunks("parquet", failing(), meta)
    with pytest.raises(ValueError, match="does not describe the records written"):
        store.write_segment_chunks("parquet", [buffer_of(0, 9), buffer_of(10, 19)], meta)
    assert published() == []
