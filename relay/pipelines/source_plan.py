"""Start-up of the pipelines that read Kafka sources (relay, backup): check the clusters and
topics, pick the source node, find every next offset.

Everything here runs before any record moves, through the start-up calls (relay.pipelines.calls:
bounded retries, one clear error naming the cluster).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

from relay.clients import admin, consumer_groups, timestamps
from relay.clients.kept import HeadStart, keep_clients
from relay.clients.seed import Seed
from relay.clients.settings import describe
from relay.config import Config, TopicRoute
from relay.engine.pipeline import Plan
from relay.pipelines.calls import Calls
from relay.pipelines.routes import plan_routes
from relay.pipelines.source_pool import SourcePool
from relay.provenance.attribution import attribute
from relay.provenance.resume import (
    AtDestination,
    ResumePoint,
    SourceOffsets,
    at_destination,
    resume_points,
    source_offsets,
)
from relay.retention import AtRisk, at_risk, cutoffs
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)


class SourcePlan:
    def __init__(self, cfg: Config, pool: SourcePool, calls: Calls):
        self.cfg, self.pool, self.calls = cfg, pool, calls
        self.call, self.timeout = calls.call, calls.timeout
        self._ahead: HeadStart | None = None
        self.seed: Seed | None = None  # the last plan's source metadata, for the workers

    def head_start(self, topics: Iterable[str]) -> None:
        """Open the active node's offset readers on threads of their own; `resumed` takes
        them. Once."""
        if self._ahead is None:
            readers = admin.offset_readers(self.pool.active, topics, self.timeout, self._seeded)
            self._ahead = HeadStart(readers)

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()

    def plan(
        self,
        stop_at_end: bool,
        topics: Sequence[TopicRoute] | None = None,
        source_counts: Mapping[str, int] | None = None,
    ) -> Plan:
        """`routes` and `resumed` in one: the plan of `topics` (default: `[topics]`)."""
        return self.resumed(self.routes(topics, source_counts), stop_at_end)

    def routes(
        self,
        topics: Sequence[TopicRoute] | None = None,
        source_counts: Mapping[str, int] | None = None,
    ) -> list[PartitionRoute]:
        """The partitions of `topics` (default: `[topics]`), checked on both sides;
        `source_counts`: their source partition counts if the caller just read them."""
        target = self.cfg.need_target().cluster
        topics = self.cfg.topics if topics is None else topics
        names = [r.source for r in topics]
        with keep_clients():  # each cluster is asked several things in a row
            if source_counts is None:
                source_counts = self.call(
                    "source", lambda: self.pool.partition_counts(names, self.timeout)
                )
            src_counts = {name: source_counts[name] for name in names if name in source_counts}
            dst_counts = self.call(
                "target",
                lambda: admin.partition_counts(target, [r.target for r in topics], self.timeout),
            )
        return plan_routes(
            topics, src_counts, dst_counts, self.pool.describe_all(), describe(target)
        )

    def resumed(self, routes: list[PartitionRoute], stop_at_end: bool) -> Plan:
        """Where each of `routes` resumes (from the destination's provenance tail) and stops."""
        target = self.cfg.need_target().cluster
        with keep_clients():
            if self._ahead is not None:
                self._ahead.take(self.timeout)  # opened by now, unless the source is slow
            tail = self.call("target", lambda: at_destination(target, routes, self.timeout))
            routes = self.incarnations(tail.later(routes))
            found = {
                r.key: tail.delivered[r.key].next_offset
                for r in routes
                if r.key in tail.delivered and tail.delivered[r.key].incarnation == r.incarnation
            }
            self.call("source", lambda: self.pool.start([r.key for r in routes], found))
            points, offsets = self.resume(routes, found, tail)
            self.seed = self._seed(routes)
            stops = (self.pool.boot_ends() or dict(offsets.end)) if stop_at_end else None
        nexts = {key: point.next_offset for key, point in points.items()}
        return Plan(routes, nexts, dict(offsets.end), stops)

    def resume(
        self,
        routes: list[PartitionRoute],
        found: dict[SourcePartition, int],
        tail: AtDestination | None = None,
    ) -> tuple[dict[SourcePartition, ResumePoint], SourceOffsets]:
        """Where each partition resumes, from the destination's tail (`found`; and where it
        cannot settle that, `tail`, from the records of the source:
        relay.provenance.attribution), the relay group's committed offsets and the source's
        bounds."""
        source, keys = self.pool.active, [r.key for r in routes]
        # Offsets read at different moments are compared below, so the source's end is read
        # LAST: the destination and the committed offsets (which another member may be moving
        # right now) can then never be past it unless the topic really was recreated.
        incarnations = {r.key: r.incarnation for r in routes}
        committed = self.call(
            "source",
            lambda: consumer_groups.committed_offsets(
                source, self.cfg.app.group_id, keys, self.timeout, incarnations
            ),
        )
        unsettled: frozenset[SourcePartition] = frozenset()
        if tail is not None and tail.unsettled:
            stands, unsettled = self.call(
                "source", lambda: attribute(source, tail, committed, self.timeout)
            )
            found = {**found, **{k: max(v, found.get(k, v)) for k, v in stands.items()}}
        offsets = self.call("source", lambda: source_offsets(source, routes, self.timeout))
        return resume_points(routes, offsets, found, committed, unsettled), offsets

    def _seeded(self, seed: Seed) -> None:
        """The head start's metadata, for the workers that start before the plan is done
        (the plan's own replaces it)."""
        if self.seed is None:
            self.seed = seed

    def _seed(self, routes: list[PartitionRoute]) -> Seed | None:
        """The active node's metadata of `routes`' topics, as the start-up's own client holds
        it: the workers' clients then skip their bootstrap (relay.clients.seed). A head start
        only: None if it cannot be read."""
        try:
            topics = {r.topic for r in routes}
            return admin.metadata_seed(self.pool.active, topics, self.timeout)
        except Exception as exc:  # noqa: BLE001 - the workers bootstrap as they always did
            log.debug("source metadata for the workers: %s", exc)
            return None

    def seed_for(self, topics: Iterable[str]) -> Seed | None:
        """The seed of `topics` on the active node, if the last plan read one there."""
        seed = self.seed
        if seed is None or seed.servers != self.pool.active.servers:
            return None
        return seed.of(topics)

    def incarnations(self, routes: list[PartitionRoute]) -> list[PartitionRoute]:
        """Following recreated topics, `routes` at the incarnation the relay group's commits
        name where that is later: ktm followed a topic and stopped before it copied any of the
        new one (the commit is made before the first copy: relay.pipelines.recreated)."""
        if self.cfg.source_pool.on_recreate != "follow":
            return routes
        source, group = self.pool.active, self.cfg.app.group_id
        marks = self.call(
            "source", lambda: consumer_groups.committed_marks(source, group, self.timeout)
        )
        return [
            dataclasses.replace(r, incarnation=marks[r.key][1])
            if r.key in marks and marks[r.key][1] > r.incarnation
            else r
            for r in routes
        ]

    def retention_risk(self, plan: Plan, retention: Mapping[str, int | None]) -> list[AtRisk]:
        """The destination topics whose retention (`retention.ms` of each: relay.pipelines.
        target_fit) will delete records this run copies, each said in one warning
        (relay.retention); a check, never a reason not to start."""
        times = cutoffs(plan.routes, retention, int(time.time() * 1000))
        if not times:
            return []
        source = self.pool.active
        try:
            young = timestamps.offsets_from(source, times, self.timeout)
        except Exception as exc:  # noqa: BLE001 - informative only
            log.info("source offsets by time not read (%s): retention not checked", exc)
            return []
        risks = at_risk(plan.routes, retention, plan.next_offsets, plan.ends, young)
        for risk in risks:
            log.warning("%s", risk.line())
        return risks
