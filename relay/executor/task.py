"""The executor side: one task relays a group of source partitions until the driver stops it.

read (one consumer for the group) -> filters -> stamp provenance -> produce (acks=all) -> on ack,
the offset is done -> report progress to the driver (relay.channel) -> obey "stop".

A task never raises for Kafka trouble: it reports what was acknowledged and what went wrong, and
the driver decides (retry, fail over, stop). It ends when the driver says stop, when every
partition reached its stop offset, on an error, or when the driver's lease runs out (it stops
writing rather than write unsupervised). Kafka clients live in per-worker caches, so a reused
Python worker keeps its connections from one round to the next; `close_clients` closes them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

from relay.channel import ChannelClient
from relay.clients.consumer import GroupReader
from relay.clients.producer import Producer
from relay.clients.settings import is_retriable
from relay.executor.partition import PartitionState, SourceFailure, TargetFailure
from relay.filters import FilterRuntimeError, cached_filters
from relay.resume import destination_next_offsets
from relay.spec import GroupResult, GroupTask, PartitionWork, TaskError

log = logging.getLogger(__name__)

EMPTY_POLL_WAIT = 0.2  # seconds a poll may wait; bounds how late "stop" is noticed
COMMIT_INTERVAL = 1.0  # seconds between source group commits of acknowledged offsets

_readers: dict[tuple[Any, str], GroupReader] = {}
_producers: dict[Any, Producer] = {}


def run_group(task: GroupTask, attempt: int = 0) -> GroupResult:
    """Relay a group of partitions; always returns a result, never raises."""
    started = time.monotonic()
    hello = {"round": task.round_id, "task": task.task_id, "attempt": attempt, "pid": os.getpid()}
    try:
        channel = ChannelClient(task.channel, hello)
    except OSError as exc:
        # Without the channel the driver could not stop this task: do nothing at all.
        lost = TaskError("channel", f"cannot reach the driver: {exc}", retriable=True)
        return GroupResult(task.round_id, task.task_id, attempt, (), lost, 0.0, os.getpid())
    try:
        run = GroupRun(task, attempt, channel)
        error = run.execute()
        result = run.result(error, time.monotonic() - started)
        channel.report(result, final=True)
        return result
    finally:
        channel.close()


class GroupRun:
    """The state of one task attempt."""

    def __init__(self, task: GroupTask, attempt: int, channel: ChannelClient):
        self.task, self.attempt, self.channel = task, attempt, channel
        self.parts: dict[tuple[str, int], PartitionState] = {}
        self.latencies: list[float] = []

    def execute(self) -> TaskError | None:
        error: TaskError | None = None
        reader = None
        try:
            works = _resumed(self.task) if self.attempt > 0 else self.task.partitions
            filters = cached_filters(self.task.filters) if self.task.filters else []
            skip = {spec.id for spec in self.task.filters if spec.on_error == "skip"}
            self.parts = {
                w.route.key: PartitionState(w, self.task.source.name, filters, skip, self.latencies)
                for w in works
            }
            reader = _reader(self.task)
            producer = _producer(self.task)
            reader.assign({k: p.processed_to for k, p in self.parts.items()})
            self._pump(reader, producer)
        except SourceFailure as exc:
            error = _error("source", exc.__cause__ or exc, exc.key)
        except TargetFailure as exc:
            error = _error("target", exc.__cause__ or exc, exc.key)
        except FilterRuntimeError as exc:
            error = _error("filter", exc, getattr(exc, "key", None))
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which stops cleanly
            error = _error("internal", exc, None)
        if self.channel.lost:
            # No lease (the driver is gone or lost its right to these partitions): nothing
            # more may be sent, not even what the producer holds unsent. Only what was
            # acknowledged counts; the next owner reads the destination's tail.
            _abandon(self.task)
            for part in self.parts.values():
                part.collect_acks()
            error = error or TaskError("channel", self.channel.reason, retriable=True)
        else:
            error = error or self._settle()
        self._commit(reader, final=True)
        if error is not None:
            _evict(self.task, error.kind)
        return error

    def _pump(self, reader: GroupReader, producer: Producer) -> None:
        next_report = next_commit = time.monotonic()
        while not self.channel.should_stop:
            active = [p for p in self.parts.values() if not p.reached_stop]
            if not active:
                if all(p.settled() for p in self.parts.values()):
                    return
                producer.flush(timeout=EMPTY_POLL_WAIT)
            else:
                self._step(reader, producer, active)
            now = time.monotonic()
            if now >= next_report:
                self.channel.report(self.result(None, 0.0))
                next_report = now + self.task.report_interval
            if now >= next_commit:
                self._commit(reader)
                next_commit = now + COMMIT_INTERVAL

    def _step(self, reader: GroupReader, producer: Producer, active: list[PartitionState]) -> None:
        try:
            batch = reader.poll(EMPTY_POLL_WAIT)
            positions = reader.positions([p.key for p in active])
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
        for part in active:
            records = batch.get(part.key)
            if records:
                if self.channel.should_stop:  # the lease may have run out during the poll
                    return
                part.handle(records, producer)
            part.advance(positions[part.key])
            if part.reached_stop:
                reader.pause(part.key)
            part.collect_acks()

    def _settle(self) -> TaskError | None:
        """Wait (bounded) for every produced record's ack; the first record not acknowledged
        bounds what counts as done in its partition."""
        producer = _producers.get(self.task.target)
        if producer is not None and any(p.pending for p in self.parts.values()):
            try:
                producer.flush(
                    timeout=self.task.target.request_timeout * 2 + self.task.target.linger
                )
            except Exception:  # noqa: BLE001 - the futures say which records failed
                pass
        error = None
        for part in self.parts.values():
            failure = part.settle()
            if failure is not None and error is None:
                error = _error("target", failure, part.key)
        return error

    def _commit(self, reader: GroupReader | None, final: bool = False) -> None:
        """Best effort: the destination's provenance headers, not this commit, are the truth.
        While running, commits do not wait (a dead source node must not stall the loop); the
        last one waits, briefly."""
        moved = {k: p.acked_next for k, p in self.parts.items() if p.acked_next > p.committed}
        if reader is None or not moved:
            return

        def done() -> None:
            for key, offset in moved.items():
                part = self.parts[key]
                part.committed = max(part.committed, offset)

        try:
            if not final:
                reader.commit_async(moved, done)
                return
            reader.commit(moved)
        except Exception as exc:  # noqa: BLE001
            log.warning("commit failed (%d partitions): %s", len(moved), exc)
            return
        done()

    def result(self, error: TaskError | None, elapsed: float) -> GroupResult:
        reader = _readers.get((self.task.source, self.task.group_id))
        samples, self.latencies[:] = list(self.latencies), []
        return GroupResult(
            round_id=self.task.round_id,
            task_id=self.task.task_id,
            attempt=self.attempt,
            partitions=tuple(p.progress(reader) for p in self.parts.values()),
            error=error,
            elapsed=elapsed,
            worker_pid=os.getpid(),
            latencies=tuple(samples),
        )


def _error(kind: str, exc: BaseException, key: Any) -> TaskError:
    message = f"{type(exc).__name__}: {exc}" if kind != "filter" else str(exc)
    retriable = kind in ("source", "target") and is_retriable(exc)
    return TaskError(kind, message, retriable, key)


def _resumed(task: GroupTask) -> tuple[PartitionWork, ...]:
    """Spark re-runs a task whose executor was lost, with the same spec; the lost attempt may
    have delivered records after the spec's starts. Resume after what the destination holds."""
    routes = [w.route for w in task.partitions]
    at_destination = destination_next_offsets(
        task.target.cluster, routes, task.target.request_timeout * 3
    )
    works = []
    for work in task.partitions:
        found = at_destination.get(work.route.key, work.start)
        if found > work.start:
            log.warning(
                "retried task resumes topic=%s partition=%s next_offset=%s",
                work.route.topic,
                work.route.partition,
                found,
            )
            work = replace(work, start=found)
        works.append(work)
    return tuple(works)


