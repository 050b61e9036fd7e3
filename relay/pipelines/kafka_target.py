"""The write side relay and restore share: a destination Kafka partition per source partition,
through the worker's cached producer; an offset is done once the destination acknowledged it.

A writer answers one question for the task loop: up to which source offset is everything
durable (`done_up_to`, a next offset): for Kafka, the destination's acks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from typing import NamedTuple

from relay.batches import DestBatch, Origin, SourceBatch, codecs, rebuild
from relay.batches.build import COPY_FRACTION, DEFAULT_BUDGET
from relay.batches.encode import encode_records
from relay.batches.records import Record
from relay.clients import worker_cache
from relay.clients.producer import REFUSED, TOO_LARGE, Delivery, PartitionFailed, Producer
from relay.config import TargetConfig
from relay.engine.executor.failures import (
    DeliveryFailure,
    Refused,
    TargetFailure,
    opening,
)
from relay.engine.executor.sides import moved_forward
from relay.provenance.copies import sourced_records
from relay.provenance.header import PROVENANCE_HEADER, provenance_prefix
from relay.provenance.resume import destination_next_offsets
from relay.refusals import Rules, TopicRules, first_refused, rules_for
from relay.spec import PartitionRoute, PartitionWork

MAX_LATENCY_SAMPLES = 200  # per report: enough for a histogram, small to send
# A partition with this many runs unacknowledged waits on the destination, not on the CPU (a
# far target: each round trip carries at most five batches per partition, idempotence's
# limit): its next batches are merged up to WIDE_BATCH bytes, re-framing each record (~1.5 µs)
# to carry about four times as much per round trip (measured to a target 240 ms away: 120 kB
# batches 57k records/s, 1 MB batches 146k/s).
DEEP_QUEUE = 10
WIDE_BATCH = 960 * 1024


class _Sent(NamedTuple):
    """A run of records (or a built batch) handed to the producer, not acknowledged yet."""

    first: int  # first source offset
    records: int
    delivery: Delivery
    # (offset, size) of the run's largest record: named if the destination refuses it as too
    # large (None for a built batch: its records are not looked at)
    largest: tuple[int, int] | None
    written_at: float
    size: int  # bytes of keys, values and headers
    # what was sent: looked into only when the destination refuses it for good, to name the
    # first record it refuses (the batch is held by the producer until answered anyway)
    content: DestBatch | Sequence[Record]


class KafkaTarget:
    """The writing side shared by relay and restore: one cached producer per target."""

    def __init__(
        self, target: TargetConfig, partitions: tuple[PartitionWork, ...], rules: Rules = ()
    ):
        self.target, self.partitions = target, partitions
        self.rules = rules  # what the destination topics refuse (relay.refusals)

    def rules_of(self, work: PartitionWork) -> TopicRules | None:
        return rules_for(self.rules, work.route.target_topic)

    def producer(self) -> Producer:
        with opening(TargetFailure):
            return worker_cache.producer(self.target)

    def flush(self, timeout: float | None) -> bool:
        producer = worker_cache.cached_producer(self.target)
        if producer is None:
            return True
        try:
            return producer.flush(timeout=self.flush_limit if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - the futures say which records failed
            return True

    @property
    def flush_limit(self) -> float:
        """Seconds a final flush may take: by then kafka-python has failed what it could not
        deliver."""
        return self.target.request_timeout * 2 + self.target.linger

    def writing(self) -> AbstractContextManager[None]:
        """The producer's I/O thread is woken once per step, not once per partition."""
        return self.producer().held()

    def abandon(self, waiting: Callable[[], object] | None = None) -> None:
        worker_cache.abandon_producer(self.target, waiting)

    def buffer_limit(self) -> int | None:
        return self.target.buffer_memory

    def warm(self) -> None:
        self.producer().warm({w.route.target_topic for w in self.partitions})

    def evict(self, kind: str, waiting: Callable[[], object] | None = None) -> None:
        """Drop the producer after a failure so the next round starts from a clean connection
        state. It is abandoned, not flushed: batches queued after a failed one would land
        behind it, and the destination's tail would then claim records it lacks (seen: a
        target frozen for 5 s, its queued batches flushed on close, 4,400 records lost). What
        is already on the wire is waited for (Producer.abandon): unanswered, it could land
        after the driver read the tail again, a duplicate."""
        if kind in ("target", "internal", "channel"):
            worker_cache.abandon_producer(self.target, waiting)

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
        return moved_forward(self.partitions, found)


