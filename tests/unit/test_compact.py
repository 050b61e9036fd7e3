"""ktm compact's executor side on a directory store, without Spark: merging streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relay.config import StoreConfig
from relay.pipelines.compact import executor as compact
from relay.pipelines.compact.spec import CompactTask
from relay.store import SegmentBuffer
from relay.store.configured import cached_store


def segment(first: int, last: int) -> SegmentBuffer:
    buffer = SegmentBuffer()
    for offset in range(first, last + 1):
        headers = [("n", b"%d" % offset), ("n", None)]
        buffer.append(offset, 5_000 + offset, 0, b"k%d" % offset, b"v" * 50, headers)
    return buffer


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_merge_bigger_than_a_chunk_is_streamed_and_exact(
    tmp_path: Path, monkeypatch: Any, fmt: str
) -> None:
    """Chunks of ~1 KB: a 10-segment run of 1,000 records goes through in dozens of them."""
    monkeypatch.setattr(compact, "CHUNK_BYTES", 1024)
    compression = "none" if fmt == "jsonl" else "zstd"
    cfg = StoreConfig(str(tmp_path / "store"), "prod", format=fmt, compression=compression)
    store = cached_store(cfg)
    for first in range(0, 1000, 100):
        buffer = segment(first, first + 99)
        store.write_segment(fmt, buffer, buffer.meta("prod", "orders", 0), compression)
    task = CompactTask(cfg, (("orders", 0),), 0, 0.0, 1 << 30, delete=True)

    result = compact.compact_partitions(task)

    assert (result.merged, result.inputs, result.deleted, result.records) == (1, 10, 10, 1000)
    assert result.errors == ()
    (merged,) = store.list_segments("prod", "orders", 0)
    assert (merged.level, merged.first, merged.last) == (1, 0, 999)
    assert list(store.read_records(merged)) == list(segment(0, 999).records())
