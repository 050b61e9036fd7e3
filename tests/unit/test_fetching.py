"""Fetches on the wire (relay.clients.batch_fetch) and incremental fetch sessions
(relay.clients.fetch_session), behind a stand-in for kafka-python's network client: one fetch
per broker at a time, late answers dropped, failed ones asked again, sessions kept small."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import errors as kafka_errors
from kafka.future import Future

from relay.clients.batch_fetch import BatchFetcher
from relay.clients.fetch_lanes import IDLE_AFTER, LIGHT_AFTER
from relay.clients.fetch_session import INVALID_FETCH_SESSION_EPOCH, FetchSession
from relay.config import ClusterConfig

T = "orders"


@dataclass
class FakeNet:
    """kafka-python's KafkaNetClient as BatchFetcher uses it: two brokers, topic `orders`
    with partitions 0 and 2 led by broker 1 and partition 1 by broker 2."""

    sent: list[tuple[int, Any, Future]] = field(default_factory=list)
    leaders: dict[tuple[str, int], int] = field(
        default_factory=lambda: {(T, 0): 1, (T, 1): 2, (T, 2): 1}
    )

    listeners: list[Any] = field(default_factory=list)
    leader_asked: int = 0  # calls of leader_for_partition

    @property
    def cluster(self) -> Any:
        return SimpleNamespace(
            partitions_for_topic=lambda topic: {0, 1, 2} if topic == T else None,
            topics=lambda: {T},
            set_topics=lambda topics: Future().success(None),
            leader_for_partition=self._leader,
            add_listener=self.listeners.append,
            request_update=lambda: None,
            broker_metadata=lambda node: SimpleNamespace(host=f"10.0.0.{node}", port=9092),
        )

    def _leader(self, tp: Any) -> int | None:
        self.leader_asked += 1
        return self.leaders.get((tp.topic, tp.partition))

    def move(self, key: tuple[str, int], leader: int) -> None:
        """A metadata update that moves a partition's leader."""
        self.leaders[key] = leader
        for listener in self.listeners:
            listener(self.cluster)

    def send(self, node: int, request: Any) -> Future:
        future = Future()
        self.sent.append((node, request, future))
        return future

    def poll(self, timeout_ms: int | None = None, future: Any = None) -> None:
        """Nothing arrives by itself: the test completes futures."""

    def close(self) -> None:
        pass

    connecting: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    refuse: set[int] = field(default_factory=set)  # nodes whose connection fails

    def maybe_connect(self, node: int) -> None:
        self.connecting.append(node)

    def await_ready(self, node: int, timeout_ms: int = 30000) -> bool:
        if node in self.refuse:
            raise kafka_errors.KafkaConnectionError(f"node {node} refused")
        self.ready.append(node)
        return True

    def to(self, node: int) -> list[Any]:
        return [request for n, request, _ in self.sent if n == node]

    def answer(
        self, index: int, data: dict[int, bytes], session_id: int = 0, error: int = 0,
        **part: Any,
    ):  # fmt: skip
        """`part`: more fields of every partition's answer (last_stable_offset, ...)."""
        _, request, future = self.sent[index]
        partitions = [
            SimpleNamespace(
                partition_index=p,
                error_code=0,
                high_watermark=100,
                log_start_offset=0,
                records=records,
                **part,
            )  # fmt: skip
            for p, records in data.items()
        ]
        response = SimpleNamespace(
            responses=[SimpleNamespace(topic=T, partitions=partitions)],
            error_code=error,
            session_id=session_id,
        )
        future.success(response)


def named(request: Any) -> dict[tuple[str, int], int]:
    return {
        (topic.topic, p.partition): p.fetch_offset
        for topic in request.topics
        for p in topic.partitions
    }


@pytest.fixture
def net() -> FakeNet:
    return FakeNet()


def fetcher(net: FakeNet, sessions: bool = False) -> BatchFetcher:
    return BatchFetcher(ClusterConfig("src", ("x:1",)), sessions=sessions, client=net)