class KafkaWriter:
    """Records to one destination partition, each stamped with its provenance; done once acked.

    A failed delivery ends the task at once (the loop asks `failure()` every turn), instead of
    leaving the partition stalled behind it until the round ends. If a later delivery of the
    same partition was acknowledged, the destination has a hole: its tail shows later source
    offsets than records it lacks (kafka-python expires a batch it never sent without using
    its sequence number, so the broker accepts the next one). The task then reports the hole
    and the driver resumes at the first unacknowledged record, not after the tail: nothing is
    lost, and the records after the hole may arrive twice."""

    def __init__(
        self,
        producer: Producer,
        route: PartitionRoute,
        origin: Origin,
        latencies: list[float],
        shape: tuple[int, int] = (codecs.NONE, DEFAULT_BUDGET),
        widest: int = WIDE_BATCH,  # the destination's largest batch (max.message.bytes)
        rules: TopicRules | None = None,  # what the destination topic refuses for good
    ):
        self.producer, self.route, self.origin = producer, route, origin
        self.rules = rules
        self.prefix = provenance_prefix(origin.cluster, origin.topic, origin.partition)
        self.codec, self.budget = shape  # of the destination batches the batch path builds
        self.wide = max(self.budget, min(WIDE_BATCH, widest))
        self.pending: deque[_Sent] = deque()  # in order: acks come in order
        self.acked = 0  # records acknowledged
        self.written_bytes = 0
        self.unacked_bytes = 0  # of the pending runs
        self.segments = 0
        self._latencies = latencies  # shared by the task's partitions, emptied at each report

    def write(self, records: Sequence[Record]) -> None:
        """Records one by one (restore; the relay only when the batch path is unavailable):
        framed into destination batches here, the last record of each carrying the batch's
        provenance, when the producer takes built batches; else handed to kafka-python's
        producer, each record with its own provenance header."""
        if not records:
            return
        if self.producer.takes_built:
            self._queue(encode_records(records, self.origin, self.codec, self.budget))
            return
        items = []
        sizes = []
        for r in records:
            headers = list(r.headers) if r.headers else []
            headers.append((PROVENANCE_HEADER, self.prefix + str(r.offset).encode()))
            items.append((r.timestamp, r.key, r.value, headers))
            sizes.append(len(r.value or b"") + len(r.key or b""))
        route = self.route
        try:
            segments = self.producer.send_batch(route.target_topic, route.target_partition, items)
        except Exception as exc:
            raise self._refused(exc) from exc
        self.written_bytes += sum(sizes)
        index, now = 0, time.monotonic()
        for count, future in segments:
            big = max(range(index, index + count), key=sizes.__getitem__)
            largest = (records[big].offset, sizes[big])
            size = sum(sizes[index : index + count])
            run = records[index : index + count]
            self.pending.append(_Sent(run[0].offset, count, future, largest, now, size, run))
            self.unacked_bytes += size
            index += count
        self._sample_latency(segments[-1][1], records[-1].timestamp)

    def write_batches(
        self,
        batches: list[SourceBatch],
        start: int,
        stop: int | None,
        drop: AbstractSet[int] = frozenset(),
    ) -> tuple[int, int]:
        """The batch path: source batches rebuilt into destination batches (the records at or
        after `start` and before `stop`, less `drop`), each queued whole; returns how many
        records were queued and the next offset to fetch."""
        budget, copy_fraction = self.budget, COPY_FRACTION
        if len(self.pending) >= DEEP_QUEUE:  # the destination holds the relay back
            budget, copy_fraction = self.wide, 1
        rebuilt = rebuild(
            batches,
            start,
            self.origin,
            self.codec,
            budget,
            stop=stop,
            drop=drop,
            copy_fraction=copy_fraction,
        )
        if rebuilt.batches:
            self._queue(rebuilt.batches)
        return sum(built.count for built in rebuilt.batches), rebuilt.next_offset

    def _queue(self, batches: list[DestBatch]) -> None:
        """Built batches to the producer, each whole; each one's delivery is awaited."""
        route = self.route
        try:
            deliveries = self.producer.send_built(
                route.target_topic, route.target_partition, batches
            )
        except Exception as exc:
            raise self._refused(exc) from exc
        now = time.monotonic()
        for built, delivery in zip(batches, deliveries, strict=True):
            # a batch refused as too large names the batch: its records are not looked at
            sent = _Sent(
                built.first_offset, built.count, delivery, None, now, built.records_size, built
            )
            self.pending.append(sent)
            self.written_bytes += built.records_size
            self.unacked_bytes += built.records_size
        self._sample_latency(deliveries[-1], batches[-1].max_timestamp)

    def _refused(self, exc: Exception) -> TargetFailure:
        """The producer took no more records: after a failed batch of this partition, that
        batch's failure names what went wrong (and which records)."""
        if isinstance(exc, PartitionFailed):
            failure = self.failure()
            if failure is not None:
                return failure
        return TargetFailure(str(exc), self.route.key)

    def _sample_latency(self, delivery: Delivery, timestamp_ms: int) -> None:
        samples = self._latencies
        if len(samples) < MAX_LATENCY_SAMPLES:
            # Appended from the producer's I/O thread; list.append is atomic.
            delivery.on_ack(lambda: samples.append(time.time() - timestamp_ms / 1000))

    def done_up_to(self, processed_to: int) -> int:
        """Acks come in order: the first batch not acknowledged bounds what is done."""
        while self.pending and self.pending[0].delivery.acked():
            done = self.pending.popleft()
            self.acked += done.records
            self.unacked_bytes -= done.size
        return self.pending[0].first if self.pending else processed_to

    def unacknowledged(self) -> tuple[tuple[int, int, int], ...]:
        """(first source offset, records, what became of them: relay.clients.delivery's ACKED,
        NOT_WRITTEN or UNKNOWN) of each run written and not counted as acknowledged yet. When
        the task ends on a failure the driver reads the destination's tail: it counts the runs
        found there (a batch lands whole or not at all), and never resumes past a run the
        broker refused or never got (a hole, whatever the task itself saw of it)."""
        return tuple((sent.first, sent.records, sent.delivery.written()) for sent in self.pending)

    def failure(self) -> DeliveryFailure | None:
        """Why the first unacknowledged run failed (None while it may still be acknowledged),
        naming the source records it held and whether a hole followed it."""
        if not self.pending:
            return None
        sent = self.pending[0]
        delivery, written_at = sent.delivery, sent.written_at
        error = delivery.error()
        waited = time.monotonic() - written_at
        if error is None and not delivery.done and waited > self.producer.ack_deadline:
            # kafka-python expires a batch after its delivery timeout; a producer that stays
            # stuck past twice that (Tansu refuses the epoch bump kafka-python tries after an
            # expired batch) must not hang the partition: it is replaced after this failure.
            error = TimeoutError(f"no acknowledgement within {waited:.0f}s")
        if error is None:
            return None
        hole = any(entry.delivery.acked() for entry in self.pending)
        named = delivery.refused(sent.records)
        if named is not None or isinstance(error, REFUSED):
            return self._refused_record(sent, named or (None, error), hole)
        what = self._not_taken(sent, error)
        if hole:
            what += "; later records landed, so they will be relayed again after these"
        failure = DeliveryFailure(f"{what}: {type(error).__name__}: {error}", self.route.key, hole)
        failure.__cause__ = error
        return failure

    def _not_taken(self, sent: _Sent, error: BaseException) -> str:
        """What of `sent` the destination did not take, and why if it says."""
        route, first, count, largest = self.route, sent.first, sent.records, sent.largest
        where = f"destination {route.target_topic}[{route.target_partition}]"
        source = f"{route.topic}[{route.partition}]"
        if isinstance(error, TOO_LARGE) and largest is not None:
            return (
                f"record {source} offset {largest[0]} ({largest[1]} bytes of key and value) is "
                f"too large for {where}"
            )
        if isinstance(error, TOO_LARGE):
            return (
                f"{where} refused {source} offsets from {first} ({count} records in one batch) "
                "as too large: lower [target].batch_size, or a record is larger than the "
                "destination allows"
            )
        return f"{where} did not take {source} offsets {first}-{first + count - 1}"

    def _refused_record(
        self, sent: _Sent, named: tuple[int | None, BaseException], hole: bool
    ) -> Refused:
        """The destination refused a batch for a record it will always refuse: the partition
        halts at the first such record (`named` by the broker: its index in the batch and its
        error; else found by the destination topic's rules), or at the batch's first record
        when neither says which."""
        index, error = named
        content = sent.content
        if isinstance(content, DestBatch):
            records: Sequence[Record] = sourced_records(content.payload)
        else:  # records appended to a producer batch that may hold earlier ones: not indexed
            records, index = content, None
        found = first_refused(records, self.rules, int(time.time() * 1000), index)
        route = self.route
        source = f"{route.topic}[{route.partition}]"
        where = f"destination {route.target_topic}[{route.target_partition}]"
        if found is None:
            limits = self.rules.limits_text() if self.rules else "not described"
            offset = sent.first
            last = content.last_offset if isinstance(content, DestBatch) else content[-1].offset
            why = f"the broker named no record of offsets {offset}-{last} (its limits: {limits})"
        else:
            offset, why = found.offset, found.reason or "the broker refused it"
        what = f"{where} refuses record {source} offset {offset}: {why}"
        if hole:
            what += "; later records landed, so they will be relayed again after these"
        said = (
            str(error) if type(error).__name__ in str(error) else f"{type(error).__name__}: {error}"
        )
        failure = Refused(f"{what}: {said}", route.key, offset, hole)
        failure.__cause__ = error
        return failure

    def tick(self, processed_to: int, now: float) -> None:
        """Nothing to do: the producer sends on its own."""

    def flush_needed(self) -> bool:
        return bool(self.pending)

    def settle(self, processed_to: int) -> BaseException | None:
        """After the producer's final flush: what is still not acknowledged is an error."""
        self.done_up_to(processed_to)
        if not self.pending:
            return None
        return self.failure() or TimeoutError(
            f"no acknowledgement for source offset {self.pending[0].first}"
        )
