"""Both ends of a task, as the task loop sees them: where records are read, where they are
written, where a retried task resumes, and what to drop when the task must stop writing at once.
Each pipeline implements `Sides` in its own executor module; the driver names that class
(`Pipeline.sides`) and Spark ships it to the executors with the task specs.

The Kafka clients the sides open are cached per worker process (relay.clients.worker_cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Protocol

from relay.batches import SourceBatch
from relay.batches.records import Record
from relay.engine.executor.failures import TargetFailure
from relay.losses import Loss
from relay.spec import FetchTrouble, PartitionWork

TP = tuple[str, int]  # (topic, partition)

log = logging.getLogger(__name__)


class Writer(Protocol):
    """Where one partition's records go. It answers one question for the loop: up to which
    source offset is everything durable (`done_up_to`, a next offset)."""

    acked: int  # records durable at the destination
    written_bytes: int
    unacked_bytes: int  # written, not durable yet (0 where writing is synchronous)
    segments: int

    def done_up_to(self, processed_to: int) -> int: ...
    def unacknowledged(self) -> tuple[tuple[int, int, int], ...]: ...
    def failure(self) -> TargetFailure | None: ...
    def tick(self, processed_to: int, now: float) -> None: ...
    def flush_needed(self) -> bool: ...
    def settle(self, processed_to: int) -> BaseException | None: ...


class RecordWriter(Writer, Protocol):
    """A writer of records one by one (the record path: restore, and the relay's fallback)."""

    def write(self, records: Sequence[Record]) -> None: ...


class BatchWriter(Writer, Protocol):
    """A writer of record batches (the batch path: relay and backup): the records at or after
    `start` and before `stop`, less `drop`; returns how many it wrote and the next offset to
    fetch (past transaction markers and offset gaps)."""

    def write_batches(
        self, batches: Sequence[SourceBatch], start: int, stop: int | None, drop: AbstractSet[int]
    ) -> tuple[int, int]: ...


class Reader(Protocol):
    """Where a task reads: a Kafka source (relay.clients.consumer.SourceReader, its batch
    path relay.clients.batch_reader.BatchReader) or a store (restore's StoreReader)."""

    def assign(self, starts: Mapping[TP, int]) -> None: ...
    def poll(self, timeout: float) -> Mapping[TP, Sequence[Record] | Sequence[SourceBatch]]:
        """Records or record batches per partition, as the task's writers take them."""
        ...

    def positions(self, keys: Iterable[TP]) -> dict[TP, int]: ...
    def highwater(self, key: TP) -> int | None: ...
    def pause(self, key: TP) -> None: ...
    def commit(self, offsets: Mapping[TP, int]) -> None: ...
    def commit_async(self, offsets: Mapping[TP, int], done: Callable[[], None]) -> None: ...
    def take_losses(self) -> list[Loss]:
        """Source records found lost since the last call (relay.losses)."""
        ...

    def take_trouble(self) -> list[FetchTrouble]:
        """Brokers the reader cannot fetch from, since the last call."""
        ...

    def waiting(self, key: TP) -> tuple[str, float] | None:
        """Why (and how long) a partition waits for records that must come (restore
        --follow); None for a reader that never waits."""
        ...

    def close(self) -> None: ...


class Sides(Protocol):
    def works(self, attempt: int) -> tuple[PartitionWork, ...]: ...
    def reader(self) -> Reader: ...
    def writer(self, work: PartitionWork, latencies: list[float]) -> Writer: ...
    def buffer_limit(self) -> int | None:
        """Unacknowledged bytes past which the task stops reading (None: no limit)."""
        ...

    @property
    def flush_limit(self) -> float:
        """Seconds a final flush may take (what is still out then has failed)."""
        ...

    def flush(self, timeout: float | None) -> bool:
        """Send what is written; True once every write was answered (None: wait up to
        `flush_limit`)."""
        ...

    def writing(self) -> AbstractContextManager[None]:
        """The writes of one step of the task loop: what they queue goes out when it ends."""
        ...

    def abandon(self, waiting: Callable[[], object] | None = None) -> None:
        """Write nothing more, not even what is queued; return once what was sent is settled
        (acknowledged or failed), calling `waiting` every so often meanwhile."""
        ...

    def evict(self, kind: str, waiting: Callable[[], object] | None = None) -> None: ...
    def warm(self) -> None:
        """Open this worker's cached clients for the spec's topics before the first round
        (best effort: Spark.warm runs it, and the first round opens what it could not)."""
        ...


def moved_forward(
    works: tuple[PartitionWork, ...], found: dict[tuple[str, int], int]
) -> tuple[PartitionWork, ...]:
    """`works` with each start moved up to what `found` says is already durable."""
    moved = []
    for work in works:
        nxt = found.get(work.route.key, work.start)
        if nxt > work.start:
            log.warning(
                "retried task resumes topic=%s partition=%s next_offset=%s",
                work.route.topic,
                work.route.partition,
                nxt,
            )
            work = replace(work, start=nxt)
        moved.append(work)
    return tuple(moved)


def topics_of(works: tuple[PartitionWork, ...]) -> frozenset[str]:
    """The source topics of a task's partitions (what its clients warm up for)."""
    return frozenset(work.route.topic for work in works)
