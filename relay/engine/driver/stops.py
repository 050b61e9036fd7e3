"""Where each source partition stops: `--stop-at-end`'s targets, and halts.

A partition halts (relay.engine.driver.halts) when the destination refuses one of its records
for good (relay.refusals), when its source lost records (relay.losses), or when its topic was
deleted and created again under its name: its stop offset is lowered to where it halted, so
later rounds relay what lies before it and nothing after.

Recreated topics are found by the pipeline (relay.pipelines.recreated: a changed topic ID);
each partition of such a topic halts where it was copied up to, or, with
`[source_pool].on_recreate = "follow"`, is kept out of rounds until, between two rounds, it
starts over at the new topic's log start as the topic's next incarnation (the provenance names
it: relay.provenance.header).

A fetch often meets a recreated topic first: the new log is shorter than the copy, which looks
like a truncation (relay.losses). While following, such a truncation is counted as lost only if
the next look at the topics' IDs finds no recreation to explain it, so that following a
recreated topic raises no false KtmSourceRecordsLost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relay.engine.driver.status import Status
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Pipeline
from relay.losses import TRUNCATED
from relay.spec import PartitionRoute, SourcePartition, TaskResult

log = logging.getLogger(__name__)

Lost = tuple[int, int, str]  # (first, end, cause) of relay.losses

HALTING = (
    "its partitions halt where they were copied up to (copying the new topic into the same "
    'destination would repeat offsets the copy holds; [source_pool].on_recreate = "follow" '
    "copies it as a new incarnation)"
)
FOLLOWING = (
    'following it ([source_pool].on_recreate = "follow"): its partitions are copied again from '
    "the new topic's log start into the same destination, after what the copy holds, as the "
    "topic's next incarnation"
)


class Stops:
    def __init__(self, pipeline: Pipeline, status: Status, metrics: Metrics):
        self.offsets: dict[SourcePartition, int] = {}  # --stop-at-end targets, and halts
        self.pipeline, self.status, self.metrics = pipeline, status, metrics
        self._following: dict[SourcePartition, PartitionRoute] = {}  # to follow between rounds
        # truncations not counted yet: (what was lost, the number of the look that decides)
        self._unconfirmed: dict[SourcePartition, tuple[Lost, int]] = {}

    def halt(self, route: PartitionRoute, at: int, reason: str) -> None:
        """Relay `route` up to `at` and no further (one ERROR line, relay.engine.driver.halts)."""
        self.status.halts.add(route, at, reason)
        self.offsets[route.key] = min(self.offsets.get(route.key, at), at)

    def halt_failures(
        self, failures: list[TaskResult], routes: list[PartitionRoute]
    ) -> tuple[list[TaskResult], bool]:
        """A partition whose record the destination refuses for good, or whose source lost
        records, halts there. Returns the other failures, and whether any partition halted."""
        by_key = {r.key: r for r in routes}
        rest, halted = [], False
        for result in failures:
            error = result.error
            if error is None or error.halt_at is None or error.key not in by_key:
                rest.append(result)
                continue
            self.metrics.errors.labels("lost" if error.lost else "refused").inc()
            if error.lost is not None:  # the source lost records (relay.losses)
                self.count_loss(error.key, error.lost)
            self.halt(by_key[error.key], error.halt_at, error.message)
            halted = True
        return rest, halted

    def waiting(self) -> set[SourcePartition]:
        """The partitions kept out of rounds until they are followed."""
        return set(self._following)

    def look(self, routes: list[PartitionRoute]) -> bool:
        """Whether a source topic was found recreated: one line naming both IDs; its partitions
        halt where they were copied up to, or wait to be followed."""
        looked = self.pipeline.looked()  # before: what a look found is set before its number
        found = self.pipeline.recreated()
        nexts = self.status.next_offsets() if found else {}  # copied only when needed
        for topic, line in found:
            mine = [r for r in routes if r.topic == topic]
            if self.pipeline.follows_recreated:
                log.warning("%s; %s", line, FOLLOWING)
                self._following.update((r.key, r) for r in mine)
                for route in mine:
                    self._unconfirmed.pop(route.key, None)  # not lost: the topic is new
                continue
            log.error("%s; %s", line, HALTING)
            for route in mine:
                self.halt(route, nexts[route.key], f"source topic {topic} was recreated")
        self.confirm(looked)
        return bool(found)

    def count_loss(self, key: SourcePartition, lost: Lost) -> None:
        """Source offsets a halted partition lost; a truncation while following waits for the
        next look at the topics' IDs."""
        if self.pipeline.follows_recreated and lost[2] == TRUNCATED:
            if key not in self._following:  # else a recreation explains it already
                self._unconfirmed[key] = (lost, self.pipeline.look_again())
        else:
            self.status.count_loss(key, lost)

    def confirm(self, looked: float) -> None:
        """The truncations a look answered after them did not explain: lost after all."""
        for key, (lost, look) in list(self._unconfirmed.items()):
            if looked >= look:
                del self._unconfirmed[key]
                self.status.count_loss(key, lost)

    def follow(
        self,
        routes: list[PartitionRoute],
        owned: Callable[[], frozenset[SourcePartition] | None],
        stop_at_end: bool,
    ) -> list[PartitionRoute] | None:
        """Between rounds: `routes` with the waiting partitions at their next incarnation, from
        the new topic's log start (those the new topic lacks halt); None when none waits, or
        the source did not answer (tried again at the next call)."""
        if not self._following:
            return None
        try:
            plan = self.pipeline.follow(list(self._following.values()), owned() or frozenset())
        except Exception as exc:  # noqa: BLE001 - they stay out of rounds until it works
            log.warning("following recreated source topics: %s; trying again", exc)
            return None
        followed = {r.key: r for r in plan.routes}
        nexts = self.status.next_offsets()
        for route in [r for key, r in self._following.items() if key not in followed]:
            reason = f"source topic {route.topic} was recreated without partition {route.partition}"
            self.halt(route, nexts[route.key], reason)
        self._following = {}
        self.status.follow(plan.routes, plan.next_offsets, plan.ends)
        for key in followed:
            self.offsets.pop(key, None)
            if stop_at_end:
                self.offsets[key] = plan.ends[key]
        return [followed.get(r.key, r) for r in routes]
