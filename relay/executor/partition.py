"""One source partition inside a task: its records, filters, produce futures and done offsets.

Offsets in this module are next offsets: `processed_to` is the first offset not yet handled
(produced or dropped), `acked_next` the first one not yet acknowledged by the destination.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from relay.clients.producer import Producer
from relay.filters import FilterRecord, FilterRuntimeError, apply_filters
from relay.spec import PROVENANCE_HEADER, PartitionProgress, PartitionWork, provenance_prefix

MAX_LATENCY_SAMPLES = 200  # per report: enough for a histogram, small to send


class SourceFailure(Exception):
    """Reading the source failed; wraps the client's error."""

    key: Any = None


class TargetFailure(Exception):
    """Producing to the destination failed; wraps the client's error."""

    def __init__(self, message: str, key: Any = None):
        super().__init__(message)
        self.key = key


class PartitionState:
    def __init__(
        self,
        work: PartitionWork,
        source_name: str,
        filters: list[Any],
        skip_errors: set[str],
        latencies: list[float],
    ):
        self.route, self.stop = work.route, work.stop
        self.key = work.route.key
        self.processed_to = work.start
        self.acked_next = work.start
        self.committed = work.start  # the group's offset is at least the start: never go back
        self.reached_stop = work.stop is not None and work.start >= work.stop
        # (first source offset, record count, future of the producer batch holding them)
        self.pending: deque[tuple[int, int, Any]] = deque()
        self.consumed = self.produced = self.produced_bytes = 0
        self.filtered: dict[str, int] = {}
        self.filter_errors: dict[str, int] = {}
        self._filters, self._skip = filters, skip_errors
        self._prefix = provenance_prefix(source_name, work.route.topic, work.route.partition)
        self._latencies = latencies  # shared by the task's partitions, emptied at each report

    # ---- reading ------------------------------------------------------------------------------

    def handle(self, records: list[Any], producer: Producer) -> None:
        """Filter and produce one fetch of this partition's records, in order."""
        if self.stop is not None:
            records = [r for r in records if r.offset < self.stop]
        if not records:
            return
        self.consumed += len(records)
        handled_to = records[-1].offset + 1
        if self._filters:
            records = self._allowed(records, producer)
        self._produce(producer, records)
        self.processed_to = max(self.processed_to, handled_to)

    def advance(self, position: int) -> None:
        """The consumer's position may be past offsets with no record (compaction, transaction
        markers) and past filtered records: all of those are handled too."""
        if self.stop is not None:
            position = min(position, self.stop)
        self.processed_to = max(self.processed_to, position)
        if self.stop is not None and self.processed_to >= self.stop:
            self.reached_stop = True
        if not self.pending:
            self.acked_next = self.processed_to

    def _allowed(self, records: list[Any], producer: Producer) -> list[Any]:
        """The records every filter allows. If a filter fails (on_error = "stop"), the records
        before the failing one are still produced, so the stop loses no time and skips nothing."""
        allowed = []
        for record in records:
            try:
                if not self._rejected(record):
                    allowed.append(record)
            except FilterRuntimeError as exc:
                self._produce(producer, allowed)
                self.processed_to = record.offset
                exc.key = self.key  # type: ignore[attr-defined]
                raise
        return allowed

    def _rejected(self, record: Any) -> bool:
        view = FilterRecord(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp,
            record.key,
            record.value,
            list(record.headers or ()),
        )
        try:
            rejected_by = apply_filters(self._filters, view)
        except FilterRuntimeError as exc:
            if exc.filter_id not in self._skip:
                raise FilterRuntimeError(
                    exc.filter_id,
                    f"{exc.error} (topic={record.topic} partition={record.partition} "
                    f"offset={record.offset})",
                ) from exc
            self.filter_errors[exc.filter_id] = self.filter_errors.get(exc.filter_id, 0) + 1
            rejected_by = exc.filter_id
        if rejected_by is None:
            return False
        self.filtered[rejected_by] = self.filtered.get(rejected_by, 0) + 1
        return True

    # ---- producing ----------------------------------------------------------------------------

    def _produce(self, producer: Producer, records: list[Any]) -> None:
        if not records:
            return
        items = []
        size = 0
        for r in records:
            headers = list(r.headers) if r.headers else []
            headers.append((PROVENANCE_HEADER, self._prefix + str(r.offset).encode()))
            items.append((r.timestamp, r.key, r.value, headers))
            size += len(r.value or b"") + len(r.key or b"")
        route = self.route
        try:
            segments = producer.send_batch(route.target_topic, route.target_partition, items)
        except Exception as exc:
            raise TargetFailure(str(exc), self.key) from exc
        self.produced_bytes += size
        index = 0
        for count, future in segments:
            self.pending.append((records[index].offset, count, future))
            index += count
        self._sample_latency(segments[-1][1], records[-1].timestamp)

    def _sample_latency(self, future: Any, timestamp_ms: int) -> None:
        samples = self._latencies
        if len(samples) < MAX_LATENCY_SAMPLES:
            # Appended from the producer's I/O thread; list.append is atomic.
            future.add_callback(lambda _: samples.append(time.time() - timestamp_ms / 1000))

    def collect_acks(self) -> None:
        """Move `acked_next` over every acknowledged batch at the head (acks come in order)."""
        while self.pending and self.pending[0][2].is_done and not self.pending[0][2].failed():
            _, count, _ = self.pending.popleft()
            self.produced += count
        self.acked_next = self.pending[0][0] if self.pending else self.processed_to

    def settled(self) -> bool:
        self.collect_acks()
        return not self.pending

    def settle(self) -> BaseException | None:
        """After the final flush: the first record not acknowledged bounds what counts as done."""
        self.collect_acks()
        if not self.pending:
            return None
        offset, _, future = self.pending[0]
        if future.is_done:
            return future.exception
        return TimeoutError(f"no acknowledgement for source offset {offset}")

    def progress(self, reader: Any) -> PartitionProgress:
        try:
            highwater = reader.highwater(self.key) if reader is not None else None
        except Exception:  # noqa: BLE001 - a gauge, never worth failing for
            highwater = None
        return PartitionProgress(
            key=self.key,
            next_offset=self.acked_next,
            consumed=self.consumed,
            produced=self.produced,
            produced_bytes=self.produced_bytes,
            highwater=highwater,
            reached_stop=self.reached_stop and self.acked_next >= (self.stop or 0),
            filtered=tuple(sorted(self.filtered.items())),
            filter_errors=tuple(sorted(self.filter_errors.items())),
        )
