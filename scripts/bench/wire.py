"""Bytes on the wire: a topic's record batches as the broker stores and serves them, fetched
raw (kafka-python's consumer hides batch sizes), so a copy's size per record can be set beside
its source's: batch headers, record framing, headers a relay adds (ktm's `ktm.src`) and
compression all show."""

from __future__ import annotations

import time
from dataclasses import dataclass

from relay.batches import split_batches
from relay.clients.batch_fetch import BatchFetcher
from relay.config import ClusterConfig

# under kafka-python's default 1 MiB response frame; a larger batch still comes whole (KIP-74)
FETCH_BYTES = 512 * 1024
FETCH_TIMEOUT_S = 10.0
STALL_S = 60.0


@dataclass(frozen=True)
class Wire:
    """A topic's record batches: total bytes and the records they hold."""

    size: int
    records: int

    @property
    def per_record(self) -> float | None:
        return self.size / self.records if self.records else None


def topic_wire(bootstrap: str, topic: str, partitions: int) -> Wire:
    """Fetch every batch of ``topic`` from offset 0 to each partition's high watermark and add
    up their sizes (control batches' bytes count, their markers are not records)."""
    fetcher = _fetcher(bootstrap)
    positions = {(topic, p): 0 for p in range(partitions)}
    size = records = 0
    stalled_at = time.monotonic() + STALL_S
    try:
        while positions:
            if time.monotonic() > stalled_at:
                raise TimeoutError(f"fetching {topic} stalled for {STALL_S:.0f} s at {positions}")
            for key, fetched in fetcher.fetch(positions, FETCH_TIMEOUT_S).items():
                if fetched.error is not None:
                    if not getattr(fetched.error, "retriable", False):
                        raise fetched.error
                    continue  # a leader or metadata not ready yet: the next round asks again
                for batch in split_batches(fetched.data)[0]:
                    if batch.next_offset <= positions[key]:
                        continue
                    size += len(batch.data)
                    records += 0 if batch.is_control else batch.header.record_count
                    positions[key] = batch.next_offset
                    stalled_at = time.monotonic() + STALL_S
                if positions[key] >= fetched.high_watermark:
                    del positions[key]
    finally:
        fetcher.close()
    return Wire(size, records)


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    """A partition's real end, from a fetch (Tansu's ListOffsets trails it)."""
    key = (topic, partition)
    fetcher = _fetcher(bootstrap)
    try:
        fetched = fetcher.fetch({key: 0}, FETCH_TIMEOUT_S)[key]
    finally:
        fetcher.close()
    if fetched.error is not None:
        raise fetched.error
    return fetched.high_watermark


def _fetcher(bootstrap: str) -> BatchFetcher:
    cluster = ClusterConfig("bench-wire", (bootstrap,))
    return BatchFetcher(cluster, partition_max_bytes=FETCH_BYTES, max_bytes=FETCH_BYTES)
