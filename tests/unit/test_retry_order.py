"""Retried batches in sequence order (relay/clients/retry_order.py), on kafka-python's own
RecordAccumulator, Sender, TransactionManager and ProducerBatch objects with no broker behind
them: the test plays the producer's I/O thread, draining batches as the sender does and
answering them as a broker would."""

from __future__ import annotations

import heapq
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import CorruptRecordError, OutOfOrderSequenceNumberError
from kafka.net.compat import KafkaNetClient
from kafka.producer.producer_batch import ProducerBatch
from kafka.producer.record_accumulator import RecordAccumulator
from kafka.producer.sender import Sender
from kafka.producer.transaction_manager import TransactionManager
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from relay import internals
from relay.clients.delivery import error_of
from relay.clients.producer import PartitionFailed, _several_in_flight, _takes_bulk
from relay.clients.retry_order import SEQUENCES, insert_in_sequence_order, precedes

TP = TopicPartition("dst", 0)
NODE = 1
NOT_LEADER, OUT_OF_ORDER, CORRUPT = 6, 45, 2  # error codes a broker answers
Answer = ProduceResponse.TopicProduceResponse.PartitionProduceResponse


class Line:
    """One idempotent producer's accumulator and sender (kafka-python's), hooked as ktm's
    Producer hooks them, with no broker and no I/O thread."""

    def __init__(self, ordered: bool = True):
        self.client = KafkaNetClient(bootstrap_servers=["127.0.0.1:9"])  # never connects
        self.txn = TransactionManager(api_version=(4, 0))
        self.txn.init_producer_id()  # answered as a broker does: producer id 7, epoch 0
        handler = self.txn.next_request_handler(False)
        answer = InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=7,
                                        producer_epoch=0)  # fmt: skip
        handler.handle_response(answer)
        self.acc = RecordAccumulator(transaction_manager=self.txn)
        self.sender = Sender(self.client, self.client.cluster, self.acc, acks=-1,
                             transaction_manager=self.txn,
                             guarantee_message_order=True)  # fmt: skip
        self.producer: Any = SimpleNamespace(_accumulator=self.acc, _sender=self.sender)
        self.failed: dict[TopicPartition, BaseException] = {}
        assert _takes_bulk(self.producer, self.failed)
        if ordered:
            _several_in_flight(self.producer, idempotent=True)
        else:
            internals.several_batches_in_flight(self.producer)
        self.offset = 0

    def close(self) -> None:
        self.client.close()

    def queue(self, count: int, records: int = 2) -> list[ProducerBatch]:
        """Batches appended behind what the partition holds."""
        batches = []
        for _ in range(count):
            builder = MemoryRecordsBuilder(2, 0, 16384)
            for n in range(records):
                builder.append(0, b"k", b"v%d" % n, [])
            batch = ProducerBatch(TP, builder)
            with internals.partition_lock(self.acc, TP):
                internals.partition_queue(self.acc, TP).append(batch)
            internals.track(self.acc, batch)
            batches.append(batch)
        return batches

    def send(self) -> list[ProducerBatch]:
        """One drain, as the sender's loop does it (a retry's backoff is over), and what it
        took put in flight."""
        cluster = SimpleNamespace(partitions_for_broker=lambda node: {TP})
        drained = self.acc.drain(cluster, {NODE}, 1 << 20, now=time.monotonic() + 1)[NODE]
        for batch in drained:
            heapq.heappush(self.sender._in_flight_batches[TP], (batch.created, batch))
        return list(drained)

    def send_all(self, count: int) -> list[ProducerBatch]:
        return [batch for _ in range(count) for batch in self.send()]

    def answer(self, batch: ProducerBatch, error_code: int = 0) -> None:
        """The broker's answer for `batch`, as the sender handles it."""
        offset = -1 if error_code else self.offset
        self.offset += 0 if error_code else batch.record_count
        self.sender._complete_batch(batch, Answer(index=0, error_code=error_code,
                                                  base_offset=offset))  # fmt: skip

    def queued(self) -> list[int]:
        """The base sequences of the partition's queue, first first (-1: never sent)."""
        with internals.partition_lock(self.acc, TP):
            return [batch.base_sequence for batch in internals.partition_queue(self.acc, TP)]

    @property
    def muted(self) -> bool:
        return TP in self.acc.muted


@pytest.fixture
def line() -> Any:
    found = Line()
    yield found
    found.close()


def sequences(batches: list[ProducerBatch]) -> list[int]:
    return [batch.base_sequence for batch in batches]


def test_five_retried_batches_answered_in_order_go_back_in_sequence_order(line: Line) -> None:
    line.queue(7)
    sent = line.send_all(5)
    assert sequences(sent) == [0, 2, 4, 6, 8]  # five in flight at once
    for batch in sent:  # the old leader answers them one after the other
        line.answer(batch, NOT_LEADER)
    assert line.queued() == [0, 2, 4, 6, 8, -1, -1]


def test_kafka_python_alone_puts_them_back_in_reverse() -> None:
    line = Line(ordered=False)
    try:
        line.queue(7)
        for batch in line.send_all(5):
            line.answer(batch, NOT_LEADER)
        assert line.queued() == [8, 6, 4, 2, 0, -1, -1]  # the new leader sees 8 first
    finally:
        line.close()


@pytest.mark.parametrize("order", [(2, 0, 4, 1, 3), (4, 3, 2, 1, 0), (0, 4, 1, 3, 2)])
def test_retried_batches_answered_in_any_order_go_back_in_sequence_order(
    line: Line, order: tuple[int, ...]
) -> None:
    line.queue(6)
    sent = line.send_all(5)
    for index in order:
        line.answer(sent[index], NOT_LEADER)
    assert line.queued() == [0, 2, 4, 6, 8, -1]


