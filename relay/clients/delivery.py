"""How a run of records sent together ended, read from kafka-python's futures.

A producer batch's future *succeeds* even when the batch failed, expired or was aborted (the
error rides in its value, for the per-record futures to raise), so reading it as a plain future
would count lost records as acknowledged. Shared by the record path (relay.clients.producer)
and the batch path (relay.clients.batch_produce).
"""

from __future__ import annotations

from collections.abc import Callable

from kafka.errors import (
    BrokerResponseError,
    NotEnoughReplicasAfterAppendError,
    RequestTimedOutError,
)
from kafka.future import Future
from kafka.producer.producer_batch import FinalState, ProducerBatch

from relay.spec import ACKED, NOT_WRITTEN, UNKNOWN

# Broker answers after which the records may be in the log all the same: appended, not yet
# replicated enough; or the broker gave up waiting for the replicas
MAY_BE_APPENDED = (RequestTimedOutError, NotEnoughReplicasAfterAppendError)


class Delivery:
    """How a run of records sent together ended: pending, acknowledged, or failed."""

    __slots__ = ("_future", "_batch")

    def __init__(self, future: Future, batch: ProducerBatch | None):
        # a producer batch's future and the batch, or one record's future (the fallback path)
        self._future = future
        self._batch = batch

    @property
    def done(self) -> bool:
        return bool(self._future.is_done)

    def error(self) -> BaseException | None:
        """Why the records were not acknowledged; None while pending and once acknowledged."""
        future = self._future
        if not future.is_done:
            return None
        if self._batch is None:
            return _exception(future)
        return error_of(future)  # (base offset, log append time, errors by index)

    def refused(self, count: int) -> tuple[int, BaseException] | None:
        """The first record of the batch (of `count`) the broker named as refused, by its index,
        with its error (ProduceResponse v8+ `record_errors`: Apache Kafka names every record it
        refuses for a timestamp or a null key); None when it named none. kafka-python keeps
        them in the future's value as a function of the index: the batch's own error object
        for every index when the broker named none, else a new error at each call, a plain
        KafkaError for the records it did not name (what `error()` then says)."""
        future = self._future
        if not (self._batch is not None and future.is_done and future.exception is None):
            return None
        _, _, by_index = future.value
        if by_index is None or count < 1 or by_index(0) is by_index(0):
            return None  # one error object for every record: the broker named none
        for index in range(count):
            error = by_index(index)
            if not _unnamed(error):
                return index, error
        return None

    def acked(self) -> bool:
        return self.done and self.error() is None

    def written(self) -> int:
        """ACKED, NOT_WRITTEN (the broker refused it, or it never left: it is not in the log),
        or UNKNOWN (still out, or ended without an answer: timed out, cut off, abandoned; it
        may have landed)."""
        if not self.done:
            return UNKNOWN
        error = self.error()
        if error is None:
            return ACKED
        batch = self._batch
        if batch is not None and batch.drained is None:
            return NOT_WRITTEN  # failed before the sender ever took it: no broker saw it
        if batch is not None and batch.final_state is FinalState.ABORTED:
            # Given up by the producer, not answered by the broker. kafka-python 3.0.12 puts an
            # idempotent producer in a fatal state when the broker refuses one batch for good
            # (a timestamp, a null key) and aborts every batch in flight with that refusal:
            # those to other partitions may well be in the log.
            return UNKNOWN
        refused = isinstance(error, BrokerResponseError)
        return NOT_WRITTEN if refused and not isinstance(error, MAY_BE_APPENDED) else UNKNOWN

    def on_ack(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the producer's I/O thread) once acknowledged; never on failure."""
        self._future.add_callback(lambda _: callback() if self.error() is None else None)


def _unnamed(error: BaseException) -> bool:
    """kafka-python's error for a record the broker did not name (part of a refused batch)."""
    return type(error).__name__ == "KafkaError" and "part of a batch" in str(error)


def error_of(future: Future) -> BaseException | None:
    """A producer batch future's error: raised, or carried in its value (see Delivery)."""
    if future.exception is not None:
        return _exception(future)
    _, _, record_errors = future.value
    return None if record_errors is None else record_errors(0) or RuntimeError("batch failed")


def _exception(future: Future) -> BaseException | None:
    """A kafka-python future's exception (its attribute is untyped)."""
    found = future.exception
    return found if isinstance(found, BaseException) else None
