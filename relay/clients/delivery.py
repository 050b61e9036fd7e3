"""How a run of records sent together ended, read from kafka-python's futures.

A producer batch's future *succeeds* even when the batch failed, expired or was aborted (the
error rides in its value, for the per-record futures to raise), so reading it as a plain future
would count lost records as acknowledged. Shared by the record path (relay.clients.producer)
and the batch path (relay.clients.batch_produce).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Delivery:
    """How a run of records sent together ended: pending, acknowledged, or failed."""

    __slots__ = ("_future", "_batch")

    def __init__(self, future: Any, batch: bool):
        self._future = future  # a producer batch's future, or one record's (the fallback path)
        self._batch = batch

    @property
    def done(self) -> bool:
        return bool(self._future.is_done)

    def error(self) -> BaseException | None:
        """Why the records were not acknowledged; None while pending and once acknowledged."""
        future = self._future
        if not future.is_done:
            return None
        if not self._batch:
            return future.exception
        return error_of(future)  # (base offset, log append time, errors by index)

    def acked(self) -> bool:
        return self.done and self.error() is None

    def on_ack(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the producer's I/O thread) once acknowledged; never on failure."""
        self._future.add_callback(lambda _: callback() if self.error() is None else None)


def error_of(future: Any) -> BaseException | None:
    """A producer batch future's error: raised, or carried in its value (see Delivery)."""
    if future.exception is not None:
        return future.exception
    _, _, record_errors = future.value
    return None if record_errors is None else record_errors(0) or RuntimeError("batch failed")
