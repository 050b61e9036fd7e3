"""The Fetch request and answer on kafka-python's protocol classes, versions 4 to 12: what a
fetch session's plan (`relay.clients.fetch_session.NextFetch`) becomes on the wire, and what
one partition's answer says (`Fetched`). `relay.clients.batch_fetch` sends and receives them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from kafka.protocol.consumer import FetchRequest, FetchResponse

from relay.clients.fetch_session import NextFetch

TP = tuple[str, int]

_FetchTopic = FetchRequest.FetchTopic
_FetchPartition = _FetchTopic.FetchPartition
_ForgottenTopic = FetchRequest.ForgottenTopic
_READ_UNCOMMITTED, _READ_COMMITTED = 0, 1
_MIN_VERSION = 4  # the first with magic-2 batches, last stable offset and aborted transactions
_MAX_VERSION = 12  # the last addressing topics by name (13 uses topic ids)


class Fetched(NamedTuple):
    """One partition's answer."""

    data: bytes  # record batches as stored; may end with a partial batch
    high_watermark: int
    log_start_offset: int
    error: BaseException | None = None
    # Where a reader at the fetch's isolation level stops: the last stable offset under
    # read_committed (no open transaction's record lies before it), else the high watermark.
    end: int = -1
    aborted: tuple[tuple[int, int], ...] = ()  # (producer id, first offset): read_committed
    # The leader's log diverges from the one the fetch's last fetched epoch was read from at
    # this offset (the end of that epoch on the leader): -1 when it does not.
    diverged: int = -1


@dataclass(frozen=True)
class FetchTerms:
    """What every fetch of one fetcher asks for besides its partitions."""

    committed: bool  # read_committed, else read_uncommitted
    max_wait_ms: int
    min_bytes: int
    max_bytes: int

    def request(self, plan: NextFetch, turn: int) -> FetchRequest:
        """The request for `plan`, its partitions named from the `turn`-th (modulo their count)."""
        # A broker fills an answer's max_bytes in the request's order: the order turns from one
        # request to the next, so that with more data than fits, no partition waits behind
        # the same others every time (what Kafka's consumer does too).
        entries = list(plan.send.items())
        turn = turn % len(entries) if entries else 0
        by_topic: dict[str, list[FetchRequest.FetchTopic.FetchPartition]] = defaultdict(list)
        for (topic, partition), (offset, max_bytes, epoch) in entries[turn:] + entries[:turn]:
            by_topic[topic].append(
                _FetchPartition(
                    partition=partition,
                    current_leader_epoch=-1,
                    fetch_offset=offset,
                    last_fetched_epoch=epoch,
                    log_start_offset=-1,
                    partition_max_bytes=max_bytes,
                )
            )
        forgotten: dict[str, list[int]] = defaultdict(list)
        for topic, partition in plan.forget:
            forgotten[topic].append(partition)
        return FetchRequest(
            max_wait_ms=self.max_wait_ms,
            min_bytes=self.min_bytes,
            max_bytes=self.max_bytes,
            isolation_level=_READ_COMMITTED if self.committed else _READ_UNCOMMITTED,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            topics=[_FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
            forgotten_topics_data=[
                _ForgottenTopic(topic=t, partitions=ps) for t, ps in forgotten.items()
            ],
            rack_id="",
            min_version=_MIN_VERSION,
            max_version=_MAX_VERSION,
        )

    def fetched(
        self, part: FetchResponse.FetchableTopicResponse.PartitionData, error: BaseException | None
    ) -> Fetched:
        """One partition's answer, as a reader at this isolation level takes it."""
        end = part.high_watermark
        aborted: tuple[tuple[int, int], ...] = ()
        if self.committed:
            # Every broker of Fetch v4+ answers the last stable offset (-1 only with an error);
            # Tansu's is right (measured with a transaction open, committed and aborted), but it
            # lists no aborted transaction: their records reach a read_committed reader there.
            if part.last_stable_offset >= 0:
                end = part.last_stable_offset
            aborted = tuple(
                (txn.producer_id, txn.first_offset) for txn in part.aborted_transactions or ()
            )
        data = part.records or b""
        return Fetched(
            data, part.high_watermark, part.log_start_offset, error, end, aborted, _diverged(part)
        )


def _diverged(part: FetchResponse.FetchableTopicResponse.PartitionData) -> int:
    """Where the leader's log parts from the one the last fetched epoch was read from (Fetch
    v12+'s DivergingEpoch, -1 by default; older versions have none)."""
    epoch = getattr(part, "diverging_epoch", None)
    if epoch is None or epoch.epoch < 0 or epoch.end_offset < 0:
        return -1
    return int(epoch.end_offset)