def test_one_fetch_per_broker_is_on_the_wire_until_it_is_answered(net):
    f = fetcher(net)
    f.send({(T, 0): 5, (T, 1): 7, (T, 2): 9})
    f.send({(T, 0): 5, (T, 1): 7, (T, 2): 9})  # a later poll: both brokers still have one out
    assert [named(r) for r in net.to(1)] == [{(T, 0): 5, (T, 2): 9}]
    assert [named(r) for r in net.to(2)] == [{(T, 1): 7}]
    assert set(f.waiting_on()) == {"10.0.0.1:9092", "10.0.0.2:9092"}

    net.answer(1, {1: b""})  # broker 2 answers
    answers = f.receive(0.0)
    assert [(a.key, a.offset, a.node) for a in answers] == [((T, 1), 7, "10.0.0.2:9092")]
    f.send({(T, 0): 5, (T, 1): 7, (T, 2): 9})
    assert len(net.to(1)) == 1 and len(net.to(2)) == 2  # only the broker that answered


def test_a_lane_found_idle_waits_longer_until_a_record_comes(net):
    """After IDLE_AFTER answers in a row with no record, a fetch waits idle_wait and is answered
    at its first byte; the first answer with a record brings max_wait and min_bytes back."""
    cluster = ClusterConfig("src", ("x:1",))
    f = BatchFetcher(cluster, max_wait=0.03, min_bytes=65536, idle_wait=0.5, client=net)

    def round_trip(data: bytes) -> Any:
        f.send({(T, 0): 0})
        request = net.sent[-1][1]
        net.answer(len(net.sent) - 1, {0: data})
        f.receive(0.0)
        return request

    asked = [round_trip(b"") for _ in range(IDLE_AFTER)]
    assert {(r.max_wait_ms, r.min_bytes) for r in asked} == {(30, 65536)}
    idle = round_trip(b"")
    assert (idle.max_wait_ms, idle.min_bytes) == (500, 1)
    round_trip(b"a batch")
    again = round_trip(b"")
    assert (again.max_wait_ms, again.min_bytes) == (30, 65536)


