"""The executor side: one task moves its partitions until the driver stops it.

read (one reader for the group) -> filters -> write -> once durable, the offset is done ->
report progress to the driver (relay.engine.channel) -> obey "stop". The same loop serves the three
pipelines (each pipeline's `Sides` says where records come from and go to):

- relay: Kafka -> Kafka (durable = acks=all)
- backup: Kafka -> store segments (durable = the segment written under its final name)
- restore: store segments -> Kafka

A task never raises: it reports what is durable and what went wrong, and the driver decides
(retry, fail over, stop). It ends when the driver says stop, when every partition reached its
stop offset, on an error, or when the driver's lease runs out (it stops writing rather than
write unsupervised).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence

from relay.batches import SourceBatch
from relay.batches.records import Record
from relay.clients.settings import is_retriable
from relay.engine.channel import ChannelClient
from relay.engine.executor.failures import (
    DeliveryFailure,
    Refused,
    SourceFailure,
    SourceLost,
    TargetFailure,
)
from relay.engine.executor.partition import PartitionState
from relay.engine.executor.sides import TP, Reader, Sides
from relay.engine.executor.throttle import Throttle
from relay.filters import FilterRuntimeError, cached_filters
from relay.losses import Loss
from relay.spec import PartitionProgress, TaskError, TaskResult, TaskSpec

log = logging.getLogger(__name__)

EMPTY_POLL_WAIT = 0.2  # seconds a poll may wait; bounds how late "stop" is noticed
COMMIT_INTERVAL = 1.0  # seconds between source group commits of durable offsets
HOLD_WAIT = 0.05  # seconds a held task waits for its lease between checks
BACKED_UP_WAIT = 0.02  # seconds between looks at the acks while the writer is backed up
SWEEP_INTERVAL = 0.25  # seconds between passes over every partition of the task
WRITE_SLICE = 0.05  # seconds of writing before the producer's I/O thread is woken (see _write)
LONG_STEP = 1.0  # seconds of writing one poll's records before the task reports amid them
# A report with nothing new waits this many report intervals (2 s at the default 0.5 s; the
# driver takes a task silent for 8 s as lost): an idle task's reports every interval cost it
# and the driver wake-ups for nothing.
QUIET_REPORTS = 4


def run_task(task: TaskSpec, sides: Callable[..., Sides], attempt: int = 0) -> TaskResult:
    """Move the task's partitions with the pipeline's `sides`, made from the task spec;
    always returns a result, never raises."""
    started = time.monotonic()
    hello = {"round": task.round_id, "task": task.task_id, "attempt": attempt, "pid": os.getpid()}
    try:
        channel = ChannelClient(task.channel, hello)
    except OSError as exc:
        # Without the channel the driver could not stop this task: do nothing at all.
        lost = TaskError("channel", f"cannot reach the driver: {exc}", retriable=True)
        return TaskResult(task.round_id, task.task_id, attempt, (), lost, 0.0, os.getpid())
    try:
        run = TaskRun(task, attempt, channel, sides(task))
        error = run.execute()
        result = run.result(error, time.monotonic() - started, final=True)
        channel.report(result, final=True)
        return result
    finally:
        channel.close()


class TaskRun:
    """The state of one task attempt."""

    def __init__(self, task: TaskSpec, attempt: int, channel: ChannelClient, sides: Sides):
        self.task, self.attempt, self.channel, self.sides = task, attempt, channel, sides
        self.parts: dict[tuple[str, int], PartitionState] = {}
        self.latencies: list[float] = []
        self.reader: Reader | None = None
        self.buffer_limit: int | None = None
        self.throttle = Throttle(None, None)
        self._writing: set[tuple[str, int]] = set()  # partitions with writes not yet durable
        self._reported: dict[tuple[str, int], tuple[object, ...]] = {}  # marks last reported
        self._throttled_sent = 0.0  # the seconds throttled the last live report said

    def execute(self) -> TaskError | None:
        error: TaskError | None = None
        try:
            works = self.sides.works(self.attempt)
            specs = getattr(self.task, "filters", ())
            filters = cached_filters(specs) if specs else []
            skip = {spec.id for spec in specs if spec.on_error == "skip"}
            self.reader = self.sides.reader()
            self.buffer_limit = self.sides.buffer_limit()
            rates = getattr(self.task, "rates", None)
            if rates is not None:
                self.throttle = Throttle(rates.records_per_second, rates.bytes_per_second)
            self.parts = {
                w.route.key: PartitionState(w, self.sides.writer(w, self.latencies), filters, skip)
                for w in works
            }
            self.reader.assign({k: p.processed_to for k, p in self.parts.items()})
            self._pump()
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which decides
            error = _error(exc)
        if self.channel.lost:
            # No lease (the driver is gone or lost its right to these partitions): nothing
            # more may be written, not even what a producer holds unsent. Only what is durable
            # counts; the next owner reads where things stand.
            self.sides.abandon(self._still_here())
            for part in self.parts.values():
                part.acked_next = part.writer.done_up_to(part.processed_to)
            error = error or TaskError("channel", self.channel.reason, retriable=True)
        else:
            error = error or self._settle()
        self._commit(final=True)
        if error is not None:
            self.sides.evict(error.kind, self._still_here())
        return error

    def _still_here(self, after: float = 0.0) -> Callable[[], None]:
        """A report at its first call `after` seconds from now and then every report interval,
        while the task waits for a busy destination's answers (seconds, at 10,000 partitions on
        Tansu) or writes a big fetch: a silent task is taken for lost and cancelled, and what
        it sent could then land after the next round read the destination."""
        next_report = time.monotonic() + after

        def report() -> None:
            nonlocal next_report
            if time.monotonic() >= next_report:
                self.channel.report(self.live_result())
                next_report = time.monotonic() + self.task.report_interval

        return report

    def _pump(self) -> None:
        next_report = next_commit = next_sweep = reported = time.monotonic()
        active: list[PartitionState] = []
        while not self.channel.should_stop:
            now = time.monotonic()
            sweep = now >= next_sweep  # a pass over every partition, not only the busy ones
            if sweep:
                active = [p for p in self.parts.values() if not p.reached_stop]
                next_sweep = now + SWEEP_INTERVAL
            if not active:
                if all(p.settled(now) for p in self.parts.values()):
                    return
                self.sides.flush(EMPTY_POLL_WAIT)
            elif self._step(active, sweep):
                # out of the loop's list at once, not at the next sweep: the polls for
                # partitions all stopped would each wait EMPTY_POLL_WAIT for nothing (a
                # bounded run's end came 0.25 s late)
                active = [p for p in active if not p.reached_stop]
            now = time.monotonic()
            if now >= next_report:
                result, throttled = self.live_result(), self.throttle.held
                news = _news(result) or throttled != self._throttled_sent
                if news or now - reported >= QUIET_REPORTS * self.task.report_interval:
                    self.channel.report(result)
                    reported, self._throttled_sent = now, throttled
                next_report = now + self.task.report_interval
            if now >= next_commit:
                self._commit()
                next_commit = now + COMMIT_INTERVAL

    def _step(self, active: list[PartitionState], sweep: bool) -> bool:
        """One poll: the partitions it brought records for are written, and the acks of those
        being written are collected. A sweep also moves every partition to its reader's
        position (past offsets that hold no record), ticks every writer (a segment's age) and
        collects every ack: a task of a thousand partitions does that a few times a second,
        not at every poll. True when a partition reached its stop offset."""
        hold = self.throttle.wait()  # [limits]: this task's share is spent for now
        if hold > 0 or self._backed_up():  # or a slow or far target: wait for acks
            pause = min(hold, EMPTY_POLL_WAIT) if hold > 0 else BACKED_UP_WAIT
            time.sleep(pause)
            self.throttle.held += pause if hold > 0 else 0.0
            self._collect_acks(time.monotonic(), active if sweep else None)
            return False
        reader = self.reader
        assert reader is not None  # opened before the loop runs
        try:
            batch = reader.poll(EMPTY_POLL_WAIT)
            losses = reader.take_losses()
            moved = [p.key for p in active] if sweep else list(batch)
            positions = reader.positions(moved)
        except Exception as exc:
            raise SourceFailure(f"{type(exc).__name__}: {exc}") from exc
        self._lose(losses)
        if self.throttle.limited:
            self.throttle.spend(*_volume(batch))
        stopped = self._write(moved, batch, positions)
        self._collect_acks(time.monotonic(), active if sweep else None)
        return stopped

    def _write(
        self,
        moved: list[TP],
        batch: Mapping[TP, Sequence[Record] | Sequence[SourceBatch]],
        positions: Mapping[TP, int],
    ) -> bool:
        """Writes what a poll brought and moves the partitions to the reader's positions, in
        slices of WRITE_SLICE seconds, each waking the producer's I/O thread as it ends (a held
        block wakes it only at its end), with a report once LONG_STEP has gone by. A fetch of
        thousands of partitions brings up to 64 MB at once: at 10,000 partitions on 2 busy
        cores a task fell silent for over 8 s after its first answers came, and the driver took
        it for lost. True when a partition reached its stop offset."""
        reader, stopped, keys = self.reader, False, iter(moved)
        assert reader is not None
        still_here = self._still_here(after=max(self.task.report_interval, LONG_STEP))
        more = True
        while more:
            more, until = False, time.monotonic() + WRITE_SLICE
            with self.sides.writing():
                for key in keys:
                    part, records = self.parts[key], batch.get(key)
                    if part.reached_stop:
                        continue
                    if records:
                        if not self._may_write(still_here):  # held, stopped, or lease gone
                            return stopped
                        part.handle(records)
                        self._writing.add(key)
                    part.advance(positions[key])
                    if part.reached_stop:
                        reader.pause(key)
                        stopped = True
                    if records and time.monotonic() >= until:
                        more = True
                        break
            if more:
                still_here()
        return stopped

    def _may_write(self, still_here: Callable[[], None]) -> bool:
        """Whether records may be written now. A held round's task (relay.engine.channel) read
        its first records while the group's first join was still held: it waits here for its
        lease, reporting meanwhile, and writes nothing if the round is stopped instead."""
        while not self.channel.wait_writable(HOLD_WAIT):
            if self.channel.should_stop:  # the lease may have run out meanwhile
                return False
            still_here()
        return True

    def _lose(self, losses: list[Loss]) -> None:
        """Source records lost before they were read (relay.losses): reported with the
        partition's progress (the driver counts them and says so), or, when they halt the
        partition, raised before anything after them is written."""
        on_loss = getattr(self.task, "on_loss", "warn")
        for loss in losses:
            part = self.parts.get(loss.key)
            if part is None or part.reached_stop:
                continue
            if loss.halts(on_loss):
                why = '[source_pool].on_loss = "stop"' if on_loss == "stop" else "always halts"
                message = f"{loss.describe()} ({why})"
                raise SourceLost(message, loss.key, loss.position, loss.as_range)
            part.lost.append(loss.as_range)

    def _collect_acks(self, now: float, everyone: list[PartitionState] | None) -> None:
        """What is durable now, for the partitions being written (or `everyone`)."""
        parts = everyone if everyone is not None else [self.parts[k] for k in self._writing]
        for part in parts:
            part.collect_acks(now)
            if part.writer.flush_needed():
                self._writing.add(part.key)
            else:
                self._writing.discard(part.key)

    def _backed_up(self) -> bool:
        """More written and not yet durable than the sides allow: reading on would only queue
        records in the producer until they expire there."""
        limit = self.buffer_limit
        if limit is None:
            return False
        return sum(self.parts[k].writer.unacked_bytes for k in self._writing) >= limit

    def _settle(self) -> TaskError | None:
        """Wait (bounded) for everything written to be durable; the first record that is not
        bounds what counts as done in its partition."""
        if any(p.writer.flush_needed() for p in self.parts.values()):
            self._final_flush()
        error = None
        for part in self.parts.values():
            failure = part.settle()
            if failure is not None and error is None:
                if isinstance(failure, DeliveryFailure):
                    error = _error(failure)
                else:
                    error = _error(TargetFailure(str(failure), part.key), failure)
        return error

    def _final_flush(self) -> None:
        """Everything written sent and answered (bounded by the side's `flush_limit`), in
        slices with a report between them: at thousands of partitions the last flush takes
        seconds, and a task silent that long is taken for lost (seen at 10,000 partitions: the
        driver re-planned, then cancelled the round)."""
        deadline = time.monotonic() + self.sides.flush_limit
        still_here = self._still_here()
        while not self.sides.flush(max(0.0, min(EMPTY_POLL_WAIT, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return
            still_here()

    def _commit(self, final: bool = False) -> None:
        """Best effort: the destination (provenance headers, or the store), not this commit,
        is the truth. While running, commits do not wait (a dead source node must not stall
        the loop); the last one waits, briefly."""
        moved = {k: p.acked_next for k, p in self.parts.items() if p.acked_next > p.committed}
        if self.reader is None or not moved:
            return

        def done() -> None:
            for key, offset in moved.items():
                part = self.parts[key]
                part.committed = max(part.committed, offset)

        try:
            if not final:
                self.reader.commit_async(moved, done)
                return
            self.reader.commit(moved)
        except Exception as exc:  # noqa: BLE001
            log.warning("commit failed (%d partitions): %s", len(moved), exc)
            return
        done()

    def live_result(self) -> TaskResult:
        """A report while running, of the partitions whose progress changed since the last
        one: the driver takes cumulative totals, so a partition left out stands still (a task
        of a thousand partitions, most of them quiet, would send them all twice a second).
        Only those partitions' reports are built (`PartitionState.mark`)."""
        changed = []
        for key, part in self.parts.items():
            mark = part.mark(self.reader)
            if self._reported.get(key) != mark:
                self._reported[key] = mark
                changed.append(part.progress(self.reader))
        return self.result(None, 0.0, partitions=tuple(changed))

    def result(
        self,
        error: TaskError | None,
        elapsed: float,
        final: bool = False,
        partitions: tuple[PartitionProgress, ...] | None = None,
    ) -> TaskResult:
        """The task's report: every partition's progress unless `partitions` are given."""
        samples, self.latencies[:] = list(self.latencies), []
        if partitions is None:
            partitions = tuple(p.progress(self.reader, final) for p in self.parts.values())
        return TaskResult(
            round_id=self.task.round_id,
            task_id=self.task.task_id,
            attempt=self.attempt,
            partitions=partitions,
            error=error,
            elapsed=elapsed,
            worker_pid=os.getpid(),
            latencies=tuple(samples),
            trouble=tuple(self.reader.take_trouble()) if self.reader is not None else (),
            throttled=round(self.throttle.held, 3),
        )


def _news(result: TaskResult) -> bool:
    """Whether a live report says anything the last one did not: progress (it holds only the
    partitions that moved), latencies or fetch trouble."""
    return bool(result.partitions or result.latencies or result.trouble)


def _volume(batch: Mapping[TP, Sequence[Record] | Sequence[SourceBatch]]) -> tuple[int, int]:
    """Records and bytes one read brought: record batches (their headers' counts and sizes) or
    records (their keys and values)."""
    records = size = 0
    for items in batch.values():
        for item in items:
            if isinstance(item, SourceBatch):
                records += item.header.record_count
                size += len(item.data)
            else:
                records += 1
                size += len(item.key or b"") + len(item.value or b"")
    return records, size


def _error(exc: BaseException, cause: BaseException | None = None) -> TaskError:
    """What went wrong, for the driver: which side, whether a retry can help, where."""
    key = getattr(exc, "key", None)
    if isinstance(exc, Refused):  # the partition halts; its message names the record
        return TaskError("target", str(exc), False, key, exc.halt_at)
    if isinstance(exc, SourceLost):  # the partition halts; its message names the offsets
        return TaskError("source", str(exc), False, key, exc.halt_at, exc.lost)
    if isinstance(exc, DeliveryFailure):  # its message names the records already
        # After a hole the destination's tail is past records it lacks: only this process
        # knows where to resume (the partition is pinned), so the round is retried rather than
        # the relay stopped, whatever the cause (a restart would resume after the tail).
        retriable = exc.hole or is_retriable(exc.__cause__ or exc)
        return TaskError("target", str(exc), retriable, key)
    if isinstance(exc, SourceFailure):
        kind, cause = "source", cause or exc.__cause__ or exc
    elif isinstance(exc, TargetFailure):
        kind, cause = "target", cause or exc.__cause__ or exc
    elif isinstance(exc, FilterRuntimeError):
        return TaskError("filter", str(exc), False, key)
    else:
        kind, cause = "internal", exc
    message = f"{type(cause).__name__}: {cause}"
    retriable = kind in ("source", "target") and is_retriable(cause)
    return TaskError(kind, message, retriable, key)
