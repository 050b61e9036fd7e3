"""The progress line's word on source brokers the tasks cannot fetch from
(relay.engine.driver.fetch_trouble)."""

from __future__ import annotations

from relay.clients.batch_fetch import NO_LEADER
from relay.engine.driver.fetch_trouble import FAILING_FRESH, WINDOW, FetchTroubles
from relay.engine.metrics import Metrics
from relay.spec import FetchTrouble
from tests.support.clock import Clock


def test_a_broker_is_waited_for_while_its_fetches_fail_and_not_once_they_stopped_failing():
    clock = Clock()
    troubles = FetchTroubles(Metrics(), clock)
    refused = "KafkaConnectionError: 111 ECONNREFUSED"
    for _ in range(5):  # a report a second while the broker refuses
        troubles.note([FetchTrouble("b1:9092", 2, refused, 0.0)])
        clock.now += 1.0
    assert troubles.lines() == [
        f"waiting for b1:9092: 10 fetches failed in the last 60 s ({refused})"
    ]
    clock.now += FAILING_FRESH - 1.5  # no failure since: still said, a report may be late
    assert len(troubles.lines()) == 1
    clock.now += 1.0
    assert troubles.lines() == []  # fetching again: nothing is waited for
    troubles.note([FetchTrouble("b1:9092", 1, refused, 0.0)])  # it fails again
    assert troubles.lines() == [
        f"waiting for b1:9092: 11 fetches failed in the last 60 s ({refused})"
    ]
    clock.now += WINDOW + 1
    troubles.note([FetchTrouble("b1:9092", 1, refused, 0.0)])
    assert troubles.lines() == [
        f"waiting for b1:9092: 1 fetches failed in the last 60 s ({refused})"
    ]


def test_a_new_partition_without_a_leader_yet_is_named_as_such_and_not_for_a_minute():
    clock = Clock()
    troubles = FetchTroubles(Metrics(), clock)
    error = "LeaderNotAvailableError: [Error 5] LeaderNotAvailableError: ('orders', 3)"
    troubles.note([FetchTrouble(NO_LEADER, 4, error, 0.0)])
    assert troubles.lines() == [
        f"waiting for (no leader): 4 fetches failed in the last 60 s ({error})"
    ]
    clock.now += FAILING_FRESH + 0.1  # its leader came: the next fetches brought records
    assert troubles.lines() == []


def test_a_fetch_out_for_long_is_waited_for_without_failures():
    clock = Clock()
    troubles = FetchTroubles(Metrics(), clock)
    troubles.note([FetchTrouble("b2:9092", 0, "", 7.0)])
    assert troubles.lines() == ["waiting for b2:9092: a fetch has been out for 7 s"]
