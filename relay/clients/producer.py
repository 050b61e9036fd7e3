"""Executor-side producing to the destination (kafka-python).

One idempotent producer per target per worker process, reused across rounds. acks=all plus
idempotence means a record is acknowledged once, in order, on every in-sync replica; only then
does its source offset count as done.

Batches built by the batch path go through the same accumulator and sender (`send_built`, see
relay.clients.batch_produce). On the record path, records are appended a whole fetch at a time
(`send_batch`). `KafkaProducer.send()` costs a
future, a lock round trip and several checks per record, most of the relay's CPU at 100-byte
records. The bulk path appends straight into the accumulator's open batch for the partition,
under the accumulator's own lock, and returns one future per producer batch. Sequence numbers,
retries, idempotence and acks stay kafka-python's: the sender drains these batches exactly like
the ones `send()` builds. It uses accumulator internals of kafka-python 3.0 (pinned in
setup.cfg); if they are missing, `send_batch` falls back to one `send()` per record.

What comes back is a `Delivery` (relay.clients.delivery) per run of records or built batch,
never a kafka-python future.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kafka import KafkaProducer, TopicPartition
from kafka.errors import (
    InvalidRecordError,
    InvalidTimestampError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from kafka.producer.producer_batch import ProducerBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from relay import internals
from relay.batches import DestBatch
from relay.clients.batch_produce import BatchDelivery, append_batches, has_batch_internals
from relay.clients.delivery import Delivery, error_of
from relay.clients.retry_order import RetryOrder
from relay.clients.settings import (
    NO_CLIENT_METRICS,
    ClientSettings,
    client_settings,
    never_create_topics,
)
from relay.config import TargetConfig

if TYPE_CHECKING:  # kafka-python's own classes (untyped: they say what each argument is)
    from kafka.producer.future import FutureProduceResult, FutureRecordMetadata
    from kafka.producer.record_accumulator import RecordAccumulator

log = logging.getLogger(__name__)


# A record with neither key nor value is legal in Kafka, but send() refuses value=None with
# key=None; the fallback path passes this stand-in, which the serializer turns back into None.
NULL_VALUE = object()

MAX_REQUEST_BYTES = 16 * 1024 * 1024  # a broker takes up to socket.request.max.bytes (100 MB)

# What a broker answers for a record (or batch) larger than the topic's max.message.bytes
TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
# What a broker answers for a batch holding a record the destination topic refuses for good (a
# timestamp out of its limits, a null key for a compacted topic): a retry is refused the same way
REFUSED = (InvalidTimestampError, InvalidRecordError)

# (timestamp ms, key, value, headers) of one record to produce
Item = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


# (how many of the given records, the delivery of the run holding them)
Segment = tuple[int, Delivery]

# Destination partitions a batch failed on for good, and its error
Failed = dict[TopicPartition, BaseException]


def producer_settings(target: TargetConfig) -> ClientSettings:
    timeout_ms = int(target.request_timeout * 1000)
    return {
        **client_settings(target.cluster, target.request_timeout),
        **NO_CLIENT_METRICS,
        # The config keeps acks as "all", "1" or "0"; kafka-python wants "all" or an int.
        "acks": "all" if target.acks == "all" else int(target.acks),
        "enable_idempotence": _idempotent(target),
        "compression_type": None if target.compression == "none" else target.compression,
        "linger_ms": int(target.linger * 1000),
        "batch_size": target.batch_size,
        "request_timeout_ms": timeout_ms,
        "delivery_timeout_ms": delivery_timeout_ms(target),
        "max_block_ms": timeout_ms,
        "value_serializer": _null_aware,
        "max_in_flight_requests_per_connection": target.max_in_flight,
        # A request carries at most one batch per partition (kafka-python's drain, like Java's):
        # at 1 MB (its default) four partitions of 256 KiB batches fill it, and a long link
        # then carries 5 MB per round trip at most.
        "max_request_size": MAX_REQUEST_BYTES,
    }


def delivery_timeout_ms(target: TargetConfig) -> int:
    """A record not acknowledged within this time fails (and the round is retried), instead of
    the producer retrying forever behind the relay's back."""
    return 2 * int(target.request_timeout * 1000) + int(target.linger * 1000)


def _idempotent(target: TargetConfig) -> bool:
    return target.acks == "all"  # kafka-python requires acks=all for idempotence


def _null_aware(value: bytes | object | None) -> bytes | object | None:
    return None if value is NULL_VALUE else value


ANSWERS_SLICE = 0.5  # seconds between `abandon`'s calls of `waiting`