def _reader(task: GroupTask) -> GroupReader:
    key = (task.source, task.group_id)
    for other in [k for k in _readers if k != key]:
        # After a failover the old node's client is closed, not left reconnecting forever
        # (and, on brokers that auto-create topics, re-creating them when the node returns).
        _close_quietly(_readers.pop(other).close)
    if key not in _readers:
        try:
            _readers[key] = GroupReader(task.source, task.group_id)
        except Exception as exc:
            raise SourceFailure(str(exc)) from exc
    return _readers[key]


def _producer(task: GroupTask) -> Producer:
    if task.target not in _producers:
        try:
            _producers[task.target] = Producer(task.target)
        except Exception as exc:
            raise TargetFailure(str(exc)) from exc
    return _producers[task.target]


def _evict(task: GroupTask, kind: str) -> None:
    """Drop clients after a failure so the next round starts from a clean connection state.

    Closing the producer waits (bounded) for in-flight batches, so none lands after the driver
    re-reads the destination tail to find the resume point.
    """
    if kind in ("target", "internal", "channel"):
        producer = _producers.pop(task.target, None)
        if producer is not None:
            _close_quietly(producer.close, task.target.request_timeout)
    if kind in ("source", "internal"):
        reader = _readers.pop((task.source, task.group_id), None)
        if reader is not None:
            _close_quietly(reader.close)


def _abandon(task: GroupTask) -> None:
    producer = _producers.pop(task.target, None)
    if producer is not None:
        _close_quietly(producer.abandon)


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
