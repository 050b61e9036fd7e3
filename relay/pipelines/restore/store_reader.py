"""Reading stored partitions for a restore: the segments of each partition, in chain order.

It offers the same few calls as the Kafka reader (assign, poll, positions, highwater), so the
task loop is the same for relay and restore. Positions are next offsets: inside a segment, after
the last record returned; at a segment's end, its next offset (past the source log's gaps).

Follow mode (`ktm restore --follow`) lists the store again every `follow_interval` and goes on
with segments as they land. A hole (a later segment exists, the one in between does not) may be
a segment still being uploaded: it waits up to `late_segment_timeout`, checking again with
backoff, before it calls the segment lost. Without follow, the store is what it is: a hole, an
overlap or an unreadable segment stops the partition at once, with one line naming the keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from relay.config import StoreConfig
from relay.errors import KtmError
from relay.losses import Loss
from relay.pipelines.restore.spec import FROM_FIRST_SEGMENT
from relay.spec import FetchTrouble
from relay.store import (
    ChainError,
    ChainLink,
    ChainProblem,
    SegmentMeta,
    SegmentStore,
    StoredRecord,
    plan_chain,
)

TP = tuple[str, int]
BATCH = 5000  # records a poll returns per partition at most


class SegmentLost(KtmError):
    """A segment the chain needs did not show up (or a hole was found without --follow)."""


class _Partition:
    """One partition's way through its chain of segments."""

    def __init__(self, store: SegmentStore, cfg: StoreConfig, key: TP, start: int, follow: bool):
        self.store, self.cfg, self.key, self.follow = store, cfg, key, follow
        self.position = start
        self.end: int | None = None  # next offset after the last segment listed
        self.metas: dict[str, SegmentMeta] = {}
        self.links: dict[str, ChainLink] = {}
        self.records: Iterator[StoredRecord] | None = None
        self.current: ChainLink | None = None
        self.listed_at = float("-inf")
        self.hole_since: float | None = None
        self.empty_since: float | None = None  # following a partition with no segment yet
        self.paused = False

    def refresh(self, now: float) -> None:
        topic, partition = self.key
        for ref in self.store.list_segments(self.cfg.cluster, topic, partition):
            if ref.path not in self.links:
                meta = self.store.read_meta(ref)
                self.metas[ref.path] = meta
                self.links[ref.path] = ChainLink.of(ref, meta)
        self.end = max((link.next_offset for link in self.links.values()), default=None)
        self.listed_at = now

    def next_segment(self, now: float) -> ChainLink | None:
        """The segment holding `position`, or None when there is none (yet)."""
        if self.current is None and now - self.listed_at >= self.cfg.follow_interval:
            self.refresh(now)
        if self.position == FROM_FIRST_SEGMENT:
            first = plan_chain(self.links.values()).links
            if not first:
                self.empty_since = now if self.empty_since is None else self.empty_since
                return None
            self.position, self.empty_since = first[0].start, None
        plan = plan_chain(self.links.values(), start=self.position)
        if not plan.links:
            return None
        link = plan.links[0]
        overlaps = [p for p in plan.problems if p.kind == "overlap" and link.key in p.keys]
        if overlaps:
            raise ChainError(overlaps)
        if link.start > self.position:  # the segment holding `position` is missing
            hole = [p for p in plan.problems if p.kind == "hole"][:1]
            if not self.follow:
                raise ChainError(hole)
            self._late(hole, now)
            return None
        self.hole_since = None
        return link

    def waiting(self, now: float) -> tuple[str, float] | None:
        """What a following partition waits for: its first segment, or a late one."""
        if self.empty_since is not None:
            return "empty", now - self.empty_since
        if self.hole_since is not None:
            return "late", now - self.hole_since
        return None

    def _late(self, problems: list[ChainProblem], now: float) -> None:
        """A hole while following: wait (the listing repeats every follow_interval) until
        `late_segment_timeout`, then call the segment lost."""
        if self.hole_since is None:
            self.hole_since = now
        if now - self.hole_since > self.cfg.late_segment_timeout:
            raise SegmentLost(
                f"segment lost after waiting {self.cfg.late_segment_timeout:g}s: {problems[0]}"
            )

    def take(self, now: float, window: tuple[int | None, int | None]) -> list[StoredRecord]:
        if self.records is None:
            link = self.next_segment(now)
            if link is None:
                return []
            self.current = link
            meta = self.metas[link.key]
            if _outside(meta, window):
                self._finish()  # nothing of it is in the window: skip it unread
                return []
            assert link.ref is not None
            self.records = iter(self.store.read_records(link.ref))
        return self._read_batch(window)

    def _read_batch(self, window: tuple[int | None, int | None]) -> list[StoredRecord]:
        assert self.records is not None
        batch: list[StoredRecord] = []
        low, high = window
        for record in self.records:
            if record.offset < self.position:
                continue  # restored already (the resume point lies inside this segment)
            self.position = record.offset + 1
            if (low is None or record.timestamp >= low) and (
                high is None or record.timestamp < high
            ):
                batch.append(record)
                if len(batch) >= BATCH:
                    return batch
        self._finish()
        return batch

    def _finish(self) -> None:
        assert self.current is not None
        self.position = max(self.position, self.current.next_offset)
        self.current, self.records = None, None


def _outside(meta: SegmentMeta, window: tuple[int | None, int | None]) -> bool:
    low, high = window
    return (low is not None and meta.max_timestamp < low) or (
        high is not None and meta.min_timestamp >= high
    )


class StoreReader:
    def __init__(
        self,
        store: SegmentStore,
        cfg: StoreConfig,
        follow: bool,
        window: tuple[int | None, int | None],
    ):
        self.store, self.cfg, self.follow, self.window = store, cfg, follow, window
        self._parts: dict[TP, _Partition] = {}

    def assign(self, starts: Mapping[TP, int]) -> None:
        now = time.monotonic()
        self._parts = {}
        for key, start in starts.items():
            part = _Partition(self.store, self.cfg, key, start, self.follow)
            part.refresh(now)
            self._parts[key] = part

    def poll(self, timeout: float) -> dict[TP, list[StoredRecord]]:
        """Up to BATCH records of every partition that has some; waits up to `timeout` when
        none has (following: until the next listing is due)."""
        now = time.monotonic()
        found = {}
        for key, part in self._parts.items():
            if not part.paused:
                records = part.take(now, self.window)
                if records:
                    found[key] = records
        if not found and not any(p.records is not None for p in self._parts.values()):
            time.sleep(timeout)
        return found

    def positions(self, keys: Iterable[TP]) -> dict[TP, int]:
        return {key: self._parts[key].position for key in keys}

    def highwater(self, key: TP) -> int | None:
        """The store's end for the partition: what is left to restore is the restore lag."""
        return self._parts[key].end

    def waiting(self, key: TP) -> tuple[str, float] | None:
        return self._parts[key].waiting(time.monotonic())

    def pause(self, key: TP) -> None:
        self._parts[key].paused = True

    def take_losses(self) -> list[Loss]:
        """A store loses nothing while it is read (a segment gone is SegmentLost)."""
        return []

    def take_trouble(self) -> list[FetchTrouble]:
        return []

    def commit(self, offsets: Mapping[TP, int]) -> None:
        """Nothing to commit: the destination's provenance headers say what was restored."""

    def commit_async(self, offsets: Mapping[TP, int], done: Callable[[], None]) -> None:
        done()

    def close(self) -> None:
        self._parts = {}