class Producer:
    def __init__(self, target: TargetConfig, bulk: bool = True):
        settings = producer_settings(target)
        self._producer = never_create_topics(KafkaProducer(**settings))
        self._request_timeout = target.request_timeout
        # How long a run of records may stay unanswered before it counts as failed: kafka-python
        # expires it after its delivery timeout; twice that, plus a margin, means it is stuck.
        self.ack_deadline = 2 * delivery_timeout_ms(target) / 1000 + 5
        self._closed = False
        # Destination partitions a batch failed on: nothing more may be appended to them
        self._failed: Failed = {}
        self._bulk = bulk and _takes_bulk(self._producer, self._failed)
        self._held = 0  # depth of `held()`: appends inside wake the I/O thread once, at its end
        self._unwoken = False
        # built batches (the batch path) go through the same accumulator and sender; checked
        # only once the bulk internals are known to be there
        self.takes_built = self._bulk and has_batch_internals(self._producer)
        if target.max_in_flight > 1:
            _several_in_flight(self._producer, _idempotent(target))

    def warm(self, topics: Iterable[str]) -> None:
        """The destination topics' metadata before the first send, in one request."""
        internals.know_topics(self._producer, topics)

    def send_batch(self, topic: str, partition: int, items: Sequence[Item]) -> list[Segment]:
        """Append records, in order, to one partition; returns segments covering them in order."""
        if not items:
            return []
        # a partition added while running: in the metadata before the first send to it (without
        # the internal, kafka-python refuses it until its next refresh, up to 5 minutes)
        with contextlib.suppress(internals.Missing):
            internals.known_partitions(self._producer, topic, partition)
        if not self._bulk:
            if TopicPartition(topic, partition) in self._failed:
                raise PartitionFailed(topic, partition, self._failed)
            return [(1, Delivery(self._send_one(topic, partition, item), None)) for item in items]
        tp = TopicPartition(topic, partition)
        segments = _append_bulk(internals.accumulator(self._producer), tp, items, self._failed)
        self._wake()
        return segments

    def send_built(
        self, topic: str, partition: int, batches: Sequence[DestBatch]
    ) -> list[BatchDelivery]:
        """Queue batches built by relay.batches, in order; one delivery per batch. Sequence
        numbers, retries and acks stay kafka-python's (relay.clients.batch_produce)."""
        if not self.takes_built:
            raise RuntimeError("kafka-python internals changed: cannot send built batches")

        def refused(tp: TopicPartition) -> None:
            if tp in self._failed:
                raise PartitionFailed(tp.topic, tp.partition, self._failed)

        deliveries = append_batches(self._producer, topic, partition, batches, refused)
        self._wake()
        return deliveries

    @contextmanager
    def held(self) -> Iterator[None]:
        """Appends inside wake the I/O thread once, when the block ends. A wakeup per partition
        cost a task of 1,000 partitions more than its re-framing: each is a write to a socket
        (the GIL let go, and taken back only after the sender's switch interval) and a pass of
        the sender over every partition's queue."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._unwoken:
                self._unwoken = False
                internals.wake_sender(self._producer)

    def _wake(self) -> None:
        if self._held:
            self._unwoken = True
        else:
            internals.wake_sender(self._producer)

    def _send_one(self, topic: str, partition: int, item: Item) -> FutureRecordMetadata:
        timestamp, key, value, headers = item
        return self._producer.send(
            topic,
            value=NULL_VALUE if value is None and key is None else value,
            key=key,
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp,
        )

    def flush(self, timeout: float) -> bool:
        """True once every record sent was answered (acknowledged or failed: the deliveries say
        which), False if some are still out after `timeout` seconds."""
        try:
            self._producer.flush(timeout=timeout)
        except KafkaTimeoutError:
            return False
        return True

    def close(self, timeout: float = 5.0) -> None:
        if not self._closed:
            self._closed = True
            self._producer.close(timeout=timeout)

    def abandon(self, waiting: Callable[[], object] | None = None) -> None:
        """Close without sending what is not sent yet (the task lost its right to write, or a
        batch failed): `close()` would flush first. Returns once the requests already sent were
        answered (kafka-python fails one unanswered after its request timeout) and the I/O
        thread ended, having failed every delivery it did not complete: what counts as
        acknowledged no longer changes. `waiting` is called every ANSWERS_SLICE meanwhile (the
        task reports: a busy broker may take seconds)."""
        if self._closed:
            return
        self._closed = True
        internals.stop_sending(self._producer, KafkaError("not sent: the task stopped writing"))
        deadline = time.monotonic() + self._request_timeout + 1.0
        while not internals.sending_ended(self._producer, ANSWERS_SLICE):
            if time.monotonic() >= deadline:
                internals.drop_in_flight(self._producer)
                return
            if waiting is not None:
                waiting()


def _takes_bulk(producer: KafkaProducer, failed: Failed) -> bool:
    """Install the hooks the bulk paths need; False (the record path, one `send()` per record)
    when kafka-python's internals are not the ones read (a warning says which)."""
    try:
        if internals.is_transactional(producer):
            # Idempotence is fine (sequences are set when the sender drains a batch);
            # transactions, which ktm does not use, would need partitions registered first.
            return False
        acc = internals.accumulator(producer)
        internals.on_batch_split(acc, _complete_when_halves_complete)
        internals.on_batch_failure(producer, functools.partial(_stop_partition, acc, failed))
        internals.forget_drained_queues(acc)  # safe here: no send() on a bulk producer
    except internals.Missing as exc:
        log.warning("%s: producing one record at a time", exc)
        return False
    return True


