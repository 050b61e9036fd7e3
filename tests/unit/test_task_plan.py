"""The task plan: partitions spread over tasks by expected work, sticky, complete; re-planned
only when it pays."""

from __future__ import annotations

from dataclasses import replace

from relay.engine.driver.rows import PartitionRow
from relay.engine.driver.task_plan import (
    Load,
    busiest,
    load_of,
    plan_tasks,
    task_index,
    worth_replanning,
)
from relay.spec import PartitionRoute


def loads(*backlogs: int, topic: str = "t") -> list[Load]:
    return [Load((topic, p), backlog) for p, backlog in enumerate(backlogs)]


def test_every_partition_lands_in_exactly_one_group_and_no_more_groups_than_slots() -> None:
    planned = plan_tasks(loads(*[10] * 256), slots=2)
    assert len(planned) == 2
    keys = [key for group in planned for key in group]
    assert sorted(keys) == [("t", p) for p in range(256)]
    assert {len(group) for group in planned} == {128}


def test_fewer_partitions_than_slots_gives_one_group_each() -> None:
    planned = plan_tasks(loads(5, 7), slots=8)
    assert sorted(planned) == [(("t", 0),), (("t", 1),)]
    assert plan_tasks([], slots=4) == []


def test_groups_balance_backlog_not_partition_counts() -> None:
    # One heavy partition and six light ones: the heavy one gets a slot to itself.
    planned = plan_tasks(loads(6000, 1000, 1000, 1000, 1000, 1000, 1000), slots=2)
    assert (("t", 0),) in planned
    by_key = {load.key: load for load in loads(6000, 1000, 1000, 1000, 1000, 1000, 1000)}
    assert busiest(planned, by_key) == 6 * 1001  # the six light ones: each weighs backlog + 1


def test_idle_partitions_spread_by_count() -> None:
    planned = plan_tasks(loads(*[0] * 9), slots=3)
    assert sorted(len(group) for group in planned) == [3, 3, 3]


def test_partitions_stay_in_their_previous_group_when_balance_allows() -> None:
    first = plan_tasks(loads(*[100] * 8), slots=2)
    # Backlogs shifted a little: nothing worth moving, so every partition keeps its group.
    again = plan_tasks(loads(110, 90, 100, 105, 95, 100, 100, 100), 2, task_index(first))
    assert task_index(again) == task_index(first)


def test_a_partition_leaves_its_group_when_staying_would_unbalance() -> None:
    previous = {("t", p): 0 for p in range(4)}  # all were in group 0
    planned = plan_tasks(loads(1000, 1000, 1000, 1000), slots=2, previous=previous)
    assert sorted(len(group) for group in planned) == [2, 2]


def test_replanning_pays_when_a_slot_idles_beside_a_large_backlog() -> None:
    by_key = {load.key: load for load in loads(100_000, 100_000, 0, 0)}
    # Task 1's partitions are done (removed): its slot idles while task 0 has 200k to go.
    current = [(("t", 0), ("t", 1)), ()]
    assert worth_replanning(current, by_key, slots=2, rate_per_task=10_000)


def test_replanning_does_not_pay_for_a_small_remainder_or_a_balanced_plan() -> None:
    small = {load.key: load for load in loads(2_000, 2_000)}
    assert not worth_replanning([(("t", 0), ("t", 1)), ()], small, 2, rate_per_task=10_000)
    even = {load.key: load for load in loads(50_000, 50_000)}
    assert not worth_replanning([(("t", 0),), (("t", 1),)], even, 2, rate_per_task=10_000)
    assert not worth_replanning([(("t", 0),)], even, 2, rate_per_task=10_000)
    # a rate not measured yet (0) counts as a typical one, not as "forever"
    unknown = {load.key: load for load in loads(20_000, 20_000)}
    assert not worth_replanning([(("t", 0), ("t", 1)), ()], unknown, 2, rate_per_task=0.0)


def test_a_bounded_copy_weighs_only_what_is_left_before_each_stop() -> None:
    """--stop-at-end: one task done, the other's two partitions 50k records from their stops
    at 165k records/s each. Counting their rate as records still to come made the remainder
    look like 3.4M records, and a bounded copy stopped and re-planned its last round."""
    done = [row(p, next_offset=1_000_000, stop=1_000_000, rate=0.0) for p in (2, 3)]
    busy = [row(p, next_offset=950_000, stop=1_000_000, rate=165_000.0) for p in (0, 1)]
    current = [(("t", 0), ("t", 1)), ()]
    bounded = {r.route.key: load_of(r) for r in busy + done}
    assert [bounded[("t", p)].weight for p in range(4)] == [50_001, 50_001, 1, 1]
    assert not worth_replanning(current, bounded, 2, rate_per_task=165_000)

    # the same partitions with no stop: their rate is records still coming, worth a re-plan
    live = {r.route.key: load_of(replace(r, stop=None)) for r in busy}
    assert worth_replanning(current, live, 2, rate_per_task=165_000)


def row(partition: int, *, next_offset: int, stop: int, rate: float) -> PartitionRow:
    route = PartitionRoute("t", partition, "t-copy", partition)
    return PartitionRow(route, next_offset, end=stop, stop=stop, rate=rate)
