"""Source offsets to destination offsets, exactly, through provenance (`relay.resume` has the
rule of what a destination batch holds, in either header form).

A consumer group's committed source offset c translates to the destination offset of the first
record copied from a source offset >= c (the partition's end when there is none yet): a consumer
that resumes there reads no record twice and skips none. One writer per source partition keeps
its copies in source-offset order at the destination, even when several source partitions
share one destination partition (`dest:N`), so the search is a binary search over destination
batches: a few small fetches, not a scan. MirrorMaker 2 translates through sparse offset syncs
instead and may land before that point.

Used by `ktm restore --groups` and by the relay's group sync (relay.pipelines.mirror.group_sync).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing

from relay.batches import SourceBatch
from relay.batches.records import record_offsets
from relay.clients import admin
from relay.clients.batch_fetch import TP, BatchFetcher
from relay.clients.tails import fetch_range
from relay.config import ClusterConfig
from relay.resume import origins
from relay.spec import SourcePartition

SCAN_WINDOW = 1000  # destination offsets read per fetch while looking for a source's next copy


def first_copy_at_or_after(
    cluster: ClusterConfig, dest: TP, source: SourcePartition, offset: int, timeout: float
) -> int:
    """The destination offset in `dest` of the first copy of a record of `source` whose source
    offset is >= `offset`; the partition's end if there is none."""
    with closing(Translator(cluster, timeout)) as translator:
        bounds = translator.bounds([dest])
        return translator.first_copy(dest, source, offset, bounds[dest])


class Translator:
    """Several searches over one connection: read the bounds of the destination partitions
    once, then search each (a search only looks below the end it was given)."""

    def __init__(self, cluster: ClusterConfig, timeout: float):
        self.cluster, self.timeout = cluster, timeout
        self._fetcher = BatchFetcher(cluster, timeout)
        # Searches of one partition with the same bounds probe the same middles first: many
        # groups' searches share those reads.
        self._probed: dict[tuple[TP, SourcePartition, int, int], list[tuple[int, int]]] = {}

    def bounds(self, dests: list[TP]) -> dict[TP, tuple[int, int]]:
        """(beginning, end) of each destination partition, read now."""
        begin, end = admin.offset_bounds(self.cluster, dests, self.timeout)
        return {dest: (begin[dest], end[dest]) for dest in dests}

    def first_copy(
        self, dest: TP, source: SourcePartition, offset: int, bounds: tuple[int, int]
    ) -> int:
        """As `first_copy_at_or_after`, within `bounds`: `bounds[1]` when no copy lies there."""

        def next_copies(lower: int, upper: int) -> list[tuple[int, int]]:
            key = (dest, source, lower, upper)
            if key not in self._probed:
                self._probed[key] = _next_copies(
                    self._fetcher, dest, source, lower, upper, self.timeout
                )
            return self._probed[key]

        return search(bounds[0], bounds[1], offset, next_copies)

    def close(self) -> None:
        self._fetcher.close()


def search(
    low: int, high: int, offset: int, next_copies: Callable[[int, int], list[tuple[int, int]]]
) -> int:
    """The binary search of `first_copy_at_or_after` over destination offsets [low, high):
    `next_copies(lower, upper)` gives the (destination, source) offsets of the copies in the
    first batch at or after `lower` that holds any, in order. Records of other sources may lie
    between the copies (`dest:N`), so a half without copies says nothing of the other."""
    best = high  # the first copy known to hold `offset` or later; the end until one is seen
    while low < high:
        middle = (low + high) // 2
        found = next_copies(middle, high)
        if found and found[0][1] < offset:
            later = [d for d, s in found if s >= offset]
            if later:
                return later[0]  # the copies before it all hold earlier source offsets
            low = found[-1][0] + 1  # every copy up to here holds an earlier source offset
            continue
        if found:
            best = found[0][0]  # no copy lies in [middle, found[0][0])
        high = middle
    return best


def copies_in(batch: SourceBatch, source: SourcePartition) -> list[tuple[int, int]]:
    """(destination offset, source offset) of each record of `batch` copied from `source`."""
    pairs: list[tuple[int, int]] = []
    for provenance, record in origins(batch):
        if (provenance.topic, provenance.partition) != source:
            continue
        if not provenance.batch:
            pairs.append((record.offset, provenance.last))
            continue
        sources = [o for first, last in provenance.runs for o in range(first, last + 1)]
        pairs.extend(zip(record_offsets(batch), sources, strict=False))
    return pairs


def _next_copies(
    fetcher: BatchFetcher, dest: TP, source: SourcePartition, lower: int, upper: int, t: float
) -> list[tuple[int, int]]:
    """The copies of `source` in the first destination batch at or after `lower` (and before
    `upper`) that holds any; [] if none does."""
    position = lower
    while position < upper:
        window = min(upper, position + SCAN_WINDOW)
        batches = fetch_range(fetcher, dest, position, window, t)
        for batch in batches:
            found = [(d, s) for d, s in copies_in(batch, source) if lower <= d < upper]
            if found:
                return found
        position = max(window, batches[-1].next_offset) if batches else window
    return []
