"""Both ends of a task, per pipeline: where records are read, where they are written, where a
retried task resumes, and what to drop when the task must stop writing at once.

Kafka clients are cached per worker process and reused from one round to the next (any worker
is as warm as another: the clients hold connections and metadata, not partition state);
`close_clients` closes them before Spark stops.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, Protocol

from relay.batches import Origin, codecs
from relay.clients.batch_reader import BatchReader
from relay.clients.consumer import GroupReader
from relay.clients.producer import Producer
from relay.config import ClusterConfig, TargetConfig
from relay.executor.store_reader import StoreReader
from relay.executor.writers import KafkaWriter, SegmentWriter, SourceFailure, TargetFailure
from relay.resume import destination_next_offsets
from relay.spec import (
    BackupTask,
    GroupTask,
    PartitionWork,
    RestoreTask,
    TaskSpec,
)
from relay.store.configured import cached_store

log = logging.getLogger(__name__)

# (source, group, batch path): one reader per worker process at a time
_readers: dict[tuple[ClusterConfig, str, bool], GroupReader] = {}
_producers: dict[TargetConfig, Producer] = {}


class Sides(Protocol):
    def works(self, attempt: int) -> tuple[PartitionWork, ...]: ...
    def reader(self) -> Any: ...
    def writer(
        self, work: PartitionWork, latencies: list[float]
    ) -> KafkaWriter | SegmentWriter: ...
    def flush(self, timeout: float | None) -> None: ...
    def abandon(self) -> None: ...
    def evict(self, kind: str) -> None: ...


def sides_for(task: TaskSpec) -> Sides:
    if isinstance(task, BackupTask):
        return BackupSides(task)
    if isinstance(task, RestoreTask):
        return RestoreSides(task)
    return RelaySides(task)


class _KafkaTarget:
    """The writing side shared by relay and restore: one cached producer per target."""

    def __init__(self, target: TargetConfig, partitions: tuple[PartitionWork, ...]):
        self.target, self.partitions = target, partitions

    def producer(self) -> Producer:
        if self.target not in _producers:
            try:
                _producers[self.target] = Producer(self.target)
            except Exception as exc:
                raise TargetFailure(str(exc)) from exc
        return _producers[self.target]

    def flush(self, timeout: float | None) -> None:
        producer = _producers.get(self.target)
        if producer is not None:
            limit = self.target.request_timeout * 2 + self.target.linger
            try:
                producer.flush(timeout=limit if timeout is None else timeout)
            except Exception:  # noqa: BLE001 - the futures say which records failed
                pass

    def abandon(self) -> None:
        producer = _producers.pop(self.target, None)
        if producer is not None:
            _close_quietly(producer.abandon)

    def evict(self, kind: str) -> None:
        """Drop the producer after a failure so the next round starts from a clean connection
        state. It is abandoned, not flushed: batches queued after a failed one would land
        behind it, and the destination's tail would then claim records it lacks (seen: a
        target frozen for 5 s, its queued batches flushed on close, 4,400 records lost). What
        is already on the wire may still land; the driver re-reads the tail after a backoff,
        and the worst a late one can cause is a duplicate."""
        if kind in ("target", "internal", "channel"):
            producer = _producers.pop(self.target, None)
            if producer is not None:
                _close_quietly(producer.abandon)

    def works(self, attempt: int) -> tuple[PartitionWork, ...]:
        """Spark re-runs a task whose executor was lost, with the same spec; the lost attempt
        may have written records after the spec's starts. Resume after what the destination
        holds."""
        if attempt == 0:
            return self.partitions
        routes = [w.route for w in self.partitions]
        found = destination_next_offsets(
            self.target.cluster, routes, self.target.request_timeout * 3
        )
        return _moved_forward(self.partitions, found)


def _source_reader(source: ClusterConfig, group_id: str, batches: bool = False) -> GroupReader:
    """The worker's cached reader: of record batches (the batch path) or of records."""
    key = (source, group_id, batches)
    for other in [k for k in _readers if k != key]:
        # After a failover the old node's client is closed, not left reconnecting forever
        # (and, on brokers that auto-create topics, re-creating them when the node returns).
        _close_quietly(_readers.pop(other).close)
    if key not in _readers:
        try:
            kind = BatchReader if batches else GroupReader
            _readers[key] = kind(source, group_id)
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
    return _readers[key]


