"""A destination partition's tail is read once nothing its leader appended can still commit
behind the reader's back.

With acks=all a leader appends a batch at once and commits it (moves its high watermark past
it) once every in-sync replica holds it. A follower that stops fetching (killed, frozen, cut
off) stays in the ISR until its broker is fenced (`broker.session.timeout.ms`, 9 s) or it lags
`replica.lag.time.max.ms` (30 s); meanwhile the appended batches wait above the high
watermark. A batch whose request timed out, or that a task gave up when its round ended, may
be one of them, and it commits once the follower leaves the ISR. A round that resumed from the
high watermark before then wrote the same records again (CI: 10,229 records of 10,000 after a
source leader's kill, the node being a follower of the destination too; reproduced by freezing
a destination follower in tests/integration/test_cluster_faults.py).

So where a tail decides where a copy resumes, each leader's log end is asked first (it
counts what is appended and not committed: `internals.log_ends_soon`), then the high
watermark, again until it reaches that log end, or the leader changes (its successor's log is
what commits: its end is asked). A broker that does not offer the request (Tansu, one node)
has nothing to wait for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kafka import KafkaConsumer, TopicPartition

from relay import internals
from relay.clients.ends import real_end_offsets
from relay.config import ClusterConfig

log = logging.getLogger(__name__)

# seconds: past a fencing (9 s) and replica.lag.time.max.ms (30 s), Kafka's defaults, where the
# broker does not describe its own lag limit; a stall longer than that is said, and the tail
# read as it stands
SETTLE_LIMIT = 45.0
SETTLE_MARGIN = 15.0  # past the broker's replica.lag.time.max.ms: its check runs on a period
SETTLE_POLL = 0.2

Appended = internals.LogEnds  # (leader epoch, log end) of each partition


def asking(
    consumer: KafkaConsumer, parts: list[TopicPartition], timeout: float
) -> Callable[[], Appended]:
    """Each partition's log end on its leader, committed or not, asked now (before the high
    watermark is read) and answered when the call returned is made: the requests between go
    meanwhile. {} where it cannot be asked."""
    try:
        return internals.log_ends_soon(consumer, parts, timeout)
    except internals.Missing:  # said once at start-up (internals.check)
        return dict


def appended(consumer: KafkaConsumer, parts: list[TopicPartition], timeout: float) -> Appended:
    """`asking`, answered."""
    return asking(consumer, parts, timeout)()


def await_commits(
    cluster: ClusterConfig,
    consumer: KafkaConsumer,
    ends: Appended,
    begin: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    timeout: float,
    limit: Callable[[], float] = lambda: SETTLE_LIMIT,
) -> None:
    """Until each partition's high watermark (`end`, updated in place) reaches the log end its
    leader had (`ends`), or at most `limit()` seconds (asked only when something waits: see
    `settle_limit`)."""
    waiting = _behind(ends, end)
    if not waiting:
        return
    log.info(
        "%d destination partitions hold records not committed yet (%s[%d]: %d, committed to "
        "%d): their tails are read once they are",
        len(waiting), waiting[0].topic, waiting[0].partition, ends[waiting[0]][1], end[waiting[0]],
    )  # fmt: skip
    most = limit()
    deadline = time.monotonic() + most
    while waiting:
        if time.monotonic() > deadline:
            log.warning(
                "destination %s[%d] and %d other partitions still hold records not committed "
                "after %.0f s (a follower stalled in the ISR longer than replica.lag.time.max.ms?)"
                ": their tails are read as they stand, and records a round gave up there may "
                "arrive twice",
                waiting[0].topic, waiting[0].partition, len(waiting) - 1, most,
            )  # fmt: skip
            return
        time.sleep(SETTLE_POLL)
        end.update(real_end_offsets(cluster, consumer, waiting, begin, timeout))
        now = appended(consumer, waiting, timeout)
        for tp, asked in now.items():
            if asked[0] != ends[tp][0]:  # a new leader: its log is what commits
                ends[tp] = asked
        if len(now) < len(waiting):  # a leader moved or did not answer: whose is it now
            consumer.topics()
        waiting = _behind(ends, end)


def settle_limit(lag_limit_ms: str | None) -> float:
    """How long a tail waits for its leader's commits: the broker's `replica.lag.time.max.ms`
    (a follower that stalls longer leaves the ISR, and what waited commits) and a margin, or
    SETTLE_LIMIT where the broker does not describe it (Tansu) or describes nonsense."""
    try:
        lag = float(lag_limit_ms) / 1000 if lag_limit_ms else None
    except ValueError:
        lag = None
    return SETTLE_LIMIT if lag is None or lag <= 0 else lag + SETTLE_MARGIN


def _behind(ends: Appended, end: dict[TopicPartition, int]) -> list[TopicPartition]:
    return sorted(tp for tp, (_, last) in ends.items() if tp in end and last > end[tp])
