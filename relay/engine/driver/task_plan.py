"""The task plan: which partitions each task of a round serves.

A round runs at most one task per task slot, and a task serves its partitions with one
consumer and one producer. Tasks are balanced by expected work (backlog, plus what the partition
receives while the round runs), sticky (a partition stays in the task it was in when that costs
little balance), and complete: every pending partition is in some task, so none starves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay.engine.driver.rows import PartitionRow
from relay.spec import SourcePartition

HORIZON = 10.0  # seconds of incoming records a partition is expected to bring during a round
STICKY_SLACK = 0.25  # a partition stays in its old task while that task is < 125% of fair
REPLAN_RATIO = 1.5  # re-plan when the busiest task carries 1.5x what a fresh plan would give
REPLAN_MIN_SECONDS = 3.0  # ... and that saves at least this much work (a re-plan costs ~0.5 s)
# A task's rate assumed while none was measured yet (one kafka-python task moves 30-80k/s on
# the 2-core test machine): an unknown rate must not make a small remainder look long.
ASSUMED_TASK_RATE = 20_000.0


@dataclass(frozen=True)
class Load:
    key: SourcePartition
    backlog: int  # records behind the source end
    rate: float = 0.0  # records/s relayed recently

    @property
    def weight(self) -> float:
        # +1: with no backlog and no rate every partition still counts, so counts balance.
        return self.backlog + self.rate * HORIZON + 1


TaskPlan = list[tuple[SourcePartition, ...]]


def load_of(row: PartitionRow) -> Load:
    """A partition's expected work. One with a stop (--stop-at-end) has what is left before
    it and nothing more: counted with HORIZON seconds of its rate, the last task of a bounded
    copy at ~330k records/s a partition looked 3.3M records from done and its partitions were
    re-planned (a round stopped and started again) with ~100k records left."""
    key, remaining = row.route.key, row.remaining
    if remaining is not None:
        return Load(key, remaining)
    return Load(key, row.lag or 0, row.rate)


def plan_tasks(
    loads: Sequence[Load], slots: int, previous: Mapping[SourcePartition, int] | None = None
) -> TaskPlan:
    """At most `slots` non-empty tasks, heaviest partitions placed first (LPT), each partition
    kept in its previous task index while that task stays near its fair share."""
    count = min(max(slots, 1), len(loads))
    if count == 0:
        return []
    fair = sum(load.weight for load in loads) / count
    tasks: list[list[SourcePartition]] = [[] for _ in range(count)]
    weight = [0.0] * count
    for load in sorted(loads, key=lambda item: (-item.weight, item.key)):
        old = (previous or {}).get(load.key)
        if (
            old is not None
            and old < count
            and weight[old] + load.weight <= fair * (1 + STICKY_SLACK)
        ):
            index = old
        else:
            index = min(range(count), key=lambda i: (weight[i], len(tasks[i]), i))
        tasks[index].append(load.key)
        weight[index] += load.weight
    return [tuple(sorted(task)) for task in tasks if task]


def task_index(tasks: TaskPlan) -> dict[SourcePartition, int]:
    return {key: index for index, task in enumerate(tasks) for key in task}


class TaskPlanner:
    """Plans each round's tasks sticky to the round before's."""

    def __init__(self) -> None:
        self._tasks: dict[SourcePartition, int] = {}  # the last plan's task of each partition

    def plan(self, loads: Sequence[Load], slots: int) -> TaskPlan:
        plan = plan_tasks(loads, slots, self._tasks)
        self._tasks = task_index(plan)
        return plan


def busiest(tasks: TaskPlan, loads: Mapping[SourcePartition, Load]) -> float:
    """Expected work of the most loaded task: what bounds how soon the round's work is done."""
    totals = [sum(loads[k].weight for k in task if k in loads) for task in tasks]
    return max(totals, default=0.0)


def worth_replanning(
    current: TaskPlan, loads: Mapping[SourcePartition, Load], slots: int, rate_per_task: float
) -> bool:
    """True when stopping the round and planning afresh finishes the work clearly sooner.

    `current` holds only the partitions still pending (finished ones removed), so a task that is
    done shows as an empty task: its slot idles while others have a backlog to share.
    """
    pending = [loads[k] for task in current for k in task if k in loads]
    if len(pending) < 2:
        return False
    now = busiest(current, loads)
    fresh = busiest(plan_tasks(pending, slots, task_index(current)), loads)
    saved_seconds = (now - fresh) / max(rate_per_task, ASSUMED_TASK_RATE)
    return now > fresh * REPLAN_RATIO and saved_seconds >= REPLAN_MIN_SECONDS