def _evict_reader(source: ClusterConfig, group_id: str, kind: str) -> None:
    """A fresh consumer after a failed round (about 0.1 s, only after an error). A cached one
    that was mid-fetch when its task failed on the destination was seen to return nothing
    more in the next round (both tasks idle in KafkaConsumer.poll, lag left, the target frozen
    a moment before: tests/integration/test_destination_faults.py)."""
    if kind in ("source", "internal", "target"):
        for key in [k for k in _readers if k[:2] == (source, group_id)]:
            _close_quietly(_readers.pop(key).close)


class RelaySides(_KafkaTarget):
    """Relay reads record batches and writes them rebuilt (the batch path; filters see records
    decoded from the batches), unless kafka-python's internals are not the ones the batch path
    uses: then records are read, filtered and written one by one (the record path)."""

    def __init__(self, task: GroupTask):
        super().__init__(task.target, task.partitions)
        self.task = task

    def reader(self) -> GroupReader:
        return _source_reader(self.task.source, self.task.group_id, self.producer().takes_built)

    def writer(self, work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        origin = Origin(self.task.source.name, work.route.topic, work.route.partition)
        target = self.target
        shape = (codecs.BY_NAME[target.compression], target.batch_size)
        return KafkaWriter(self.producer(), work.route, origin, latencies, shape)

    def evict(self, kind: str) -> None:
        super().evict(kind)
        _evict_reader(self.task.source, self.task.group_id, kind)


class RestoreSides(_KafkaTarget):
    def __init__(self, task: RestoreTask):
        super().__init__(task.target, task.partitions)
        self.task = task

    def reader(self) -> StoreReader:
        window = (self.task.from_time, self.task.until_time)
        return StoreReader(cached_store(self.task.store), self.task.store, self.task.follow, window)

    def writer(self, work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        # Restored records carry the same provenance header as relayed ones, named after the
        # stored cluster: a relay into the same topic later resumes after the last one.
        origin = Origin(self.task.store.cluster, work.route.topic, work.route.partition)
        return KafkaWriter(self.producer(), work.route, origin, latencies)


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
        return _moved_forward(self.task.partitions, self._chain)

    def reader(self) -> GroupReader:
        return _source_reader(self.task.source, self.task.group_id)

    def writer(self, work: PartitionWork, latencies: list[float]) -> SegmentWriter:
        chain = self._chain.get(work.route.key, work.start)
        return SegmentWriter(self.store, self.task.store, work.route, chain)

    def flush(self, timeout: float | None) -> None:
        """Segments are written synchronously: nothing is in flight."""

    def abandon(self) -> None:
        """Nothing to drop: an open segment not written is simply read again later."""

    def evict(self, kind: str) -> None:
        _evict_reader(self.task.source, self.task.group_id, kind)


def _moved_forward(
    works: tuple[PartitionWork, ...], found: dict[tuple[str, int], int]
) -> tuple[PartitionWork, ...]:
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


def close_clients(_: object = None) -> int:
    """Close every cached client of this worker process; safe to call twice. The driver runs
    it on every worker before it stops Spark: PySpark ends workers with os._exit, so atexit
    hooks never run there. Returns this worker's pid."""
    while _producers:
        _close_quietly(_producers.popitem()[1].close, 5.0)
    while _readers:
        _close_quietly(_readers.popitem()[1].close)
    return os.getpid()


def _close_quietly(close: Any, *args: Any) -> None:
    try:
        close(*args)
    except Exception:  # noqa: BLE001 - a broken client is being thrown away anyway
        pass
