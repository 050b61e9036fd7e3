"""The executor side: one task relays one source partition until its epoch ends.

consume -> filters -> stamp provenance -> produce (acks=all) -> on ack, the offset is done.
A task never raises for Kafka trouble: it reports what was acknowledged and what went wrong,
and the driver decides (retry, fail over, stop). Kafka clients live in module-level caches, so a
reused Python worker keeps its connections from one epoch to the next.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from relay.filters import FilterRecord, FilterRuntimeError, apply_filters, cached_filters
from relay.kafka_io import is_retriable
from relay.plan import PROVENANCE_HEADER, PartitionTask, TaskResult, provenance_prefix
from relay.resume import relayed_offsets
from relay.source import PartitionReader
from relay.target import Producer

log = logging.getLogger(__name__)

_readers: dict[tuple[Any, str], PartitionReader] = {}
_producers: dict[Any, Producer] = {}

SKIPPED_ERROR = ":error"  # suffix of a filter id in TaskResult.filtered: dropped on an error
EMPTY_POLL_WAIT = 0.2  # seconds a poll may wait; bounds how late a deadline is noticed
MAX_LATENCY_SAMPLES = 500  # per task and epoch: enough for a histogram, small to pickle


class SourceFailure(Exception):
    """Reading the source failed; wraps the client's error."""


class TargetFailure(Exception):
    """Producing to the destination failed; wraps the client's error."""


@dataclass
class _State:
    """Mutable bookkeeping of one task run."""

    processed_to: int  # every offset below this was produced or filtered
    # (first source offset, record count, future of the producer batch holding them)
    pending: list[tuple[int, int, Any]] = field(default_factory=list)
    consumed: int = 0
    produced_bytes: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    reached_stop: bool = False
    # Seconds from source timestamp to destination ack, sampled once per poll batch (appended
    # from the producer's I/O thread; list.append is atomic).
    latencies: list[float] = field(default_factory=list)


def run_task(task: PartitionTask, attempt: int = 0) -> TaskResult:
    """Relay one partition for one epoch; always returns a result, never raises."""
    started = time.monotonic()
    error: tuple[str, BaseException] | None = None
    try:
        task = _resumed(task) if attempt > 0 else task
    except Exception as exc:  # noqa: BLE001 - reported; the driver re-reads and retries
        return _result(task, _State(task.start), task.start, ("target", exc), 0.0)
    state = _State(processed_to=task.start)
    try:
        reader = _reader(task)
        producer = _producer(task)
        reader.start(task.route.topic, task.route.partition, task.start)
        _pump(task, reader, producer, state, started + task.deadline)
    except SourceFailure as exc:
        error = ("source", exc.__cause__ or exc)
    except TargetFailure as exc:
        error = ("target", exc.__cause__ or exc)
    except FilterRuntimeError as exc:
        error = ("filter", exc)
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which stops cleanly
        error = ("internal", exc)
    next_offset, ack_error = _settle(task, state)
    if ack_error is not None and error is None:
        error = ("target", ack_error)
    if next_offset > task.start:  # acknowledged progress is committed even when failing
        _commit(task, next_offset)
    if error is not None:
        _evict(task, error[0])
    return _result(task, state, next_offset, error, time.monotonic() - started)


def _resumed(task: PartitionTask) -> PartitionTask:
    """Spark re-runs a task whose executor was lost, with the same spec; the lost attempt may
    have delivered records after the spec's start. Resume after what the destination holds."""
    relayed = relayed_offsets(task.target.cluster, [task.route], task.target.request_timeout * 3)
    last = relayed.get(task.route.key)
    if last is None or last + 1 <= task.start:
        return task
    log.warning(
        "retried task resumes topic=%s partition=%s offset=%s",
        task.route.topic,
        task.route.partition,
        last + 1,
    )
    return replace(task, start=last + 1)


def _pump(
    task: PartitionTask, reader: PartitionReader, producer: Producer, state: _State, deadline: float
) -> None:
    route, stop = task.route, task.stop
    filters = cached_filters(task.filters) if task.filters else []
    skip_errors = {spec.id for spec in task.filters if spec.on_error == "skip"}
    prefix = provenance_prefix(task.source.name, route.topic, route.partition)
    while True:
        if stop is not None and state.processed_to >= stop:
            state.reached_stop = True
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            records = reader.poll(min(remaining, EMPTY_POLL_WAIT))
            position = reader.position()
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
        if stop is not None:
            records = [r for r in records if r.offset < stop] if records else records
            position = min(position, stop)
        state.consumed += len(records)
        if filters:
            records = _allowed(task, filters, skip_errors, records, producer, prefix, state)
        _produce(producer, route, prefix, records, state)
        # The whole fetch was handled: the position may be past gaps (compaction, markers) and
        # past filtered records.
        state.processed_to = max(state.processed_to, position)


def _allowed(
    task: PartitionTask,
    filters: list[Any],
    skip_errors: set[str],
    records: list[Any],
    producer: Producer,
    prefix: bytes,
    state: _State,
) -> list[Any]:
    """The records every filter allows. If a filter fails (on_error = "stop"), the records
    before the failing one are still produced, so the stop loses no time and skips nothing."""
    allowed = []
    for record in records:
        try:
            if not _rejected(task, filters, skip_errors, record, state):
                allowed.append(record)
        except FilterRuntimeError:
            _produce(producer, task.route, prefix, allowed, state)
            state.processed_to = record.offset
            raise
    return allowed


