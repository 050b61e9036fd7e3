"""Fetch record batches as bytes, for a set of source partitions (kafka-python as transport).

kafka-python's consumer turns every fetched record into a Python object. This module sends the
Fetch requests itself, through kafka-python's network client (`KafkaNetClient`: connections,
TLS, SASL, API versions, metadata, as `client_settings` configures them) and its protocol
classes (`FetchRequest`), and hands back each partition's `records` field untouched: the
batches as the broker stored them, to be split and rebuilt by `relay.batches`.

A fetch lives as long as it takes. A broker's partitions are split into lanes
(relay.clients.fetch_lanes: how many, which partitions, which lanes get a fetch now); `send`
puts a fetch on the wire for the lanes whose turn it is; `receive` waits a bounded time for
answers and returns those that came; a fetch still out stays out, and its lane gets no second
one until it is answered or times out (kafka-python fails it after the client's request
timeout and closes the connection). A caller that no longer wants what it asked (`abandon`)
gets the late answer dropped. So a link whose round trip is longer than the task loop's tick,
or a broker slow to answer a thousand partitions, is waited for instead of abandoned at every
tick.

The isolation level is the cluster's (`ClusterConfig.isolation_level`: a source's is
`[source_pool].isolation_level`). Under read_committed an answer ends at the partition's last
stable offset and lists the aborted transactions it overlaps (`Fetched.aborted`), which the
readers drop with `relay.batches.drop_aborted`; `Fetched.end` is where a reader at the fetch's
isolation level stops: the last stable offset, or the high watermark under read_uncommitted.

Each broker gets an incremental fetch session (`relay.clients.fetch_session`, KIP-227) where it
offers one: a request then names only the partitions whose fetch offset changed. A response may
end with a partial batch; the caller fetches again from the next offset after the last whole
batch (`relay.batches.rebuild` gives it), so nothing is returned twice or skipped.

A fetch names the leader epoch of the last batch the caller read from the partition (Fetch v12's
`LastFetchedEpoch`, as a follower does): when the leader's log diverges from the one that batch
came from (an unclean leader election), it answers no records and where the two part
(`Fetched.diverged`), even when its log has grown past the fetch offset since, which an
out-of-range answer would not tell.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kafka import TopicPartition
from kafka import errors as kafka_errors
from kafka.future import Future
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchResponse

from relay.clients.fetch_lanes import Lanes
from relay.clients.fetch_protocol import TP, Fetched, FetchTerms
from relay.clients.fetch_session import FetchSession, NextFetch, Wanted
from relay.clients.seed import Seed, seed_of, seeded
from relay.clients.settings import client_settings, never_create_topics
from relay.config import ClusterConfig

log = logging.getLogger(__name__)

NO_LEADER = "(no leader)"  # the broker a fetch for a partition without a leader failed at

_FRAME_MARGIN = 1024 * 1024  # a response's headers around its records


class Answer(NamedTuple):
    key: TP
    offset: int  # the fetch offset it answers
    fetched: Fetched
    node: str  # the broker asked, "host:port"


@dataclass
class _OnTheWire:
    """One fetch sent to a broker and not answered yet."""

    node: int
    future: Future
    offsets: dict[TP, int]  # every partition it covers (a session's too), at its fetch offset
    sent_at: float
    wanted: bool = True  # False once abandoned: its answer is dropped
    session: FetchSession | None = field(default=None, repr=False)


class _Grouped(NamedTuple):
    updates: int  # the metadata updates counted when it was made
    keys: frozenset[TP]
    by_leader: dict[int, list[TP]]


class BatchFetcher:
    def __init__(
        self,
        cluster: ClusterConfig,
        request_timeout: float = 10.0,
        *,
        max_wait: float = 0.1,
        min_bytes: int = 1,
        partition_max_bytes: int = 8 * 1024 * 1024,
        max_bytes: int = 64 * 1024 * 1024,
        sessions: bool = False,
        lanes: int = 1,
        idle_wait: float = 0.0,
        # the pipelined readers' (send/receive): `fetch` sends once, so it leaves it None
        lane_partitions: int | None = None,
        seed: Seed | None = None,  # the driver's metadata of the cluster (relay.clients.seed)
        # unit tests pass a stand-in for kafka-python's network client
        client: KafkaNetClient | None = None,
    ):
        if client is None:
            settings = client_settings(cluster, request_timeout)
            # its default frame limit (1 MB) is below a fetch's: the consumer raises it alike
            settings["receive_message_max_bytes"] = max_bytes + _FRAME_MARGIN
            # A fetch names its topics in metadata requests: they must not create them.
            client = never_create_topics(KafkaNetClient(**settings))
            seeded(client, seed, cluster.servers)
        self._client = client
        self._servers = cluster.servers
        self._terms = FetchTerms(cluster.read_committed, int(max_wait * 1000), min_bytes, max_bytes)
        self._idle_terms = (
            replace(self._terms, max_wait_ms=int(idle_wait * 1000), min_bytes=1)
            if idle_wait > max_wait
            else self._terms
        )
        self._partition_max_bytes = partition_max_bytes
        self._sessions: dict[tuple[int, int], FetchSession] | None = {} if sessions else None
        self._wire: dict[tuple[int, int], _OnTheWire] = {}  # by (node, lane)
        self._lanes = Lanes(lanes, lane_partitions, min_bytes)
        self._turn = 0
        self._closed = False
        self._grouped: _Grouped | None = None
        self._metadata_updates = 0
        client.cluster.add_listener(self._count_update)

    # ---- pipelined: send, then receive what came ------------------------------------------

    def send(
        self, positions: Mapping[TP, int], epochs: Mapping[TP, int] | None = None
    ) -> list[Answer]:
        """A fetch to each leader of `positions` that has none on the wire (the others' turn
        comes once theirs is answered), naming for each partition in `epochs` the leader epoch
        of the last batch read from it. Returns an error answer for each partition that could
        not be asked: its leader is unknown."""
        refused: list[Answer] = []
        last_epochs = epochs or {}
        for node, keys in self._leaders_of(positions, refused).items():
            for lane, lane_keys in self._lanes.to_send(node, keys, self._wire.keys()).items():
                wanted = {
                    key: (positions[key], self._partition_max_bytes, last_epochs.get(key, -1))
                    for key in lane_keys
                }
                self._wire[(node, lane)] = self._send_to((node, lane), wanted)
        if refused and not self._wire:
            # nothing on the wire polls the client: the metadata update asked for the unknown
            # leaders (a partition added while running) would never be sent
            future = self._client.cluster.request_update()
            self._client.poll(timeout_ms=_LEADER_WAIT_MS, future=future)
        return refused

    def busy(self) -> bool:
        """Every broker sent to so far has as many fetches on the wire as it may: `send` would
        send nothing (a caller of a thousand partitions skips building their positions)."""
        return self._lanes.busy(self._wire.keys())

    def receive(self, timeout: float) -> list[Answer]:
        """The answers to the fetches that completed, waiting up to `timeout` seconds for the
        first one (none: nothing is on the wire, or nothing came in time)."""
        deadline = time.monotonic() + timeout
        while self._wire and not any(w.future.is_done for w in self._wire.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._client.poll(timeout_ms=max(1, int(left * 1000)))
        answers: list[Answer] = []
        for where, wire in list(self._wire.items()):
            if wire.future.is_done:
                del self._wire[where]
                answered = self._answers_of(wire)
                if wire.future.succeeded():
                    self._lanes.weigh(where, sum(len(a.fetched.data) for a in answered))
                answers += answered
        return answers

    def waiting_on(self) -> dict[str, float]:
        """The brokers a fetch is out to, and since when (monotonic seconds)."""
        return {self._address(w.node): w.sent_at for w in self._wire.values() if w.wanted}

    def abandon(self) -> None:
        """What is on the wire is no longer wanted (the positions moved, or the task ended):
        its answers are dropped when they come, and only then does the node get a new fetch."""
        for wire in self._wire.values():
            wire.wanted = False

    # ---- one fetch, waited for (start-up reads) ------------------------------------------

    def fetch(self, positions: Mapping[TP, int], timeout: float) -> dict[TP, Fetched]:
        """One fetch per leader for `positions` (partition: fetch offset), waited for up to
        `timeout`. Every partition gets an answer; one whose leader is unknown or unreachable,
        or that was not answered in time, carries the error."""
        deadline = time.monotonic() + timeout
        found = {a.key: a.fetched for a in self.send(positions)}
        while self._wire and len(found) < len(positions):
            answers = self.receive(max(0.0, deadline - time.monotonic()))
            found.update({a.key: a.fetched for a in answers if a.key in positions})
            if time.monotonic() >= deadline:
                break
        self.abandon()
        late = kafka_errors.KafkaTimeoutError(f"no fetch response in {timeout}s")
        for key in positions:
            found.setdefault(key, _failed(late))
        return found

    # ---- before the first fetch ------------------------------------------------------------

    def warm(self, topics: frozenset[str], timeout: float) -> None:
        """Metadata for `topics` and a ready connection to each of their leaders, so that the
        first fetch goes out at once: each is a round trip or two, a second across a long
        link, paid here while the driver still waits for its group. Best effort, never
        raises: what is not ready in time is asked for again by the first fetch."""
        try:
            self._connect_leaders(topics, time.monotonic() + timeout)
        except Exception as exc:  # noqa: BLE001 - the first fetch meets it and reports it
            log.debug("warming the fetches of %s: %s", sorted(topics), exc)

    def _connect_leaders(self, topics: frozenset[str], deadline: float) -> None:
        self._know_topics(set(topics))
        cluster = self._client.cluster
        leaders = {
            cluster.leader_for_partition(TopicPartition(topic, partition))
            for topic in topics
            for partition in cluster.partitions_for_topic(topic) or ()
        } - {None, -1}
        for node in leaders:
            self._client.maybe_connect(node)  # every leader's connection starts at once
        for node in leaders:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._client.await_ready(node, timeout_ms=max(1, int(left * 1000)))

    def seed(self, topics: Iterable[str]) -> Seed | None:
        """What this fetcher knows of `topics`, for other clients of its cluster (the workers':
        relay.clients.seed); None if it does not know them all."""
        return seed_of(self._client, self._servers, topics)

    # ---- the wire -------------------------------------------------------------------------

    def _send_to(self, where: tuple[int, int], wanted: dict[TP, Wanted]) -> _OnTheWire:
        node, session = where[0], None
        if self._sessions is not None:
            session = self._sessions.setdefault(where, FetchSession())
            plan = session.next_fetch(wanted)
            wanted = session.partitions()
        else:
            plan = NextFetch(0, -1, wanted, [], True)
        offsets = {key: w[0] for key, w in wanted.items()}
        self._turn += 1
        # A lane found idle waits longer, answered as soon as any record comes (Apache Kafka;
        # Tansu within ~0.25 s): idle, 2 lanes at max_wait 30 ms cost a task ~0.025 cores.
        idle = self._lanes.idle(where)
        terms = self._idle_terms if idle else self._terms
        future = self._client.send(node, terms.request(plan, self._turn))
        return _OnTheWire(node, future, offsets, time.monotonic(), True, session)

    def _answers_of(self, wire: _OnTheWire) -> list[Answer]:
        node = self._address(wire.node)
        if not wire.future.succeeded():
            if wire.session is not None:
                wire.session.forget()
            error = wire.future.exception or kafka_errors.KafkaTimeoutError("no fetch response")
            if not wire.wanted:
                return []
            return [
                Answer(key, offset, _failed(error), node) for key, offset in wire.offsets.items()
            ]
        response = wire.future.value
        if wire.session is not None:
            code = getattr(response, "error_code", 0)
            wire.session.answered(code, getattr(response, "session_id", 0))
        if not wire.wanted:
            return []
        answers = []
        for key, fetched in self._parts(response):
            if key in wire.offsets:
                answers.append(Answer(key, wire.offsets[key], fetched, node))
        return answers

    def _parts(self, response: FetchResponse) -> Iterable[tuple[TP, Fetched]]:
        for topic in response.responses:
            for part in topic.partitions:
                key = (topic.topic, part.partition_index)
                error = None
                if part.error_code:
                    error = kafka_errors.for_code(part.error_code)(f"{key[0]}[{key[1]}]")
                    if isinstance(error, kafka_errors.InvalidMetadataError):
                        self._client.cluster.request_update()
                yield key, self._terms.fetched(part, error)

    def _know_topics(self, topics: set[str]) -> None:
        """Metadata for `topics`, asked for when missing and polled briefly: a partition
        whose leader is still unknown gets an error answer and is asked again later."""
        cluster = self._client.cluster
        if all(cluster.partitions_for_topic(topic) is not None for topic in topics):
            return
        future = cluster.set_topics(topics | set(cluster.topics()))
        self._client.poll(timeout_ms=_METADATA_WAIT_MS, future=future)

    def _leaders_of(
        self, positions: Mapping[TP, int], refused: list[Answer]
    ) -> dict[int, list[TP]]:
        """`positions`' partitions by leader, grouped again only when they or the metadata
        changed: an idle task of 5,000 partitions sends several times a second, and grouping
        them at each send was ~40% of its CPU (py-spy, Apache Kafka, 10,000 partitions)."""
        grouped = self._grouped
        if (
            grouped is not None
            and grouped.updates == self._metadata_updates
            and positions.keys() == grouped.keys
        ):
            return grouped.by_leader
        self._know_topics({topic for topic, _ in positions})
        updates = self._metadata_updates
        by_leader = self._by_leader(positions, refused)
        # a partition with no leader is asked again at the next send, so that is not kept
        self._grouped = None if refused else _Grouped(updates, frozenset(positions), by_leader)
        return by_leader

    def _count_update(self, _cluster: object) -> None:
        self._metadata_updates += 1  # any update may move leaders: the grouping is redone

    def _by_leader(self, positions: Mapping[TP, int], refused: list[Answer]) -> dict[int, list[TP]]:
        by_node: dict[int, list[TP]] = defaultdict(list)
        cluster = self._client.cluster
        for key in positions:
            leader = cluster.leader_for_partition(TopicPartition(*key))
            if leader is None or leader == -1:
                cluster.request_update()
                error = kafka_errors.LeaderNotAvailableError(str(key))
                refused.append(Answer(key, positions[key], _failed(error), NO_LEADER))
            else:
                by_node[leader].append(key)
        return by_node

    def _address(self, node: int) -> str:
        broker = self._client.cluster.broker_metadata(node)
        return f"{broker.host}:{broker.port}" if broker is not None else f"node {node}"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()


_METADATA_WAIT_MS = 1000  # metadata not there yet: the partitions are asked again next time
_LEADER_WAIT_MS = 200  # the same for a partition whose leader is unknown (one being elected)


def out_of_range(error: BaseException) -> bool:
    """A fetch outside the partition's log: records lost before they were read (relay.losses)."""
    return isinstance(error, kafka_errors.OffsetOutOfRangeError)


def _failed(error: BaseException) -> Fetched:
    return Fetched(b"", -1, -1, error)
