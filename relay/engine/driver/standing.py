"""The partitions this process relays, and where each stands.

The runner plans its rounds from here: the routes (partitions found while running join them; a
recreated topic followed moves its partitions to their next incarnation), what is left of each
(up to its halt, or its --stop-at-end target), which of them the group gives this process now,
and where they really stand after a failed round, a takeover or a failover (the pipeline reads
the destination: `Pipeline.where`).
"""

from __future__ import annotations

import logging

from relay.engine.driver.limits import Shares
from relay.engine.driver.ownership import Ownership
from relay.engine.driver.retry import RetriableRoundError
from relay.engine.driver.status import Status
from relay.engine.driver.stops import Stops
from relay.engine.driver.task_plan import TaskPlan
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Pipeline, Plan
from relay.spec import PartitionRoute, PartitionWork, SourcePartition

log = logging.getLogger(__name__)


class Standing:
    def __init__(
        self,
        pipeline: Pipeline,
        status: Status,
        ownership: Ownership,
        shares: Shares,
        metrics: Metrics,
        stop_at_end: bool,
    ):
        self.pipeline, self.status, self.ownership = pipeline, status, ownership
        self.shares, self.stop_at_end = shares, stop_at_end
        self.stops = Stops(pipeline, status, metrics)
        self.routes: list[PartitionRoute] = []

    def start(self, plan: Plan) -> None:
        """The pipeline's plan: where every partition starts, and stops."""
        self.routes = plan.routes
        self.stops.offsets = dict(plan.stops or {})
        self.status.observe_nodes(self.pipeline.views(), self.pipeline.active_source())
        self.status.start(plan.routes, plan.next_offsets, plan.ends, plan.stops)
        self.shares.own(len(plan.routes), len(plan.routes))  # all, until the group says else

    def add(self, plan: Plan) -> None:
        """Partitions found while running join the routes, from where each starts."""
        self.routes = self.routes + plan.routes
        self.status.start(plan.routes, plan.next_offsets, plan.ends, None)

    def works(self, plan: TaskPlan) -> list[tuple[PartitionWork, ...]]:
        """What each task of `plan` does of each of its partitions: from its next offset up to
        its stop, if any (the offsets read once for the whole round)."""
        nexts, by_key = self.status.next_offsets(), {r.key: r for r in self.routes}
        stops = self.stops.offsets
        return [
            tuple(PartitionWork(by_key[key], nexts[key], stops.get(key)) for key in keys)
            for keys in plan
        ]

    def pending(self) -> list[PartitionRoute]:
        """The partitions with records left to relay (a halted one: those before its halt)."""
        done = self.status.next_offsets()
        following = self.stops.waiting()
        routes = [r for r in self.routes if r.key not in following]
        if not self.stop_at_end:
            halted = self.status.halts.offsets()
            return [r for r in routes if done[r.key] < halted.get(r.key, done[r.key] + 1)]
        return [r for r in routes if done[r.key] < self.stops.offsets[r.key]]

    def owned(self) -> frozenset[SourcePartition] | None:
        """The partitions this process may relay now (None while the group rebalances); a new
        generation first learns where its partitions really stand."""
        assignment, new = self.ownership.current(frozenset(r.key for r in self.routes))
        if assignment is None:
            return None
        if new:
            owned = [r for r in self.routes if r.key in assignment.keys]
            self.pipeline.adopt(owned)
            self.resync(owned, "taken over")
            self.ownership.take_up(assignment)
            self.status.set_owned(assignment.keys, assignment.members)
            self.shares.own(len(assignment.keys), len(self.routes))
        return assignment.keys

    def follow(self) -> bool:
        """Between rounds: recreated topics followed (relay.engine.driver.stops); True while
        some wait for a source that did not answer (tried again next turn)."""
        routes = self.stops.follow(self.routes, self.owned, self.stop_at_end)
        if routes is not None:
            self.routes = routes
            return False
        return bool(self.stops.waiting())

    def resync(self, routes: list[PartitionRoute], why: str) -> None:
        """Learn where partitions really stand (records may have landed without their ack
        reaching us, or another process relayed them) and move their next offsets forward."""
        if not routes:
            return
        moved = 0
        # a failed round's unacknowledged runs that landed were relayed by this process; a
        # takeover's partitions may have been written by another one
        ours = why != "taken over"
        for key, next_offset in sorted(self.pipeline.where(routes).items()):
            if self.status.advance(key, next_offset, ours):
                moved += 1
                log.debug(
                    "resync topic=%s partition=%s next_offset=%s (%s)", *key, next_offset, why
                )
        if moved:  # one line: a failover of thousands of partitions would print thousands
            log.info("resync (%s): %d of %d partition(s) moved forward", why, moved, len(routes))

    def fail_over(self, todo: list[PartitionRoute], urgent: bool) -> None:
        """Between rounds: another source node if the pipeline moves to one (`urgent`: the
        last round met trouble with the source), and where `todo` stands on it."""
        try:
            switched = self.pipeline.fail_over(self.status.next_offsets(), urgent)
        except ConnectionError as exc:
            raise RetriableRoundError(str(exc), "source") from exc
        if switched:
            self.resync(todo, "failover")
        self.status.observe_nodes(self.pipeline.views(), self.pipeline.active_source())
