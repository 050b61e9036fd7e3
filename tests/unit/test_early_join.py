"""A process joins its group before it knows its partitions (the broker holds a new group's
first join ~3 s; the partition counts come meanwhile): what it owns, and when it joins again
(relay.clients.members, PENDING)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from relay.clients.members import PENDING, Assignment, KtmAssignor

KEYS = [("t", 0), ("t", 1), ("t", 2), ("t", 3)]


@dataclass
class Joining:
    member_id: str
    metadata: ConsumerProtocolSubscription


def joined(assignor: KtmAssignor, member_id: str) -> Joining:
    """The member as its group's leader sees it: the subscription its join carried."""
    sent = assignor.metadata(["d"])
    return Joining(member_id, ConsumerProtocolSubscription.decode(sent.encode()))


def keys_of(assignment: ConsumerProtocolAssignment) -> set[tuple[str, int]]:
    return {(t, p) for t, p in json.loads(assignment.user_data)["keys"]}


def test_a_lone_member_that_learns_its_partitions_while_its_join_is_held_owns_them_all():
    got: list[Assignment] = []
    alone = KtmAssignor(None, got.append)
    me = joined(alone, "m1")  # the join carries no plan yet
    alone.update(KEYS)  # the counts came while the broker held the join
    result = alone.assign(None, [me])  # the assignor reads no cluster metadata
    alone.on_assignment(result["m1"], 1)

    assert got[-1].settled and not got[-1].standby and got[-1].keys == frozenset(KEYS)
    assert not alone.stale  # no second rebalance


def test_a_leader_that_assigned_before_knowing_its_partitions_owns_nothing_and_joins_again():
    got: list[Assignment] = []
    leader = KtmAssignor(None, got.append)
    result = leader.assign(None, [joined(leader, "m1")])
    leader.on_assignment(result["m1"], 1)
    assert not got[-1].settled and not leader.stale  # still nothing to own: it waits

    leader.update(KEYS)
    assert leader.stale  # now it knows: a join with its plan
    result = leader.assign(None, [joined(leader, "m1")])
    leader.on_assignment(result["m1"], 2)
    assert got[-1].settled and got[-1].keys == frozenset(KEYS) and not leader.stale


def test_a_member_given_a_pending_leaders_assignment_waits_for_the_leader_to_join_again():
    """Not a rejoin of its own each time: that would rebalance again and again while the
    leader still counts its partitions."""
    leader_got: list[Assignment] = []
    other_got: list[Assignment] = []
    leader, other = KtmAssignor(None, leader_got.append), KtmAssignor(KEYS, other_got.append)
    members = [joined(leader, "m1"), joined(other, "m2")]
    result = leader.assign(None, members)
    leader.on_assignment(result["m1"], 1)
    other.on_assignment(result["m2"], 1)

    assert json.loads(result["m2"].user_data)["plan"] == PENDING
    assert not other_got[-1].settled and not other.stale
    assert not leader_got[-1].settled and not leader.stale


def test_a_member_whose_join_carried_no_plan_stands_by_for_a_leader_that_has_one():
    """Another process's early join reaching a leader that knows its partitions: it gets
    nothing until it joins again with its own plan (then the leader shares)."""
    got: list[Assignment] = []
    leader, late = KtmAssignor(KEYS, lambda _: None), KtmAssignor(None, got.append)
    members = [joined(leader, "m1"), joined(late, "m2")]
    result = leader.assign(None, members)
    assert keys_of(result["m1"]) == set(KEYS) and keys_of(result["m2"]) == set()
    late.on_assignment(result["m2"], 1)
    assert not got[-1].settled and not late.stale  # its own partitions are still unknown

    late.update(KEYS)
    assert late.stale  # its join carried no plan: it joins again
    members = [joined(leader, "m1"), joined(late, "m2")]
    result = leader.assign(None, members)
    late.on_assignment(result["m2"], 2)
    assert got[-1].settled and len(got[-1].keys) == 2


def test_a_member_of_another_config_still_stands_by_for_good():
    got: list[Assignment] = []
    leader, other = KtmAssignor(KEYS, lambda _: None), KtmAssignor(KEYS[:2], got.append)
    result = leader.assign(None, [joined(leader, "m1"), joined(other, "m2")])
    other.on_assignment(result["m2"], 1)

    assert got[-1].standby and got[-1].settled and not other.stale