def _several_in_flight(producer: KafkaProducer, idempotent: bool) -> None:
    """Up to max_in_flight batches of a partition at once, their retries in sequence order
    (relay.clients.retry_order); one at a time, kafka-python's way, when either cannot be
    installed: several at once with retries out of order would fail rounds whenever a
    destination leader moves."""
    try:
        if idempotent:
            RetryOrder(producer).install()
        internals.several_batches_in_flight(producer)
    except internals.Missing as exc:
        log.warning("%s: one produce request per partition at a time", exc)


def _append_bulk(
    acc: RecordAccumulator, tp: TopicPartition, items: Sequence[Item], failed: Failed
) -> list[Segment]:
    """What RecordAccumulator.append does, for many records under one lock acquisition."""
    now = time.monotonic()
    segments: list[Segment] = []
    with internals.appending(acc), internals.partition_lock(acc, tp):
        if tp in failed:  # under the lock the failure hook takes: no append slips past it
            raise PartitionFailed(tp.topic, tp.partition, failed)
        dq = internals.partition_queue(acc, tp)
        batch: ProducerBatch | None = dq[-1] if dq else None
        count = 0
        for timestamp, key, value, headers in items:
            meta = batch.records.append(timestamp, key, value, headers) if batch else None
            if batch is None or meta is None:  # no open batch, or it is full: the next one
                if batch is not None and count:
                    segments.append((count, Delivery(batch.produce_future, batch)))
                batch, count = _new_batch(acc, tp, now), 0
                dq.append(batch)
                internals.track(acc, batch)
                meta = batch.records.append(timestamp, key, value, headers)
                if meta is None:
                    raise ValueError("a record does not fit an empty producer batch")
            if meta.size > batch.max_record_size:
                batch.max_record_size = meta.size
            count += 1
        assert batch is not None
        batch.last_append = now
        segments.append((count, Delivery(batch.produce_future, batch)))
    return segments


class PartitionFailed(Exception):
    """A batch to this destination partition failed: this producer takes no more records for
    it (they would land behind the failed ones). The task ends; the next round uses a new
    producer."""

    retriable = True

    def __init__(self, topic: str, partition: int, failed: Failed) -> None:
        # with its error: a task that meets this before the failed delivery still says why
        error = failed.get(TopicPartition(topic, partition))
        super().__init__(f"an earlier batch to {topic}[{partition}] failed ({error})")


def _stop_partition(
    acc: RecordAccumulator, failed: Failed, batch: ProducerBatch, future: FutureProduceResult
) -> None:
    """When a batch fails for good, fail the partition's batches still queued behind it and
    refuse new ones. kafka-python would send them: a batch that expired before it was sent used
    no sequence number, and after an epoch bump sequences start over, so the broker takes the
    later batches and the destination gets records after a hole. Its tail would then claim
    records it lacks, and a resume after the tail would lose them. Batches already sent keep
    their place in the sequence: the broker refuses one that follows a missing one. All this
    runs on the producer's I/O thread, where kafka-python decides a batch's fate."""
    error = error_of(future) if future.is_done else None
    if error is None:
        return
    tp = batch.topic_partition
    with internals.partition_lock(acc, tp):
        failed.setdefault(tp, error)
        queue = internals.partition_queue(acc, tp)
        queued = list(queue)
        queue.clear()
    for queued_batch in queued:
        queued_batch.records.close()
        queued_batch.abort(error)
        acc.deallocate(queued_batch)


def _complete_when_halves_complete(whole: ProducerBatch, halves: list[ProducerBatch]) -> None:
    """When a broker refuses a batch as too large, kafka-python splits it in two, re-enqueues
    the halves and moves the per-record futures of `send()` onto them; the batch's own future,
    which the bulk path's Delivery holds, never completes, and its partition would hang. Here
    that future completes when the halves have: acknowledged if both were (at the first half's
    offset), failed with the first error otherwise. Halves split again chain the same way."""
    parts = [half.produce_future for half in halves]
    future = whole.produce_future
    outcomes: list[None] = []

    def one_done(_: object) -> None:
        outcomes.append(None)
        if len(outcomes) < len(parts) or future.is_done:
            return
        errors = [error for error in map(error_of, parts) if error is not None]
        if errors:
            future.failure(errors[0])
        else:
            future.success(parts[0].value)

    for part in parts:
        part.add_both(one_done)


def _new_batch(acc: RecordAccumulator, tp: TopicPartition, now: float) -> ProducerBatch:
    config = acc.config
    records = MemoryRecordsBuilder(
        config["message_version"], config["compression_attrs"], config["batch_size"]
    )
    return ProducerBatch(tp, records, now=now)
