"""Retried batches of a partition reach the destination in sequence order, as Apache Kafka's
Java producer sends them, while several batches of a partition travel at once.

ktm lets up to `[target].max_in_flight` batches of one partition out at once
(`internals.several_batches_in_flight`). When the partition's leader moves (a controlled
shutdown, a rolling restart, the preferred leader election), the old leader answers those
batches NOT_LEADER_OR_FOLLOWER one after the other, and kafka-python 3.0 puts each retried batch
*first* in the partition's queue: the last one answered goes out first, the new leader finds a
gap in the producer's sequence numbers and answers OUT_OF_ORDER_SEQUENCE_NUMBER, which
kafka-python takes as final (measured on three Kafka 4.4 brokers under load, see
tests/integration/test_leader_moves.py: rounds failed, and the relay stopped, since that error
is not retriable). The Java producer does three things (RecordAccumulator.insertInSequenceOrder
and shouldStopDrainBatchesForPartition, TransactionManager.canRetry), and so does this module,
on kafka-python's I/O thread:

1. A retried batch goes back at its place by sequence number: behind the retried batches with
   lower sequences, before the batches never sent (which have none yet).
2. While a partition retries, it sends one batch at a time: it is muted (the sender neither
   drains it nor counts it ready, so it does not spin) as long as one of its batches is in
   flight, and each of its retried batches goes out once the one before it was answered.
3. OUT_OF_ORDER_SEQUENCE_NUMBER for a batch while an earlier batch of its partition is still
   unanswered, or waits to be retried, is retried as well: that earlier batch is the gap, and
   the retry goes behind it. It happens when a partition's new batches reach the new leader
   while older ones are still out to the old one. Not after a split: kafka-python hands split
   halves their sequence numbers anew, so a retry could meet a later batch's numbers.

When nothing is retried this costs a set lookup per answered batch and per drain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kafka.errors import OutOfOrderSequenceNumberError, RetriableError

from relay import internals

if TYPE_CHECKING:  # kafka-python's own classes (untyped: they say what each argument is)
    from kafka import KafkaProducer, TopicPartition
    from kafka.producer.producer_batch import ProducerBatch

SEQUENCES = 1 << 31  # a partition's sequence numbers wrap after 2**31 - 1 (as in Java)


class OutOfOrderBehindRetry(RetriableError, OutOfOrderSequenceNumberError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER while an earlier batch of the partition is unanswered or
    waits to be retried: retriable, behind that batch."""


def precedes(first: int, second: int) -> bool:
    """Sequence `first` comes before `second`, across the wrap: batches that can be in flight
    together are far less than 2**30 records apart."""
    return 0 < (second - first) % SEQUENCES < SEQUENCES // 2


def insert_in_sequence_order(queue: deque[ProducerBatch], batch: ProducerBatch) -> None:
    """Put a retried batch (it has a sequence) in `queue` behind the batches with lower
    sequences at its head (RecordAccumulator.insertInSequenceOrder of the Java client)."""
    ahead = []
    while queue and queue[0].has_sequence and precedes(queue[0].base_sequence, batch.base_sequence):
        ahead.append(queue.popleft())
    queue.appendleft(batch)
    queue.extendleft(reversed(ahead))


class RetryOrder:
    """Retries of one idempotent producer in sequence order; every method but `install` runs
    on its I/O thread, where kafka-python calls them."""

    def __init__(self, producer: KafkaProducer):
        self._producer = producer
        self._acc = internals.accumulator(producer)
        self._muted = internals.muted_partitions(self._acc)
        self._retrying: set[TopicPartition] = set()  # partitions sending one batch at a time
        self._split: set[TopicPartition] = (
            set()
        )  # partitions whose sequence numbers were handed anew

    def install(self) -> None:
        """Hook into the producer; raises internals.Missing (nothing installed) when
        kafka-python's internals are not the ones read."""
        internals.batches_in_flight(self._producer, None)  # Missing here, not on the I/O thread
        internals.on_answered(self._producer, self.answered)
        internals.on_drain(self._acc, self.drained)
        internals.on_batch_split(self._acc, lambda batch, _: self._split.add(batch.topic_partition))
        internals.on_batch_error(self._producer, self.explained)
        internals.on_reenqueue(self._acc, self.reenqueue)  # last: the only one that mutes

    def reenqueue(self, batch: ProducerBatch, now: float | None) -> None:
        batch.retry(now=now)  # attempts and backoff, as kafka-python's reenqueue does first
        tp = batch.topic_partition
        with internals.partition_lock(self._acc, tp):
            queue = internals.partition_queue(self._acc, tp)
            if batch.has_sequence:
                insert_in_sequence_order(queue, batch)
            else:
                queue.appendleft(batch)
        self._retrying.add(tp)
        self._muted.add(tp)

    def drained(self, batches_by_node: dict[int, list[ProducerBatch]]) -> None:
        """A retrying partition's batch went out: nothing more of it until it is answered."""
        if not self._retrying:
            return
        for batches in batches_by_node.values():
            for batch in batches:
                if batch.topic_partition in self._retrying:
                    self._muted.add(batch.topic_partition)

    def answered(self, batch: ProducerBatch) -> None:
        """The partition's last batch in flight was answered: its next one may go, and once
        no retried batch heads its queue, several at a time again."""
        tp = batch.topic_partition
        if tp not in self._retrying or internals.batches_in_flight(self._producer, tp):
            return
        self._muted.discard(tp)
        with internals.partition_lock(self._acc, tp):
            queue = internals.partition_queue(self._acc, tp)
            retried_first = bool(queue) and queue[0].in_retry()
        if not retried_first:
            self._retrying.discard(tp)

    def explained(self, batch: ProducerBatch, error: BaseException) -> BaseException:
        """The error kafka-python should decide `batch`'s fate by (see the module docstring)."""
        if type(error) is not OutOfOrderSequenceNumberError or not batch.has_sequence:
            return error
        if batch.topic_partition in self._split:
            return error
        if any(_earlier(other, batch) for other in self._unresolved(batch.topic_partition)):
            return OutOfOrderBehindRetry(*error.args)
        return error

    def _unresolved(self, tp: TopicPartition) -> Iterator[ProducerBatch]:
        """The partition's batches sent and not acknowledged yet: in flight, or queued again."""
        yield from internals.batches_in_flight(self._producer, tp)
        with internals.partition_lock(self._acc, tp):
            queued = list(internals.partition_queue(self._acc, tp))
        yield from (batch for batch in queued if batch.has_sequence)


def _earlier(other: ProducerBatch, batch: ProducerBatch) -> bool:
    return (
        other is not batch
        and other.has_sequence
        and other.producer_id == batch.producer_id
        and other.producer_epoch == batch.producer_epoch
        and precedes(other.base_sequence, batch.base_sequence)
    )
