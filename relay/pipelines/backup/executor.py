"""The backup on an executor: records read from the source node into store segments; an offset
is done once the segment holding it is written, atomically, under its final name."""

from __future__ import annotations

from typing import Any

from relay.clients.consumer import GroupReader
from relay.config import StoreConfig
from relay.engine.executor.failures import TargetFailure
from relay.engine.executor.sides import evict_reader, moved_forward, source_reader
from relay.spec import BackupTask, PartitionRoute, PartitionWork
from relay.store import SegmentBuffer, SegmentStore
from relay.store.configured import cached_store


class BackupSides:
    def __init__(self, task: BackupTask):
        self.task = task
        self.store = cached_store(task.store)
        self._chain: dict[tuple[str, int], int] = {}

    def works(self, attempt: int) -> tuple[PartitionWork, ...]:
        """The store is the truth: each partition's chain goes on at its next offset there
        (a lost attempt, or an earlier owner, may have written segments after the starts)."""
        cluster = self.task.store.cluster
        for work in self.task.partitions:
            route = work.route
            try:
                nxt = self.store.next_offset(cluster, route.topic, route.partition)
            except Exception as exc:
                raise TargetFailure(str(exc), route.key) from exc
            self._chain[route.key] = work.start if nxt is None else nxt
        return moved_forward(self.task.partitions, self._chain)

    def reader(self) -> GroupReader:
        return source_reader(self.task.source, self.task.group_id)

    def writer(self, work: PartitionWork, latencies: list[float]) -> SegmentWriter:
        chain = self._chain.get(work.route.key, work.start)
        return SegmentWriter(self.store, self.task.store, work.route, chain)

    def flush(self, timeout: float | None) -> None:
        """Segments are written synchronously: nothing is in flight."""

    def abandon(self) -> None:
        """Nothing to drop: an open segment not written is simply read again later."""

    def evict(self, kind: str) -> None:
        evict_reader(self.task.source, self.task.group_id, kind)


class SegmentWriter:
    """Records of one source partition into segments. A segment closes at whichever limit of
    `[store]` comes first; its age is checked on every loop turn, so an idle partition's open
    segment closes on time without waiting for another record. Closing writes it atomically,
    and only then do its offsets count as done."""

    def __init__(
        self, store: SegmentStore, cfg: StoreConfig, route: PartitionRoute, chain_start: int
    ):
        self.store, self.cfg, self.route = store, cfg, route
        self.buffer = SegmentBuffer()
        # The first offset the open segment accounts for: the store's next offset for this
        # partition. Reading may begin later (offsets a filter dropped before, and the group's
        # offset already passed): those offsets belong to this segment too, so the chain of
        # segments has no hole.
        self.start = chain_start
        self.acked = 0  # records in written segments
        self.written_bytes = 0
        self.segments = 0
        self.pending = ()  # nothing in flight: a segment is written synchronously

    def write(self, records: list[Any]) -> None:
        """Append in order; a segment that reaches its record or byte limit closes right after
        the record that filled it (not at the end of the fetch)."""
        cfg = self.cfg
        for r in records:
            buffer = self.buffer
            buffer.append(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers or ())
            if (
                buffer.count >= cfg.max_segment_records
                or buffer.size_bytes >= cfg.max_segment_bytes
            ):
                self.close(r.offset + 1)

    def tick(self, processed_to: int, now: float) -> None:
        """An open segment closes on its age, even when no record comes any more."""
        opened = self.buffer.opened_at
        if self.buffer.count and opened is not None and now - opened >= self.cfg.max_segment_age:
            self.close(processed_to)

    def close(self, processed_to: int) -> None:
        """Write the open segment, covering offsets up to `processed_to` (the consumer's
        position: past any gap after the last record)."""
        if not self.buffer.count:
            return
        route = self.route
        meta = self.buffer.meta(
            self.cfg.cluster,
            route.topic,
            route.partition,
            next_offset=processed_to,
            start=self.start,
        )
        try:
            ref = self.store.write_segment(self.cfg.format, self.buffer, meta, self.cfg.compression)
        except Exception as exc:
            raise TargetFailure(str(exc), route.key) from exc
        self.acked += meta.count
        self.written_bytes += ref.size or 0
        self.segments += 1
        self.start = processed_to
        self.buffer = SegmentBuffer()

    def done_up_to(self, processed_to: int) -> int:
        """Everything read when no record waits in the open segment (what was not written was
        dropped by a filter); else up to the open segment's start."""
        return self.start if self.buffer.count else processed_to

    def flush_needed(self) -> bool:
        return False

    def failure(self) -> TargetFailure | None:
        """A segment is written synchronously: its failure raises where it happens."""
        return None

    def settle(self, processed_to: int) -> BaseException | None:
        """A normal stop writes the open segment (so nothing read is read again)."""
        try:
            self.close(processed_to)
        except TargetFailure as exc:
            return exc.__cause__ or exc
        return None
