"""What a run of records became, read from kafka-python's futures (relay.clients.delivery)."""

from __future__ import annotations

from kafka.errors import (
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    OutOfOrderSequenceNumberError,
    RequestTimedOutError,
)
from kafka.future import Future

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
        return Delivery(record_future(error, done), batch=False).written()

    assert written() == ACKED
    assert written(done=False) == UNKNOWN
    assert written(OutOfOrderSequenceNumberError()) == NOT_WRITTEN  # the broker refused it
    assert written(KafkaTimeoutError()) == UNKNOWN  # expired without an answer
    assert written(RequestTimedOutError()) == UNKNOWN  # the replicas were waited for in vain
    assert written(NotEnoughReplicasAfterAppendError()) == UNKNOWN  # in the leader's log
