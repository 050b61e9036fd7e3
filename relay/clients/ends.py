"""A source partition's real end: where a reader of it stops, confirmed by a fetch (ListOffsets
alone under-reports on Tansu), for the driver's start-up reads and health checks
(relay.clients.admin).
"""

from __future__ import annotations

import dataclasses
import functools
import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError

from relay.clients.batch_fetch import TP, BatchFetcher
from relay.clients.kept import Ahead, kept
from relay.config import ClusterConfig

# A partition's (beginning, listed end) -> its real end, as one node answered them last time.
# A partition whose beginning and listed end are what they were is not fetched again: any append
# (a transaction's marker too) moves the listed end on both brokers, so its last batch, hence
# its real end, is the same (a health check of 2,000 idle partitions: no fetch instead of one
# that brings 2,000 batches).
EndMemo = dict[TopicPartition, tuple[int, int, int]]
END_PROBE_BYTES = 1  # records a partition's end probe asks for: only its header is read


def real_end_offsets(
    cluster: ClusterConfig,
    consumer: KafkaConsumer,
    tps: list[TopicPartition],
    begin: dict[TopicPartition, int],
    timeout: float,
    memo: EndMemo | None = None,
) -> dict[TopicPartition, int]:
    """Where each partition ends for a reader of `cluster` (`consumer` lists offsets on it, read
    uncommitted: see `listing`): the log end, or under read_committed the last stable offset
    (no record of a transaction still open lies before it), both confirmed by a fetch.

    ListOffsets(latest) is exact on Apache Kafka but under-reports on Tansu (it answers the base
    offset of the last batch + 1). A fetch at the listed end, which never lies past the high
    watermark, answers the high watermark and the last stable offset, right on both brokers, in
    its header: no record is wanted. (A fetch from inside the log, even for a byte, costs Apache
    Kafka ~2.3 ms a partition on a 2-core machine: 23 s at 10,000 partitions; at the log end
    0.4 s.) A partition listed as ending at its beginning is empty on both (Tansu's answer for a
    partition holding anything is past its beginning): no fetch asks it, which spares a fresh
    destination's thousands of partitions a fetch that waits for data.

    Under read_committed the listing is still read_uncommitted's: ListOffsets(READ_COMMITTED)
    is the last stable offset on Apache Kafka, but Tansu answers 0 while a transaction is open
    (measured), which would pass a partition holding records for an empty one and key the memo
    on a number that does not move. The read_uncommitted listing moves with every append on
    both, and a fetch's last stable offset is exact on both (measured on Tansu 0.6 with a
    transaction open, committed and aborted).

    `memo` (kept by the caller for one node, updated here): see `EndMemo`.
    """
    if not tps:
        return {}
    listed = consumer.end_offsets(tps, timeout_ms=int(timeout * 1000))
    held = [tp for tp in tps if listed[tp] > begin[tp]]
    known = memo or {}
    same = {tp: known[tp][2] for tp in held if known.get(tp, ())[:2] == (begin[tp], listed[tp])}
    asked = [tp for tp in held if tp not in same]
    ends = {**listed, **same, **_fetched_ends(cluster, asked, listed, begin, timeout)}
    if memo is not None:
        memo.update({tp: (begin[tp], listed[tp], ends[tp]) for tp in held})
    return ends


def listing(cluster: ClusterConfig) -> ClusterConfig:
    """The cluster as `real_end_offsets` lists its offsets: read_uncommitted (see there)."""
    return dataclasses.replace(cluster, isolation_level="read_uncommitted")


def _fetched_ends(
    cluster: ClusterConfig,
    tps: list[TopicPartition],
    listed: dict[TopicPartition, int],
    begin: dict[TopicPartition, int],
    timeout: float,
) -> dict[TopicPartition, int]:
    """Real ends of `tps` from one fetch at each listed end: its high watermark, or under
    read_committed its last stable offset (`Fetched.end`), which may lie below the listed end.
    The fetch does not wait for records (min_bytes 0)."""
    if not tps:
        return {}
    positions = {(tp.topic, tp.partition): listed[tp] for tp in tps}
    floor = {
        key: 0 if cluster.read_committed else listed[TopicPartition(*key)] for key in positions
    }
    deadline = time.monotonic() + timeout
    ends: dict[TP, int] = {}
    with kept(*end_probe(cluster, timeout)) as fetcher:
        while positions:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(f"{topic}[{partition}]" for topic, partition in sorted(positions))
                raise TimeoutError(f"no fetch answer within {timeout}s for {names}")
            for key, fetched in fetcher.fetch(positions, left).items():
                if fetched.error is None:
                    ends[key] = max(floor[key], fetched.end)
                    del positions[key]
                elif isinstance(fetched.error, OffsetOutOfRangeError):
                    # the log was cut below its listed end since (a recreated topic, an
                    # unclean leader election): ask at its listed beginning
                    positions[key] = begin[TopicPartition(*key)]
                elif not getattr(fetched.error, "retriable", False):
                    raise fetched.error
            if positions:
                time.sleep(min(END_RETRY_PAUSE, max(0.0, deadline - time.monotonic())))
    return {TopicPartition(*key): end for key, end in ends.items()}


def end_probe(cluster: ClusterConfig, timeout: float) -> Ahead:
    """How `_fetched_ends` keeps its fetcher: the key, the making, the closing."""
    make = functools.partial(
        BatchFetcher, cluster, timeout, min_bytes=0, partition_max_bytes=END_PROBE_BYTES
    )
    return Ahead(("end-probe", cluster, timeout), make, BatchFetcher.close)


END_RETRY_PAUSE = 0.05  # seconds: a leader moving or metadata refreshing, bounded by the timeout
