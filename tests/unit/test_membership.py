"""A rejoin (partitions found while running) must end in an assignment, or fail loudly."""

from __future__ import annotations

import json
import logging
import time

import pytest

from relay.clients.members import Assignment, KtmAssignor
from relay.config import ClusterConfig
from relay.engine.driver.membership import Membership
from relay.engine.metrics import Metrics
from relay.errors import KafkaSetupError


def test_a_rejoin_without_an_assignment_in_time_fails_naming_the_group():
    membership = Membership(ClusterConfig("target", ("t:1",)), "ktm.relay", ["d"], [("t", 0)],
                            2.0, Metrics())  # fmt: skip
    assert membership.current() is None  # rebalancing, no deadline: wait
    membership._rejoin_deadline = time.monotonic() - 1  # a rejoin that never completed
    with pytest.raises(KafkaSetupError, match=r"group ktm.relay on .*: no assignment within 18s"):
        membership.current()


class Member:
    def __init__(self, answered_at: float):
        self.answered_at = answered_at

    def last_heartbeat(self) -> float:
        return self.answered_at


def test_a_lapsed_right_to_write_says_why_once(caplog):
    membership = Membership(ClusterConfig("target", ("t:1",)), "ktm.relay", ["d"], [("t", 0)],
                            6.0, Metrics())  # fmt: skip
    now = time.monotonic()
    membership._assignment = Assignment(1, frozenset({("t", 0)}), 1)
    membership._member, membership._last_poll = Member(now), now
    assert membership.may_write()
    membership._member = Member(now - 4)  # half a session: 3 s
    with caplog.at_level(logging.WARNING, logger="relay.engine.driver.membership"):
        assert not membership.may_write()
        assert not membership.may_write()
    (warning,) = caplog.records
    assert warning.getMessage().startswith(
        "group ktm.relay: tasks' leases are not renewed: no heartbeat answered for 4."
    )
    membership._member = Member(time.monotonic())
    membership._last_poll = time.monotonic()
    assert membership.may_write()  # answered again: the next lapse is told again
    membership._last_poll = time.monotonic() - 3  # the poll loop stuck for more than 2 s
    assert not membership.may_write()
    assert "its poll loop has not run for 3." in caplog.records[-1].getMessage()


def test_a_member_standing_by_for_a_plan_it_changed_since_it_joined_joins_again():
    """Partitions found while a rebalance was out: the join carried the old plan, so the leader
    put this member on standby; the member must join again with its new one, not stand by for
    good (seen once in CI: two processes, a topic grown, one relaying all four partitions)."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    assigned: list[Assignment] = []
    assignor = KtmAssignor([("t", 0), ("t", 1)], assigned.append)

    def standby(value: bool) -> ConsumerProtocolAssignment:
        data = json.dumps({"keys": [], "members": 2, "standby": value}).encode()
        return ConsumerProtocolAssignment(0, [], data)

    assignor.metadata(["d"])  # the join goes out with two partitions
    assignor.update([("t", 0), ("t", 1), ("t", 2), ("t", 3)])  # then two more are found
    assignor.on_assignment(standby(True), 3)
    assert assignor.stale and assigned[-1].standby
    assignor.metadata(["d"])  # the next join carries the new plan
    assignor.on_assignment(standby(True), 4)
    assert not assignor.stale  # standing by for the leader's plan to change, not ours
    assignor.on_assignment(standby(False), 5)
    assert not assignor.stale


class Refusing:
    """A member whose coordinator is restarting: its polls fail `times` times, then pass."""

    def __init__(self, times: int, error: Exception):
        self.left, self.error, self.polls = times, error, 0

    def poll(self, timeout: float) -> None:
        self.polls += 1
        if self.left:
            self.left -= 1
            raise self.error


def test_a_coordinator_that_refuses_connections_for_a_while_is_polled_again(caplog):
    """Seen in CI (3-node Kafka, the busiest node restarted): one ECONNREFUSED out of the
    membership consumer's poll ended the relay."""
    from kafka.errors import KafkaConnectionError

    membership = Membership(ClusterConfig("target", ("t:1",)), "ktm.relay", ["d"], [("t", 0)],
                            6.0, Metrics())  # fmt: skip
    member = Refusing(3, KafkaConnectionError("111 ECONNREFUSED"))
    with caplog.at_level(logging.INFO, logger="relay.engine.driver.membership"):
        for _ in range(4):
            membership._poll(member)
    assert member.polls == 4 and membership._troubled_since is None
    said = [record.getMessage() for record in caplog.records]
    assert said == ["group ktm.relay: KafkaConnectionError: 111 ECONNREFUSED; polling again",
                    "group ktm.relay: the coordinator answers again"]  # fmt: skip
    membership._troubled_since = time.monotonic() - 35  # past the join limit (4 x 6 + 10 s)
    with pytest.raises(KafkaConnectionError):
        membership._poll(Refusing(1, KafkaConnectionError("111 ECONNREFUSED")))
    with pytest.raises(ValueError):  # not retriable: at once
        Membership(ClusterConfig("target", ("t:1",)), "g", ["d"], [("t", 0)], 6.0,
                   Metrics())._poll(Refusing(1, ValueError("bad")))  # fmt: skip
