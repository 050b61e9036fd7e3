"""Source topics deleted and created again (relay.pipelines.recreated): a changed topic ID is
said once per topic, per node, at most once per interval."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from relay.config import ClusterConfig
from relay.pipelines.recreated import RecreatedTopics
from relay.pipelines.spacing import SPACED_PAST

DC1, DC2 = ClusterConfig("dc1", ("a:1",)), ClusterConfig("dc2", ("b:1",))


def at_once(look: Callable[[], None]) -> None:
    """Looks run in the caller (in ktm, on a thread of their own)."""
    look()


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_changed_topic_id_is_said_once_and_each_node_has_ids_of_its_own() -> None:
    ids = {"dc1": {"orders": "id-1", "audit": "id-a"}, "dc2": {"orders": "id-9"}}
    asked: list[str] = []

    def read(node: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
        asked.append(node.name)
        return {t: ids[node.name][t] for t in topics if t in ids[node.name]}

    clock = Clock()
    watch = RecreatedTopics(3.0, 2.0, read, clock, at_once)
    assert watch.check(DC1, ["orders", "audit"]) == []
    assert watch.check(DC2, ["orders"]) == [] and asked == ["dc1"]  # within the interval
    clock.now = 3.0
    assert watch.check(DC2, ["orders"]) == []  # another cluster of the pool: its own IDs
    ids["dc1"]["orders"] = "id-2"
    clock.now = 6.0
    ((topic, line),) = watch.check(DC1, ["orders", "audit"])
    assert topic == "orders"
    assert "source topic orders on dc1 was deleted and created again: its topic ID was id-1, " \
           "now id-2" in line  # fmt: skip
    clock.now = 9.0
    assert watch.check(DC1, ["orders", "audit"]) == []  # said once


def test_a_node_that_does_not_answer_is_asked_again_at_the_next_interval() -> None:
    def read(node: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
        raise ConnectionError("down")

    assert RecreatedTopics(3.0, 2.0, read, Clock(), at_once).check(DC1, ["orders"]) == []


def test_looks_at_many_partitions_are_spaced_in_proportion() -> None:
    """A look decodes every partition of the topics: beyond SPACED_PAST the interval
    stretches (10,000 partitions: every 5 intervals), and the topics are read only for a look."""
    asked: list[float] = []
    clock = Clock()

    def read(node: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
        asked.append(clock.now)
        return {"orders": "id-1"}

    def topics() -> Iterable[str]:
        read_topics.append(clock.now)
        yield from ["orders", "orders"]

    read_topics: list[float] = []
    watch = RecreatedTopics(3.0, 2.0, read, clock, at_once)
    for clock.now in (0.0, 3.0, 14.0, 15.0, 18.0):
        watch.check(DC1, topics(), partitions=5 * SPACED_PAST)
    assert asked == read_topics == [0.0, 15.0]
    for clock.now in (30.0, 33.0):
        watch.check(DC1, topics(), partitions=SPACED_PAST)  # fewer: the interval itself
    assert asked == [0.0, 15.0, 30.0, 33.0]


def test_a_look_that_hangs_never_holds_the_caller_and_reports_when_it_ends() -> None:
    """A frozen source answers nothing until the request timeout: the runner's loop (and a
    stop asked meanwhile) must not wait for it."""
    answer = threading.Event()
    ids = {"orders": "id-1"}

    def read(node: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
        answer.wait(10)
        return dict(ids)

    clock = Clock()
    watch = RecreatedTopics(3.0, 2.0, read, clock)
    began = time.monotonic()
    assert watch.check(DC1, ["orders"]) == []
    answer.set()
    wait_for_look(watch)
    ids["orders"], clock.now = "id-2", 3.0
    answer.clear()
    assert watch.check(DC1, ["orders"]) == []  # the look is out, not yet answered
    assert time.monotonic() - began < 1.0
    answer.set()
    wait_for_look(watch)
    ((topic, _),) = watch.check(DC1, ["orders"])  # what the ended look found
    assert topic == "orders"
    watch.close()


def wait_for_look(watch: RecreatedTopics) -> None:
    look = watch._look
    assert look is not None
    look.join(5)
    assert not look.is_alive()


def test_a_look_that_ends_after_a_failover_halts_nothing_on_the_new_node() -> None:
    """The look was sent to the node ktm relayed from then; what it found of that node (here:
    it came back empty and its topic was created anew) is not said of the node ktm moved to."""
    ids = {"dc1": {"orders": "id-1"}, "dc2": {"orders": "id-9"}}
    looks: list[Callable[[], None]] = []

    def read(node: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
        return dict(ids[node.name])

    clock = Clock()
    watch = RecreatedTopics(3.0, 2.0, read, clock, looks.append)
    assert watch.check(DC1, ["orders"]) == []
    looks.pop()()
    ids["dc1"]["orders"], clock.now = "id-2", 3.0
    assert watch.check(DC1, ["orders"]) == []  # a look goes out to dc1...
    looks.pop()()  # ...and ends once ktm failed over to dc2
    assert watch.check(DC2, ["orders"]) == []
    ((topic, line),) = watch.check(DC1, ["orders"])  # were ktm to go back to dc1
    assert topic == "orders" and "on dc1" in line
