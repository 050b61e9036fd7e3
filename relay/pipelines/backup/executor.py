"""The backup on an executor: record batches read from the source node, their records decoded
into store segments' columns; an offset is done once the segment holding it is written,
atomically, under its final name."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, nullcontext

from relay.batches import SourceBatch
from relay.batches.records import decode_batch
from relay.clients.consumer import SourceReader
from relay.clients.worker_cache import evict_reader, source_reader, warm_reader
from relay.config import StoreConfig
from relay.engine.executor.failures import SourceFailure, TargetFailure, opening
from relay.engine.executor.sides import moved_forward, topics_of
from relay.pipelines.backup.spec import BackupTask
from relay.spec import PartitionRoute, PartitionWork
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

    def reader(self) -> SourceReader:
        # Record batches, always: the fetch side of the batch path uses kafka-python's public
        # network client and protocol classes (the relay's fallback is about its producer).
        with opening(SourceFailure):
            task = self.task
            return source_reader(task.source, task.group_id, True, task.fetch, seed=task.seed)

    def writer(self, work: PartitionWork, latencies: list[float]) -> SegmentWriter:
        chain = self._chain.get(work.route.key, work.start)
        return SegmentWriter(self.store, self.task.store, work.route, chain)

    flush_limit = 0.0

    def flush(self, timeout: float | None) -> bool:
        """Segments are written synchronously: nothing is in flight."""
        return True

    def writing(self) -> AbstractContextManager[None]:
        return nullcontext()  # segments are written in the step itself

    def abandon(self, waiting: Callable[[], object] | None = None) -> None:
        """Nothing to drop: an open segment not written is simply read again later."""

    def buffer_limit(self) -> int | None:
        return None  # the open segments are bounded by [store]'s limits

    def warm(self) -> None:
        task = self.task
        warm_reader(task.source, task.group_id, task.fetch, topics_of(task.partitions), task.seed)

    def evict(self, kind: str, waiting: Callable[[], object] | None = None) -> None:
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
        self.unacked_bytes = 0  # a segment is written before its records count
        self.segments = 0
        self.pending = ()  # nothing in flight: a segment is written synchronously

    def write_batches(
        self,
        batches: list[SourceBatch],
        start: int,
        stop: int | None,
        drop: AbstractSet[int] = frozenset(),
    ) -> tuple[int, int]:
        """The records of `batches` at or after `start` and before `stop`, less `drop` (a
        filter rejected them), decoded from their batches straight into the open segment's
        columns: no record object of kafka-python's. Returns how many were written and where
        the next fetch starts (past transaction markers and offset gaps), as the relay's
        rebuild does."""
        written, next_offset = 0, start
        for batch in batches:
            if stop is not None and batch.base_offset >= stop:
                break
            batch_next = batch.next_offset if stop is None else min(batch.next_offset, stop)
            next_offset = max(next_offset, batch_next)
            if batch.next_offset <= start or batch.is_control or batch.header.record_count == 0:
                continue
            if not batch.crc_ok():
                raise SourceFailure(f"CRC mismatch in the batch at offset {batch.base_offset}")
            written += self._append(batch, start, stop, drop)
        return written, next_offset

    def _append(
        self, batch: SourceBatch, start: int, stop: int | None, drop: AbstractSet[int]
    ) -> int:
        """One batch's records in order; a segment that reaches its record or byte limit
        closes right after the record that filled it (not at the end of the fetch)."""
        cfg, written = self.cfg, 0
        timestamp_type = 1 if batch.log_append_time else 0
        end = batch.next_offset if stop is None else stop
        for r in decode_batch(batch):
            offset = r.offset
            if offset < start or offset >= end or offset in drop:
                continue
            buffer = self.buffer
            buffer.append(offset, r.timestamp, timestamp_type, r.key, r.value, r.headers)
            written += 1
            if (
                buffer.count >= cfg.max_segment_records
                or buffer.size_bytes >= cfg.max_segment_bytes
            ):
                self.close(offset + 1)
        return written

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

    def unacknowledged(self) -> tuple[tuple[int, int, int], ...]:
        """A segment is written synchronously: nothing is ever in doubt."""
        return ()

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
