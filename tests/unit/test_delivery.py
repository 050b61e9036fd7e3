"""What a run of records became, read from kafka-python's futures (relay.clients.delivery)."""

from __future__ import annotations

import time

from kafka import TopicPartition
from kafka.errors import (
    InvalidTimestampError,
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    OutOfOrderSequenceNumberError,
    RequestTimedOutError,
)
from kafka.future import Future
from kafka.producer.producer_batch import ProducerBatch
from kafka.record.memory_records import MemoryRecordsBuilder

from relay.clients.delivery import Delivery
from relay.spec import ACKED, NOT_WRITTEN, UNKNOWN


def record_future(error: BaseException | None = None, done: bool = True) -> Future:
    """One record's future (the record path): a plain future."""
    future = Future()
    if done:
        future.failure(error) if error is not None else future.success(object())
    return future


def test_a_refused_run_is_not_written_and_an_unanswered_one_may_have_landed() -> None:
    def written(error: BaseException | None = None, done: bool = True) -> int:
        return Delivery(record_future(error, done), None).written()

    assert written() == ACKED
    assert written(done=False) == UNKNOWN
    assert written(OutOfOrderSequenceNumberError()) == NOT_WRITTEN  # the broker refused it
    assert written(KafkaTimeoutError()) == UNKNOWN  # expired without an answer
    assert written(RequestTimedOutError()) == UNKNOWN  # the replicas were waited for in vain
    assert written(NotEnoughReplicasAfterAppendError()) == UNKNOWN  # in the leader's log


def producer_batch(drained: bool) -> ProducerBatch:
    records = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1024)
    batch = ProducerBatch(TopicPartition("t", 0), records)
    if drained:
        batch.drained = time.monotonic()  # what the accumulator's drain sets: it was sent
    return batch


def test_a_batch_the_producer_gave_up_in_flight_may_have_landed() -> None:
    """kafka-python 3.0.12 puts an idempotent producer in a fatal state when the broker refuses
    one batch for good, and aborts every batch in flight with that refusal (a broker error): a
    batch to another partition, in flight then, may be in the log all the same."""
    refusal = InvalidTimestampError("the other partition's record")

    in_flight = producer_batch(drained=True)
    in_flight.abort(refusal)
    assert Delivery(in_flight.produce_future, in_flight).written() == UNKNOWN

    queued = producer_batch(drained=False)  # aborted before the sender took it: never sent
    queued.abort(refusal)
    assert Delivery(queued.produce_future, queued).written() == NOT_WRITTEN

    answered = producer_batch(drained=True)  # the broker's own answer for this batch
    answered.complete_exceptionally(refusal, lambda _: refusal)
    assert Delivery(answered.produce_future, answered).written() == NOT_WRITTEN

    expired = producer_batch(drained=True)  # sent, then timed out without an answer
    expired.complete_exceptionally(KafkaTimeoutError(), lambda _: KafkaTimeoutError())
    assert Delivery(expired.produce_future, expired).written() == UNKNOWN