def _produce(
    producer: Producer, route: Any, prefix: bytes, records: list[Any], state: _State
) -> None:
    if not records:
        return
    items = []
    for r in records:
        headers = list(r.headers) if r.headers else []
        headers.append((PROVENANCE_HEADER, prefix + str(r.offset).encode()))
        items.append((r.timestamp, r.key, r.value, headers))
        state.produced_bytes += len(r.value or b"") + len(r.key or b"")
    try:
        segments = producer.send_batch(route.target_topic, route.target_partition, items)
    except Exception as exc:
        raise TargetFailure(str(exc)) from exc
    index = 0
    for count, future in segments:
        state.pending.append((records[index].offset, count, future))
        index += count
    _sample_latency(state, segments[-1][1], records[-1].timestamp)


def _sample_latency(state: _State, future: Any, timestamp_ms: int) -> None:
    if len(state.latencies) < MAX_LATENCY_SAMPLES:
        future.add_callback(lambda _: state.latencies.append(time.time() - timestamp_ms / 1000))


def _rejected(
    task: PartitionTask, filters: list[Any], skip_errors: set[str], record: Any, state: _State
) -> bool:
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
        rejected_by = apply_filters(filters, view)
    except FilterRuntimeError as exc:
        if exc.filter_id not in skip_errors:
            raise FilterRuntimeError(
                exc.filter_id,
                f"{exc.error} (topic={record.topic} partition={record.partition} "
                f"offset={record.offset})",
            ) from exc
        rejected_by = f"{exc.filter_id}{SKIPPED_ERROR}"
    if rejected_by is None:
        return False
    state.filtered[rejected_by] = state.filtered.get(rejected_by, 0) + 1
    return True


def _settle(task: PartitionTask, state: _State) -> tuple[int, BaseException | None]:
    """Wait for acks; the first unacknowledged record bounds what counts as done."""
    producer = _producers.get(task.target)
    if state.pending and producer is not None:
        try:
            producer.flush(timeout=task.target.request_timeout * 2 + task.target.linger)
        except Exception:  # noqa: BLE001 - the futures below say which records failed
            pass
    for offset, _, future in state.pending:
        if not future.is_done:
            return offset, TimeoutError(f"no acknowledgement for source offset {offset}")
        if future.failed():
            return offset, future.exception
    return state.processed_to, None


def _commit(task: PartitionTask, next_offset: int) -> None:
    """Best effort: the destination's provenance headers, not this commit, are the truth."""
    try:
        _readers[(task.source, task.group_id)].commit(next_offset)
    except Exception as exc:  # noqa: BLE001
        log.warning(
            "commit failed topic=%s partition=%s offset=%s: %s",
            task.route.topic,
            task.route.partition,
            next_offset,
            exc,
        )


def _reader(task: PartitionTask) -> PartitionReader:
    key = (task.source, task.group_id)
    for other in [k for k in _readers if k != key]:
        # After a failover the old node's client is closed, not left reconnecting forever
        # (and, on brokers that auto-create topics, re-creating them when the node returns).
        _close_quietly(_readers.pop(other).close)
    if key not in _readers:
        try:
            _readers[key] = PartitionReader(task.source, task.group_id)
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
    return _readers[key]


def _producer(task: PartitionTask) -> Producer:
    if task.target not in _producers:
        try:
            _producers[task.target] = Producer(task.target)
        except Exception as exc:
            raise TargetFailure(str(exc)) from exc
    return _producers[task.target]


def _evict(task: PartitionTask, kind: str) -> None:
    """Drop clients after a failure so the next epoch starts from a clean connection state.

    Closing the producer waits (bounded) for in-flight batches, so none lands after the driver
    re-reads the destination tail to find the resume point.
    """
    if kind in ("target", "internal"):
        producer = _producers.pop(task.target, None)
        if producer is not None:
            _close_quietly(producer.close, task.target.request_timeout)
    if kind in ("source", "internal"):
        reader = _readers.pop((task.source, task.group_id), None)
        if reader is not None:
            _close_quietly(reader.close)


def _close_quietly(close: Any, *args: Any) -> None:
    try:
        close(*args)
    except Exception:  # noqa: BLE001 - a broken client is being thrown away anyway
        pass


def _result(
    task: PartitionTask,
    state: _State,
    next_offset: int,
    error: tuple[str, BaseException] | None,
    elapsed: float,
) -> TaskResult:
    reader = _readers.get((task.source, task.group_id))
    try:
        highwater = reader.highwater() if reader is not None else None
    except Exception:  # noqa: BLE001
        highwater = None
    produced = sum(count for offset, count, _ in state.pending if offset < next_offset)
    return TaskResult(
        key=task.route.key,
        start=task.start,
        next_offset=next_offset,
        consumed=state.consumed,
        produced=produced,
        produced_bytes=state.produced_bytes,
        filtered=dict(state.filtered),
        highwater=highwater,
        reached_stop=state.reached_stop and next_offset >= (task.stop or 0),
        error_kind=error[0] if error else None,
        error=f"{type(error[1]).__name__}: {error[1]}" if error else None,
        retriable=error is not None and error[0] in ("source", "target") and is_retriable(error[1]),
        elapsed=elapsed,
        worker_pid=os.getpid(),
        latencies=tuple(state.latencies),
    )
