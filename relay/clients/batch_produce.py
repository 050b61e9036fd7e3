"""Hand batches built by `relay.batches` to kafka-python's producer, one destination partition
at a time, with idempotence, acks, retries and ordering left to kafka-python.

What kafka-python 3.0 does with a batch, read from its sources:
- `RecordAccumulator` keeps a deque of `ProducerBatch` per partition; `ProducerBatch` holds a
  `MemoryRecordsBuilder` (`batch.records`) and a `produce_future`.
- The sender's `drain_batches_for_one_node` pops the first batch of a partition and, unless it
  is a retry, calls `records.set_producer_state(producer id, epoch, next sequence, txn)`, moves
  the partition's sequence on by `records.next_offset()` (the record count), then
  `records.close()`, which builds the bytes (`DefaultRecordBatchBuilder.write_header` stamps the
  producer fields and computes the CRC). The produce request carries `records.buffer()`.
- A retry re-enqueues the same, closed batch: same bytes, same sequence, so the broker
  de-duplicates it; a batch whose producer id or epoch changed is failed, never re-stamped.
- On success `batch.complete(base_offset, log_append_time)` resolves `produce_future` with
  `(base_offset, log_append_time, record_errors)`.

So the seam is the builder: `PrebuiltRecords` stands in for `MemoryRecordsBuilder` holding a
finished batch. It takes no records (`append` returns None: a record `send()`s afterwards opens
a new batch), is never "full" (kafka-python sends a partition's batch at once when another is
queued behind it, and lets the last one wait up to `[target].linger`, as for records), accepts
the producer state until it is
closed, and on `close()` writes producer id, epoch and base sequence into the header and
recomputes the CRC (`relay.batches.stamp_producer`), exactly where kafka-python's builder does.
Everything else (sequence numbers, in-flight limits, retries, delivery timeout, acks=all,
metadata, TLS/SASL) stays kafka-python's. For that, a batch's offset deltas must run
0..count-1 (the broker checks last sequence = base sequence + lastOffsetDelta): `relay.batches`
guarantees it.

One case kafka-python cannot handle the same way: a broker refusing a batch as too large makes
the sender *split* it (`split_and_reenqueue`) into record batches it builds itself, dropping the
original future; the provenance header would then end only the second half. `BatchDelivery`
reports such a batch as failed (the round is retried and resumes from the destination), and
`relay.batches.rebuild` keeps destination batches below a broker's default limit (records up
to `[target].batch_size`, or up to 1,000,000 bytes for a source batch copied whole).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kafka import KafkaProducer, TopicPartition
from kafka.errors import IllegalStateError, RecordListTooLargeError
from kafka.producer.producer_batch import ProducerBatch
from kafka.record.memory_records import MemoryRecords

from relay import internals
from relay.batches import DestBatch, stamp_producer
from relay.clients.delivery import Delivery

if TYPE_CHECKING:  # kafka-python's own class (untyped: it says what an argument is)
    from kafka.producer.record_accumulator import RecordAccumulator


class PrebuiltRecords:
    """A finished batch where kafka-python expects a `MemoryRecordsBuilder` (see the module
    docstring for which of its methods the accumulator and the sender call)."""

    __slots__ = ("_buffer", "_count", "_raw_size", "_closed", "_state")

    def __init__(self, batch: DestBatch):
        self._buffer = batch.payload  # stamped in place on close (the built batch is ours)
        self._count = batch.count
        self._raw_size = max(1, batch.records_size)
        self._closed = False
        self._state: tuple[int, int, int, bool] = (-1, -1, -1, False)

    def append(self, *args: object, **kwargs: object) -> object | None:
        return None  # full: a record sent to this partition goes to a new batch

    def is_full(self) -> bool:
        return False  # the accumulator's linger applies to the partition's last batch

    def set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int, is_transactional: bool
    ) -> None:
        if self._closed:  # what kafka-python's builder does: re-stamping could duplicate
            raise IllegalStateError("producer state set on a closed (already sent) batch")
        self._state = (producer_id, producer_epoch, base_sequence, is_transactional)

    @property
    def producer_id(self) -> int:
        return self._state[0]

    @property
    def producer_epoch(self) -> int:
        return self._state[1]

    @property
    def base_sequence(self) -> int:
        return self._state[2]

    def close(self) -> None:
        if not self._closed:  # called again on retries and expiry: stamp once
            self._closed = True
            stamp_producer(self._buffer, *self._state)

    def next_offset(self) -> int:
        return self._count  # the record count: how far the partition's sequence moves

    def size_in_bytes(self) -> int:
        return len(self._buffer)

    def compression_rate(self) -> float:
        return len(self._buffer) / self._raw_size

    def buffer(self) -> bytearray:
        return self._buffer

    def records(self) -> MemoryRecords:
        return MemoryRecords(bytes(self._buffer))


class BatchDelivery(Delivery):
    """How one produced batch ended; once acknowledged, the offset the broker gave it."""

    __slots__ = ("_acc",)
    _batch: ProducerBatch  # Delivery's, never None here

    def __init__(self, producer_batch: ProducerBatch, acc: RecordAccumulator):
        super().__init__(producer_batch.produce_future, producer_batch)
        self._acc = acc

    def error(self) -> BaseException | None:
        found = super().error()
        if found is None and not self.done and self._split():
            too_large: BaseException = RecordListTooLargeError(
                "the broker refused the batch as too large"
            )
            return too_large
        return found

    def _split(self) -> bool:
        """Dropped by the accumulator without completing: split by the sender."""
        gone = not internals.still_incomplete(self._acc, self._batch)
        return gone and not self._future.is_done  # a completed batch is dropped after completing

    @property
    def base_offset(self) -> int | None:
        if not self.acked():
            return None
        return int(self._future.value[0])


def has_batch_internals(producer: KafkaProducer) -> bool:
    """What this module needs of kafka-python 3.0 beyond the record path's bulk appends, which
    `relay.clients.producer` checks first (accumulator, sender, not transactional): magic-2
    batches and the set of incomplete batches. Without them the relay moves records instead."""
    acc = internals.accumulator(producer)
    try:
        internals.still_incomplete(acc, None)
    except internals.Missing:
        return False
    return bool(acc.config.get("message_version") == 2)


def append_batches(
    producer: KafkaProducer,
    topic: str,
    partition: int,
    batches: Sequence[DestBatch],
    refused: Callable[[TopicPartition], None] = lambda _: None,
) -> list[BatchDelivery]:
    """Queue built batches, in order, behind whatever the partition already holds; one
    delivery per batch; the caller wakes the sender. The caller checked
    `has_batch_internals`. `refused(tp)`, asked under the partition's lock, raises to refuse
    the batches (see relay.clients.producer)."""
    if not batches:
        return []
    if partition not in internals.known_partitions(producer, topic, partition):
        raise ValueError(f"{topic} has no partition {partition}")
    acc = internals.accumulator(producer)
    tp = TopicPartition(topic, partition)
    now = time.monotonic()
    deliveries = []
    with internals.appending(acc), internals.partition_lock(acc, tp):
        if internals.accumulator_closed(acc):
            raise IllegalStateError("the producer is closed")
        refused(tp)
        dq = internals.partition_queue(acc, tp)
        for built in batches:
            producer_batch = ProducerBatch(tp, PrebuiltRecords(built), now=now)
            dq.append(producer_batch)
            internals.track(acc, producer_batch)
            deliveries.append(BatchDelivery(producer_batch, acc))
    return deliveries