def test_a_retrying_partition_sends_one_batch_at_a_time_then_several_again(line: Line) -> None:
    line.queue(8)
    sent = line.send_all(5)
    line.answer(sent[0], NOT_LEADER)
    assert line.muted and line.send() == []  # four still out to the old leader
    for batch in sent[1:]:
        line.answer(batch, NOT_LEADER)
    assert not line.muted
    for expected in sent:
        (retry,) = line.send()
        assert retry is expected and line.send() == []  # the next waits for this one
        line.answer(retry)
        assert retry.produce_future.succeeded()
    assert sequences(line.send_all(3)) == [10, 12, 14]  # never-sent ones, several at once


def test_a_retried_batch_answered_again_keeps_its_place(line: Line) -> None:
    line.queue(3)
    sent = line.send_all(3)
    for batch in sent:
        line.answer(batch, NOT_LEADER)
    (first,) = line.send()
    line.answer(first, NOT_LEADER)  # the metadata is still stale: the old leader again
    assert line.queued() == [0, 2, 4]
    for expected in sent:
        (retry,) = line.send()
        assert retry is expected
        line.answer(retry)
    assert line.queued() == [] and not line.muted


def test_out_of_order_behind_an_unanswered_batch_is_retried_behind_it(line: Line) -> None:
    line.queue(3)
    first, second, third = line.send_all(3)
    line.answer(first, NOT_LEADER)  # waits to be retried
    line.answer(second, OUT_OF_ORDER)  # the new leader got it before the first
    line.answer(third, OUT_OF_ORDER)
    assert line.queued() == [0, 2, 4] and not second.produce_future.is_done
    for expected in (first, second, third):
        (retry,) = line.send()
        assert retry is expected
        line.answer(retry)
    assert [b.produce_future.succeeded() for b in (first, second, third)] == [True] * 3
    assert line.failed == {}


def test_out_of_order_with_nothing_unanswered_before_it_still_fails(line: Line) -> None:
    line.queue(3)
    first, second, third = line.send_all(3)
    line.answer(first)
    line.answer(second, OUT_OF_ORDER)  # a real gap: kafka-python's verdict stands
    assert isinstance(error_of(second.produce_future), OutOfOrderSequenceNumberError)
    assert set(line.failed) == {TP}  # ktm's hook: nothing more for this partition


def test_out_of_order_after_a_split_still_fails(line: Line) -> None:
    line.queue(3)
    first, second, third = line.send_all(3)
    line.acc.split_and_reenqueue(first)  # its halves get sequence numbers anew
    line.answer(second, OUT_OF_ORDER)
    assert isinstance(error_of(second.produce_future), OutOfOrderSequenceNumberError)


def test_a_retried_batch_that_fails_for_good_still_fails_the_queued_ones(line: Line) -> None:
    queued = line.queue(4)
    sent = line.send_all(3)
    for batch in sent:
        line.answer(batch, NOT_LEADER)
    (retry,) = line.send()
    line.answer(retry, CORRUPT)  # not retriable
    assert set(line.failed) == {TP} and line.queued() == [] and not line.muted
    # ktm's hook failed the retried ones queued behind it and the never-sent one alike
    assert [type(error_of(b.produce_future)) for b in queued] == [CorruptRecordError] * 4
    refused = PartitionFailed(TP.topic, TP.partition, line.failed)  # what new records meet
    assert "CorruptRecordError" in str(refused)


def test_sequences_across_the_wrap_keep_their_order(line: Line) -> None:
    line.txn.set_sequence_number(TP, SEQUENCES - 3)
    line.queue(4)
    sent = line.send_all(4)
    assert sequences(sent) == [SEQUENCES - 3, SEQUENCES - 1, 1, 3]
    for batch in reversed(sent):
        line.answer(batch, NOT_LEADER)
    assert line.queued() == [SEQUENCES - 3, SEQUENCES - 1, 1, 3]


def test_precedes_compares_across_the_wrap() -> None:
    assert precedes(0, 2) and not precedes(2, 0) and not precedes(5, 5)
    assert precedes(SEQUENCES - 1, 0) and not precedes(0, SEQUENCES - 1)
    assert precedes(SEQUENCES - 10, 10)


def test_insert_leaves_never_sent_batches_behind() -> None:
    def batch(sequence: int) -> Any:
        return SimpleNamespace(has_sequence=sequence >= 0, base_sequence=sequence)

    queue = deque([batch(4), batch(8), batch(-1)])
    insert_in_sequence_order(queue, batch(6))
    insert_in_sequence_order(queue, batch(0))
    assert [b.base_sequence for b in queue] == [0, 4, 6, 8, -1]


def test_a_queue_a_drain_emptied_is_forgotten_and_made_anew_by_a_retry(line: Line) -> None:
    # kafka-python walks every partition's queue on each loop of the I/O thread
    # (relay.internals.forget_drained_queues): an emptied one leaves the accumulator
    queues = line.acc._batches
    line.queue(3)
    first, second = line.send_all(2)
    assert TP in queues  # one batch still waits
    (third,) = line.send()
    assert TP not in queues and not line.acc.ready(line.client.cluster)[0]
    line.answer(first)
    line.answer(second, NOT_LEADER)  # the retry brings the partition's queue back
    line.answer(third, NOT_LEADER)
    assert TP in queues and line.queued() == [2, 4]
    for expected in (second, third):
        (retry,) = line.send()
        assert retry is expected
        line.answer(retry)
    assert [b.produce_future.succeeded() for b in (first, second, third)] == [True] * 3
