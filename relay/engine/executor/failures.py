"""How a task's reading and writing fail: the kinds the loop tells apart when it reports an
error to the driver (which side failed, and whether records landed after the failed ones)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from relay.spec import SourcePartition


class SourceFailure(Exception):
    """Reading the source (a cluster or the store) failed; wraps the error."""

    key: SourcePartition | None = None


class TargetFailure(Exception):
    """Writing failed; wraps the error. `hole`: records of the partition written after the
    failed ones were acknowledged, so the destination's tail is past records it lacks."""

    def __init__(self, message: str, key: SourcePartition | None = None, hole: bool = False):
        super().__init__(message)
        self.key = key
        self.hole = hole


class DeliveryFailure(TargetFailure):
    """The destination refused or never acknowledged records; the message names them."""


class Refused(DeliveryFailure):
    """The destination refused a record for good (a retry is refused the same way): its
    partition halts at `halt_at`, the source offset of the first refused record; the records
    before it are relayed (see relay.refusals)."""

    def __init__(self, message: str, key: SourcePartition | None, halt_at: int, hole: bool = False):
        super().__init__(message, key, hole)
        self.halt_at = halt_at


class SourceLost(SourceFailure):
    """Source records were lost before they were read, and the partition halts at the reader's
    position `halt_at` (relay.losses: on_loss = "stop", or a truncated log)."""

    def __init__(
        self,
        message: str,
        key: SourcePartition | None,
        halt_at: int,
        lost: tuple[int, int, str],
    ):
        super().__init__(message)
        self.key = key
        self.halt_at = halt_at
        self.lost = lost


@contextmanager
def opening(failure: type[SourceFailure] | type[TargetFailure]) -> Iterator[None]:
    """A client that cannot be opened fails the task on its side (`failure`: SourceFailure or
    TargetFailure), with the library's message."""
    try:
        yield
    except Exception as exc:
        raise failure(str(exc)) from exc
