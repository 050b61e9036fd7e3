"""Both ends of a task, as the task loop sees them: where records are read, where they are
written, where a retried task resumes, and what to drop when the task must stop writing at once.
Each pipeline implements `Sides` in its own executor module; the driver names that class
(`Pipeline.sides`) and Spark ships it to the executors with the task specs.

Kafka clients are cached per worker process and reused from one round to the next (any worker
is as warm as another: the clients hold connections and metadata, not partition state);
`close_clients` closes them before Spark stops.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Protocol

from relay.batches import SourceBatch
from relay.clients.batch_reader import BatchReader
from relay.clients.consumer import GroupReader
from relay.clients.producer import Producer
from relay.config import ClusterConfig, FetchConfig, TargetConfig
from relay.engine.executor.failures import SourceFailure, TargetFailure
from relay.spec import PartitionWork

log = logging.getLogger(__name__)

# (source, group, batch path, fetch settings): one reader per worker process at a time
_readers: dict[tuple[ClusterConfig, str, bool, FetchConfig], GroupReader] = {}
_producers: dict[TargetConfig, Producer] = {}


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

    def write(self, records: list[Any]) -> None: ...


class BatchWriter(Writer, Protocol):
    """A writer of record batches (the batch path: relay and backup): the records at or after
    `start` and before `stop`, less `drop`; returns how many it wrote and the next offset to
    fetch (past transaction markers and offset gaps)."""

    def write_batches(
        self, batches: list[SourceBatch], start: int, stop: int | None, drop: AbstractSet[int]
    ) -> tuple[int, int]: ...


class Sides(Protocol):
    def works(self, attempt: int) -> tuple[PartitionWork, ...]: ...
    def reader(self) -> Any: ...
    def writer(self, work: PartitionWork, latencies: list[float]) -> Writer: ...
    def buffer_limit(self) -> int | None:
        """Unacknowledged bytes past which the task stops reading (None: no limit)."""
        ...

    flush_limit: float  # seconds a final flush may take (what is still out then has failed)

    def flush(self, timeout: float | None) -> bool:
        """Send what is written; True once every write was answered (None: wait up to
        `flush_limit`)."""
        ...

    def writing(self) -> AbstractContextManager[None]:
        """The writes of one step of the task loop: what they queue goes out when it ends."""
        ...

    def abandon(self) -> None: ...
    def evict(self, kind: str) -> None: ...
    def warm(self) -> None:
        """Open this worker's cached clients for the spec's topics before the first round
        (best effort: Engine.warm runs it, and the first round opens what it could not)."""
        ...


def source_reader(
    source: ClusterConfig,
    group_id: str,
    batches: bool = False,
    fetch: FetchConfig | None = None,
    warm: frozenset[str] = frozenset(),
) -> GroupReader:
    """The worker's cached reader: of record batches (the batch path) or of records; a new
    reader of batches readies the fetches of the `warm` topics as it opens."""
    fetch = fetch or FetchConfig()
    key = (source, group_id, batches, fetch)
    for other in [k for k in _readers if k != key]:
        # After a failover the old node's client is closed, not left reconnecting forever
        # (and, on brokers that auto-create topics, re-creating them when the node returns).
        _close_quietly(_readers.pop(other).close)
    if key not in _readers:
        try:
            if batches:
                _readers[key] = BatchReader(source, group_id, fetch, warm)
            else:
                _readers[key] = GroupReader(source, group_id, fetch.timeout)
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
    return _readers[key]


def open_at_once(*opens: Callable[[], object]) -> None:
    """Open clients of different clusters side by side: each bootstrap is a few round trips,
    and across a long link one after another they add up to seconds. Errors are left for the
    task to meet when it opens the client itself."""
    threads = [threading.Thread(target=_quietly, args=(o,), daemon=True) for o in opens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _quietly(open_client: Callable[[], object]) -> None:
    try:
        open_client()
    except Exception as exc:  # noqa: BLE001 - a warm-up: the task opens it again and reports
        log.debug("warming a client: %s", exc)


def warm_reader(
    source: ClusterConfig, group_id: str, fetch: FetchConfig, works: tuple[PartitionWork, ...]
) -> None:
    """The worker's cached batch reader, opened with metadata and leader connections for the
    topics of `works` (one cached already is warm from its earlier rounds)."""
    source_reader(source, group_id, True, fetch, frozenset(w.route.topic for w in works))


def evict_reader(source: ClusterConfig, group_id: str, kind: str) -> None:
    """A fresh consumer after a failed round (about 0.1 s, only after an error). A cached one
    that was mid-fetch when its task failed on the destination was seen to return nothing
    more in the next round (both tasks idle in KafkaConsumer.poll, lag left, the target frozen
    a moment before: tests/integration/test_destination_faults.py)."""
    if kind in ("source", "internal", "target"):
        for key in [k for k in _readers if k[:2] == (source, group_id)]:
            _close_quietly(_readers.pop(key).close)


def producer(target: TargetConfig) -> Producer:
    """The worker's cached producer for `target`, made on first use."""
    if target not in _producers:
        try:
            _producers[target] = Producer(target)
        except Exception as exc:
            raise TargetFailure(str(exc)) from exc
    return _producers[target]


def cached_producer(target: TargetConfig) -> Producer | None:
    return _producers.get(target)


def abandon_producer(target: TargetConfig) -> None:
    """Drop the cached producer without flushing what it still holds."""
    dropped = _producers.pop(target, None)
    if dropped is not None:
        _close_quietly(dropped.abandon)


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
