"""Batches a compacted destination's cleaner left without provenance, told apart by their
records (`relay.provenance.copies` has the rule of what a batch holds, and
`relay.provenance.resume` says when the destination cannot settle where a partition resumes).

Several source partitions feed one destination partition; one of them (A) may have written its
last copies in batches that have since lost the record carrying their header (a later record
of the same key was written after them, or it was a tombstone), and the relay group's
committed offset may be behind them (it is committed a second at most after the destination
acknowledged: a `kill -9` in that second, then a cleaning pass before the restart) or gone
(`offsets.retention.minutes` after the group emptied). Resuming A after its last copy still
named would copy the survivors of those batches again.

A's copies are in A's order, each batch's records at consecutive offset deltas, the i-th
copying A's i-th offset of the batch's (lost) runs; the cleaner keeps each survivor's offset
delta and the batch's last offset. So a batch that lost its provenance, after A's last named
copy, **is A's** when its survivors are A's records, each at the same shift from its delta
(key, value, headers and timestamp equal; the timestamp not where the destination batch is
LogAppendTime), at or after where A stands; A then stands after the batch's last offset. The
shift may pass A's offsets that no batch shows: batches the cleaner emptied and dropped (their
records were all superseded, so copying them again duplicates no survivor), but no further
than the destination offsets between could hold. The first shift that fits is taken, so a
batch whose records the source holds twice makes A stand too early, never too late.

A batch none of whose survivors is among A's records after where it stands is not A's. One
whose survivors are there but not at one shift (a filter or the source's own compaction left
a gap inside it) may be A's: A stays unsettled, and resuming may copy its survivors again.
A's records are read from the source, at most `READ_LIMIT` of them per source partition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass

from relay.batches import SourceBatch
from relay.batches.records import Decoded, decode_batch
from relay.clients.batch_fetch import BatchFetcher
from relay.clients.tails import fetch_range
from relay.config import ClusterConfig
from relay.provenance.copies import origins, provenance_lost
from relay.provenance.resume import AtDestination
from relay.spec import SourcePartition

READ_LIMIT = 100_000  # source records read per unsettled source partition
Content = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def attribute(
    source: ClusterConfig,
    tail: AtDestination,
    committed: Mapping[SourcePartition, int | None],
    timeout: float,
) -> tuple[dict[SourcePartition, int], frozenset[SourcePartition]]:
    """For each source partition `tail` left unsettled: where it stands past the batches that
    are its records (see above), and those still unsettled."""
    stands: dict[SourcePartition, int] = {}
    unsettled: set[SourcePartition] = set()
    with closing(BatchFetcher(source, timeout)) as fetcher:
        for dest, batches in sorted(tail.tails.items()):
            for key in sorted(tail.unsettled & tail.feeders.get(dest, set())):
                found = tail.delivered.get(key)
                starts = [found.next_offset] if found is not None else []
                starts += [c for c in [committed.get(key)] if c is not None]
                if not starts:
                    unsettled.add(key)
                    continue
                chain = Chain(min(starts), max(starts), _after_last_named(batches, key))
                chain.follow(functools.partial(_read, fetcher, key, timeout=timeout))
                stands[key] = chain.stands
                if chain.doubt:
                    unsettled.add(key)
    return stands, frozenset(unsettled)


@dataclass
class Chain:
    """One source partition's records followed through the batches after its last named copy
    (`after`): its next batch there starts at `floor` or later (after the last named copy),
    and it stands at least at `stands` (the relay group's committed offset may be later)."""

    floor: int
    stands: int
    after: tuple[int, list[SourceBatch]]  # where the last named copy's batch ends, and those after
    doubt: bool = False

    def follow(self, read: Callable[[int, int], dict[int, Decoded]]) -> None:
        position, batches = self.after
        lost = [b for b in batches if provenance_lost(b) and decode_batch(b)]
        if not lost:
            return
        span = batches[-1].next_offset - position  # each destination offset holds one record
        limit = min(READ_LIMIT, span)
        records = read(self.floor, self.floor + limit)
        contents: dict[Content, list[int]] = {}
        for offset, record in sorted(records.items()):
            contents.setdefault(_content(record), []).append(offset)
        for batch in lost:
            start = self._shift(batch, records, contents, batch.base_offset - position)
            if start is not None:
                self.floor = start + batch.header.last_offset_delta + 1
                self.stands, position = max(self.stands, self.floor), batch.next_offset
                self.doubt = False  # an earlier batch that did not fit was not this one's
            elif limit < span or _any_among(batch, contents, self.stands):
                self.doubt = True

    def _shift(
        self,
        batch: SourceBatch,
        records: dict[int, Decoded],
        contents: dict[Content, list[int]],
        room: int,
    ) -> int | None:
        """The source offset of `batch`'s first record if its survivors are this source
        partition's records at one shift from their deltas, at most `room` offsets on from
        `floor`; None if they are not."""
        survivors = decode_batch(batch)
        base, first = batch.base_offset, survivors[0]
        delta = first.offset - base
        for offset in contents.get(_content(first), []):
            start = offset - delta
            if not self.floor <= start <= self.floor + room:
                continue
            if all(_same(records.get(start + s.offset - base), s, batch) for s in survivors):
                return start
        return None


def _read(
    fetcher: BatchFetcher, key: SourcePartition, lower: int, upper: int, timeout: float
) -> dict[int, Decoded]:
    """A source partition's records in [lower, upper), by offset."""
    found: dict[int, Decoded] = {}
    for batch in fetch_range(fetcher, key, lower, upper, timeout):
        for record in decode_batch(batch):
            if lower <= record.offset < upper:
                found[record.offset] = record
    return found


def _after_last_named(
    batches: list[SourceBatch], key: SourcePartition
) -> tuple[int, list[SourceBatch]]:
    """Where the batch of `key`'s last named copy ends (the tail's start if none), and the
    batches after it."""
    last = -1
    for index, batch in enumerate(batches):
        if any((p.topic, p.partition) == key for p, _ in origins(batch)):
            last = index
    if last < 0:
        return (batches[0].base_offset if batches else 0), batches
    return batches[last].next_offset, batches[last + 1 :]


def _content(record: Decoded) -> Content:
    return record.key, record.value, tuple(record.headers)


def _same(source: Decoded | None, copy: Decoded, batch: SourceBatch) -> bool:
    if source is None or _content(source) != _content(copy):
        return False
    return batch.log_append_time or source.timestamp == copy.timestamp


def _any_among(batch: SourceBatch, contents: dict[Content, list[int]], since: int) -> bool:
    """Whether a survivor of `batch` is among the source's records from offset `since` on."""
    return any(
        o >= since for record in decode_batch(batch) for o in contents.get(_content(record), [])
    )
