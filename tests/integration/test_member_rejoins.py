"""A ktm process's group membership (relay.clients.members) on a real broker, when its thread
runs late, as on a loaded 2-core machine.

Seen in CI: the destination topic the membership subscribes to grew; the group leader rejoined
for it; stopping the round spent the poll's time, so the join was sent and left; it ended before
the next poll looked, and kafka-python dropped its outcome for good (the leader's own assignment
had cleared the need to rejoin). The process never got its assignment back and copied nothing
more for the minute the test waited.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions

from relay.clients.members import Assignment, Member
from relay.config import ClusterConfig
from testbed.topics import create_topic, unique_topic

# Apache Kafka alone: Tansu has no CreatePartitions
pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("kafka")]

POLL = 0.2  # the membership thread's poll (relay.engine.driver.membership.POLL_EVERY)
LATE = 1.0  # seconds the thread runs late after each poll
REVOKE = 0.5  # seconds a round takes to stop: longer than a poll


def test_a_late_member_takes_up_the_join_its_grown_topic_asked_for(source_broker):
    bootstrap = source_broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("members"), 1)
    assignments: list[Assignment] = []
    revoked: list[int] = []  # the generation each revoke came in
    late: list[float] = [0.0]  # seconds the thread runs late, from the new partition's assignment

    def revoke() -> None:
        revoked.append(assignments[-1].generation if assignments else 0)
        time.sleep(late[0] and REVOKE)  # a round takes this long to stop

    def assigned(assignment: Assignment) -> None:
        assignments.append(assignment)
        if len(assignment.keys) == 2:
            late[0] = LATE

    member = Member(ClusterConfig("target", (bootstrap,)), unique_topic("members-group"),
                    [topic], [("src", 0)], 6.0, revoke, assigned)  # fmt: skip
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        poll_until(member, late, lambda: bool(assignments), "first assignment")
        admin.create_partitions({topic: NewPartitions(total_count=2)})
        # the runner found a new source partition: the member rejoins with it. As the group's
        # leader it assigned under its metadata from before the growth, and asked for new
        # metadata: once that shows the growth, kafka-python rejoins once more.
        member.replan([topic], [("src", 0), ("src", 1)])
        poll_until(member, late, lambda: late[0] > 0, "assignment of the new partition")
        grown = next(a.generation for a in assignments if len(a.keys) == 2)
        poll_until(member, late, lambda: any(g >= grown for g in revoked), "rejoin for the growth")
        poll_until(member, late, lambda: assignments[-1].generation > grown, "assignment after it")
        assert assignments[-1].keys == frozenset({("src", 0), ("src", 1)})
        for _ in range(3):  # and it stays in the group: its heartbeats are answered
            member.poll(POLL)
            time.sleep(LATE)
        assert time.monotonic() - member.last_heartbeat() < 3.0
    finally:
        member.close()
        admin.close()


def poll_until(member: Member, late: list[float], done, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        member.poll(POLL)
        time.sleep(late[0])