def _answer_out(net: FakeNet, lane_bytes: int, only: int | None = None) -> None:
    """Answers every fetch still out (or only the one at index `only`) with `lane_bytes`
    bytes of records in all, spread over the partitions it names."""
    for index, (_, request, future) in enumerate(net.sent):
        if future.is_done or (only is not None and index != only):
            continue
        keys = named(request)
        net.answer(index, {p: b"x" * (lane_bytes // len(keys)) for _, p in keys})


def test_a_broker_answering_light_gets_one_fetch_until_an_answer_is_full():
    """Two lanes while answers are full; after LIGHT_AFTER light answers on each, one fetch
    names every partition of the broker; a full answer brings the two lanes back."""
    net = FakeNet(leaders={(T, 0): 1, (T, 1): 1})
    cluster = ClusterConfig("src", ("x:1",))
    f = BatchFetcher(cluster, min_bytes=100, lanes=2, client=net)
    positions = {(T, 0): 0, (T, 1): 0}
    f.send(positions)
    for _ in range(LIGHT_AFTER):
        assert sorted(len(named(r)) for r in net.to(1)[-2:]) == [1, 1]  # two lanes
        _answer_out(net, 10)
        f.receive(0.0)
        f.send(positions)
    assert named(net.to(1)[-1]) == positions  # one fetch for both
    _answer_out(net, 100)  # a full answer
    f.receive(0.0)
    f.send(positions)
    assert [named(r) for r in net.to(1)[-2:]] == [{(T, 0): 0}, {(T, 1): 0}]


def test_lanes_change_only_once_none_of_the_brokers_fetches_is_out():
    """A partition is never in two fetches at once: the merged fetch waits for the lane
    still out."""
    net = FakeNet(leaders={(T, 0): 1, (T, 1): 1})
    cluster = ClusterConfig("src", ("x:1",))
    f = BatchFetcher(cluster, min_bytes=100, lanes=2, client=net)
    positions = {(T, 0): 0, (T, 1): 0}
    f.send(positions)
    for _ in range(LIGHT_AFTER - 1):
        _answer_out(net, 10)
        f.receive(0.0)
        f.send(positions)
    lane_0 = len(net.sent) - 2
    _answer_out(net, 10, only=lane_0 + 1)  # lane 1's third light answer; it is sent again
    f.receive(0.0)
    f.send(positions)
    _answer_out(net, 10, only=lane_0)  # lane 0's third: the broker is light
    f.receive(0.0)
    f.send(positions)
    assert len(net.sent) == lane_0 + 3  # lane 1 still out: nothing sent
    _answer_out(net, 10)
    f.receive(0.0)
    f.send(positions)
    assert len(net.sent) == lane_0 + 4 and named(net.sent[-1][1]) == positions


def test_a_reader_of_many_partitions_takes_lanes_in_turn_with_two_fetches_out():
    """Seven partitions in lanes of three at most: three lanes, two fetches on the wire to the
    broker at a time (it serves them one after the other), the lane left out sent first when
    one is answered; no partition is in two fetches, and the lanes stay when some partitions
    leave (they reached their end) while the answers are full."""
    net = FakeNet(leaders={(T, p): 1 for p in range(7)})
    cluster = ClusterConfig("src", ("x:1",))
    f = BatchFetcher(cluster, lanes=2, lane_partitions=3, client=net)
    positions = {(T, p): 0 for p in range(7)}
    f.send(positions)
    assert [sorted(named(r)) for r in net.to(1)] == [
        [(T, 0), (T, 3), (T, 6)],
        [(T, 1), (T, 4)],
    ]
    assert f.busy()  # two out: the third lane waits, and a send would send nothing
    f.send(positions)
    assert len(net.sent) == 2

    net.answer(0, {0: b"x", 3: b"x", 6: b"x"})
    f.receive(0.0)
    assert not f.busy()
    f.send(positions)
    assert sorted(named(net.sent[-1][1])) == [(T, 2), (T, 5)]  # the lane left out goes first
    net.answer(1, {1: b"x", 4: b"x"})
    f.receive(0.0)
    f.send(positions)
    assert sorted(named(net.sent[-1][1])) == [(T, 0), (T, 3), (T, 6)]  # then round again
    assert len(net.sent) == 4

    _answer_out(net, 300)
    f.receive(0.0)
    f.send({(T, p): 0 for p in (0, 1, 2)})  # the others reached their end: same lanes
    assert [sorted(named(r)) for r in net.to(1)[-2:]] == [[(T, 1)], [(T, 2)]]


def test_without_a_lane_size_every_lane_has_its_fetch_out():
    """The start-up's one-shot fetchers and the small readers: `lanes` lanes, each on the
    wire, however many partitions."""
    net = FakeNet(leaders={(T, p): 1 for p in range(7)})
    f = BatchFetcher(ClusterConfig("src", ("x:1",)), lanes=2, client=net)
    f.send({(T, p): 0 for p in range(7)})
    assert sorted(len(named(r)) for r in net.to(1)) == [3, 4]


def test_receive_waits_no_longer_than_asked_and_returns_nothing_when_none_answered(net):
    f = fetcher(net)
    f.send({(T, 0): 0})
    assert f.receive(0.01) == []
    assert f.waiting_on()  # still out, still waited for


def test_an_answer_that_comes_after_abandon_is_dropped(net):
    f = fetcher(net)
    f.send({(T, 0): 5})
    f.abandon()  # the task stopped, or the positions moved
    f.send({(T, 0): 50})  # the broker still has one out: no second fetch yet
    assert len(net.to(1)) == 1
    net.answer(0, {0: b"late"})
    assert f.receive(0.0) == []
    f.send({(T, 0): 50})
    assert [named(r) for r in net.to(1)] == [{(T, 0): 5}, {(T, 0): 50}]


def test_a_failed_fetch_answers_every_partition_with_its_error_and_is_sent_again(net):
    f = fetcher(net)
    f.send({(T, 0): 5, (T, 2): 9})
    net.sent[0][2].failure(kafka_errors.RequestTimedOutError("after 30000 ms"))
    answers = f.receive(0.0)
    assert {(a.key, a.offset) for a in answers} == {((T, 0), 5), ((T, 2), 9)}
    assert all(isinstance(a.fetched.error, kafka_errors.RequestTimedOutError) for a in answers)
    f.send({(T, 0): 5, (T, 2): 9})
    assert [named(r) for r in net.to(1)] == [{(T, 0): 5, (T, 2): 9}] * 2


def test_a_partition_without_a_leader_is_answered_at_once_and_not_sent(net):
    net.leaders[(T, 2)] = -1
    f = fetcher(net)
    refused = f.send({(T, 0): 5, (T, 2): 9})
    assert [(a.key, type(a.fetched.error)) for a in refused] == [
        ((T, 2), kafka_errors.LeaderNotAvailableError)
    ]
    assert [named(r) for r in net.to(1)] == [{(T, 0): 5}]


def test_a_partition_without_a_known_leader_and_nothing_on_the_wire_polls_for_metadata(net):
    """A partition added while running: no fetch on the wire would ever poll the client, so
    the metadata update asked for its leader is polled for at once; the partition is sent once
    its leader is known."""
    polled: list[Any] = []
    net.poll = lambda timeout_ms=None, future=None: polled.append(timeout_ms)
    net.leaders[(T, 2)] = -1
    f = fetcher(net)
    assert [a.key for a in f.send({(T, 2): 0})] == [(T, 2)] and polled == [200]
    assert [a.key for a in f.send({(T, 0): 5, (T, 2): 0})] == [(T, 2)] and polled == [200]
    net.leaders[(T, 2)] = 1
    net.answer(0, {0: b""})
    f.receive(0.01)
    assert f.send({(T, 2): 0}) == [] and [named(r) for r in net.to(1)][-1] == {(T, 2): 0}


def test_the_partitions_are_grouped_by_leader_again_only_when_they_or_the_metadata_change(net):
    """An idle task of thousands of partitions sends several times a second: their leaders
    are looked up once, and again after a metadata update or a change of partitions."""
    f = fetcher(net)
    positions = {(T, 0): 5, (T, 1): 7, (T, 2): 9}
    f.send(positions)
    for index in range(2):
        net.answer(index, {})
    f.receive(0.0)
    asked = net.leader_asked
    f.send(positions)
    assert net.leader_asked == asked and len(net.sent) == 4  # both brokers asked, no look-up

    net.move((T, 1), 1)  # partition 1 now led by broker 1
    for index in (2, 3):
        net.answer(index, {})
    f.receive(0.0)
    f.send(positions)
    assert net.leader_asked == asked + 3
    assert [named(r) for r in net.to(1)][-1] == positions and len(net.to(2)) == 2

    net.answer(4, {})
    f.receive(0.0)
    f.send({(T, 0): 6})  # partitions 1 and 2 reached their stops
    assert net.leader_asked == asked + 4 and named(net.to(1)[-1]) == {(T, 0): 6}


def test_fetch_waits_for_its_answers_and_times_out_the_rest(net):
    f = fetcher(net)
    found = f.fetch({(T, 0): 1, (T, 1): 2}, timeout=0.05)
    assert all(isinstance(v.error, kafka_errors.KafkaTimeoutError) for v in found.values())
    net.answer(0, {0: b""})  # late: dropped, the broker is free again afterwards
    assert f.receive(0.0) == []


def test_read_committed_asks_for_it_and_answers_the_stable_end_and_the_aborted(net):
    """A source at [source_pool].isolation_level = "read_committed": the request says so, and
    an answer's end is its last stable offset, with the aborted transactions it lists."""
    f = BatchFetcher(ClusterConfig("src", ("x:1",), isolation_level="read_committed"), client=net)
    f.send({(T, 1): 7})
    aborted = [SimpleNamespace(producer_id=41, first_offset=60)]
    net.answer(0, {1: b""}, last_stable_offset=80, aborted_transactions=aborted)

    (answer,) = f.receive(0.0)

    assert net.to(2)[0].isolation_level == 1
    assert (answer.fetched.high_watermark, answer.fetched.end) == (100, 80)
    assert answer.fetched.aborted == ((41, 60),)

    plain = fetcher(net)  # read_uncommitted: the high watermark, nothing listed
    plain.send({(T, 0): 7})
    net.answer(1, {0: b""}, last_stable_offset=80, aborted_transactions=None)
    (answer,) = plain.receive(0.0)
    assert net.to(1)[0].isolation_level == 0
    assert (answer.fetched.end, answer.fetched.aborted) == (100, ())


def test_a_fetch_names_the_last_fetched_epoch_and_reads_where_the_leader_diverges(net):
    """Fetch v12's LastFetchedEpoch, as a follower sends it: a leader elected uncleanly answers
    where its log parts from the one read (DivergingEpoch); -1 where it does not say."""
    f = fetcher(net, sessions=True)
    f.send({(T, 0): 150, (T, 2): 9}, {(T, 0): 3})
    epochs = {p.partition: p.last_fetched_epoch for t in net.to(1)[0].topics for p in t.partitions}
    assert epochs == {0: 3, 2: -1}
    net.answer(0, {0: b""}, session_id=5, diverging_epoch=SimpleNamespace(epoch=3, end_offset=100))
    (answer,) = f.receive(0.0)
    assert (answer.key, answer.offset, answer.fetched.diverged) == ((T, 0), 150, 100)

    f.send({(T, 0): 150, (T, 2): 9}, {(T, 0): 4})  # a new epoch alone is named again
    assert named(net.to(1)[1]) == {(T, 0): 150}
    net.answer(1, {0: b"", 2: b""}, session_id=5,
               diverging_epoch=SimpleNamespace(epoch=-1, end_offset=-1))  # fmt: skip
    assert [a.fetched.diverged for a in f.receive(0.0)] == [-1, -1]
    f.send({(T, 0): 151, (T, 2): 9}, {(T, 0): 4})
    net.answer(2, {0: b""}, session_id=5)  # Fetch v11 and older: no diverging epoch at all
    assert [a.fetched.diverged for a in f.receive(0.0)] == [-1]


def test_a_session_names_only_what_changed_after_the_broker_created_it(net):
    f = fetcher(net, sessions=True)
    f.send({(T, 0): 5, (T, 2): 9})
    first = net.to(1)[0]
    assert (first.session_id, first.session_epoch, named(first)) == (0, 0, {(T, 0): 5, (T, 2): 9})
    net.answer(0, {0: b"", 2: b""}, session_id=77)
    f.receive(0.0)
    f.send({(T, 0): 6, (T, 2): 9})  # partition 0 moved on, 2 did not
    second = net.to(1)[1]
    assert (second.session_id, second.session_epoch, named(second)) == (77, 1, {(T, 0): 6})
    net.answer(1, {}, session_id=77)  # nothing new: the answer names no partition
    assert f.receive(0.0) == []
    f.send({(T, 0): 6})  # partition 2 paused: forgotten
    third = net.to(1)[2]
    assert (third.session_epoch, named(third)) == (2, {})
    assert [(t.topic, list(t.partitions)) for t in third.forgotten_topics_data] == [(T, [2])]


def test_a_broker_without_sessions_gets_full_fetches():
    session = FetchSession()
    wanted = {(T, 0): (5, 1024, -1)}
    assert session.next_fetch(wanted).full
    session.answered(0, 0)  # no session created (Tansu, or a full cache)
    again = session.next_fetch(wanted)
    assert (again.full, again.session_id, again.epoch, again.send) == (True, 0, 0, wanted)


def test_a_session_error_or_a_failed_fetch_starts_over_with_a_full_fetch():
    session = FetchSession()
    session.next_fetch({(T, 0): (5, 1024, -1)})
    session.answered(0, 9)
    assert not session.next_fetch({(T, 0): (6, 1024, -1)}).full
    session.answered(INVALID_FETCH_SESSION_EPOCH, 9)
    assert session.next_fetch({(T, 0): (6, 1024, -1)}).full
    session.answered(0, 10)
    assert session.next_fetch({(T, 0): (7, 1024, -1)}).session_id == 10
    session.forget()  # the request failed: what the broker holds is unknown
    assert session.next_fetch({(T, 0): (7, 1024, -1)}).send == {(T, 0): (7, 1024, -1)}


def test_warming_connects_every_leader_of_the_topics_and_sends_no_fetch(net):
    fetcher(net).warm(frozenset({T}), 5.0)
    assert sorted(net.connecting) == [1, 2] and sorted(net.ready) == [1, 2]
    assert net.sent == []  # the first fetch is the task's


def test_warming_never_raises_and_the_first_fetch_still_goes_out(net):
    net.refuse = {1}
    batches = fetcher(net)
    batches.warm(frozenset({T}), 5.0)  # node 1 refused: the warm-up gives up quietly
    batches.send({(T, 0): 0, (T, 1): 0})
    assert sorted(node for node, _, _ in net.sent) == [1, 2]
