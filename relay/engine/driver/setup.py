"""Start-up: check the clusters and topics, pick the source node, find every next offset.

Everything here runs before any record moves, with bounded retries: a cluster that never
answered is most likely a wrong address, so even `max_retries = -1` gives up after a few tries.
Errors name the cluster by its name and addresses, never its credentials.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, TypeVar

from relay.clients import admin, consumer_groups, timestamps
from relay.clients.kept import keep_clients
from relay.clients.settings import describe, is_retriable
from relay.config import Config, TargetConfig, TopicRoute
from relay.engine.driver.failover import SourcePool
from relay.engine.driver.plan import plan_routes
from relay.engine.driver.retry import policy_for, retrying
from relay.engine.metrics import Metrics
from relay.engine.pipeline import Plan
from relay.errors import KafkaSetupError, KtmError
from relay.provenance.attribution import attribute
from relay.provenance.resume import (
    AtDestination,
    ResumePoint,
    SourceOffsets,
    at_destination,
    resume_points,
    source_offsets,
)
from relay.refusals import Rules, rules_of
from relay.retention import AtRisk, at_risk, cutoffs, retention_ms
from relay.spec import PartitionRoute, SourcePartition

log = logging.getLogger(__name__)

T = TypeVar("T")


class Fitted(NamedTuple):
    target: TargetConfig  # [target] with batch_size fitted to the destination topics
    rules: Rules  # what each destination topic refuses for good


class Startup:
    def __init__(self, cfg: Config, pool: SourcePool, stop: threading.Event, metrics: Metrics):
        self.cfg, self.pool, self.stop, self.metrics = cfg, pool, stop, metrics
        self.timeout = self.timeout_of(cfg)
        # destination topics' retention by time, read by `fit` (relay.retention)
        self.retention: dict[str, int | None] = {}

    @staticmethod
    def timeout_of(cfg: Config) -> float:
        """Time limit of one start-up request: generous, a cluster may be slow to answer (10 s
        with the default health-check timeout, which holds a 300 ms link)."""
        return max(10.0, cfg.source_pool.request_timeout * 5)

    def plan(
        self,
        stop_at_end: bool,
        on_routes: Callable[[list[PartitionRoute]], None] | None = None,
        topics: Sequence[TopicRoute] | None = None,
        source_counts: Mapping[str, int] | None = None,
    ) -> Plan:
        """`topics`: the routes to plan (default: `[topics]`), `source_counts`: their source
        partition counts if the caller just read them. The clients it makes are kept open
        until it returns: each cluster is asked several things in a row."""
        with keep_clients():
            return self._plan(stop_at_end, on_routes, topics, source_counts)

    def _plan(
        self,
        stop_at_end: bool,
        on_routes: Callable[[list[PartitionRoute]], None] | None,
        topics: Sequence[TopicRoute] | None,
        source_counts: Mapping[str, int] | None,
    ) -> Plan:
        cfg, target = self.cfg, self.cfg.need_target().cluster
        topics = cfg.topics if topics is None else topics
        names = [r.source for r in topics]
        if source_counts is None:
            source_counts = self.call(
                "source", lambda: self.pool.partition_counts(names, self.timeout)
            )
        src_counts = {name: source_counts[name] for name in names if name in source_counts}
        dst_counts = self.call(
            "target",
            lambda: admin.partition_counts(target, [r.target for r in topics], self.timeout),
        )
        routes = plan_routes(
            topics, src_counts, dst_counts, self.pool.describe_all(), describe(target)
        )
        if on_routes is not None:
            on_routes(routes)
        tail = self.call("target", lambda: at_destination(target, routes, self.timeout))
        routes = self.incarnations(tail.later(routes))
        found = {
            r.key: tail.delivered[r.key].next_offset
            for r in routes
            if r.key in tail.delivered and tail.delivered[r.key].incarnation == r.incarnation
        }
        self.call("source", lambda: self.pool.start([r.key for r in routes], found))
        points, offsets = self.resume(routes, found, tail)
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

    def fit(self, topics: Iterable[str]) -> Fitted:
        """[target] as the tasks use it, and what the destination topics refuse for good
        (relay.refusals), from one DescribeConfigs of the destination topics. Brokers that
        describe no configs (Tansu) leave both as they are: a record refused then halts its
        partition at the first record of the refused batch."""
        target = self.cfg.need_target()
        try:
            configs = admin.topic_configs(target.cluster, topics, self.timeout)
        except Exception as exc:  # noqa: BLE001 - a check, not a requirement
            log.info("target does not describe topic configs (%s): batch_size not checked", exc)
            return Fitted(target, ())
        rules = tuple(rules_of(topic, found) for topic, found in sorted(configs.items()) if found)
        self.retention = {topic: retention_ms(found) for topic, found in configs.items()}
        return Fitted(self._fitted_target(target, configs), rules)

    def retention_risk(self, plan: Plan) -> list[AtRisk]:
        """The destination topics whose retention will delete records this run copies, each
        said in one warning (relay.retention); a check, never a reason not to start."""
        times = cutoffs(plan.routes, self.retention, int(time.time() * 1000))
        if not times:
            return []
        source = self.pool.active
        try:
            young = timestamps.offsets_from(source, times, self.timeout)
        except Exception as exc:  # noqa: BLE001 - informative only
            log.info("source offsets by time not read (%s): retention not checked", exc)
            return []
        risks = at_risk(plan.routes, self.retention, plan.next_offsets, plan.ends, young)
        for risk in risks:
            log.warning("%s", risk.line())
        return risks

    def _fitted_target(
        self, target: TargetConfig, configs: Mapping[str, Mapping[str, str]]
    ) -> TargetConfig:
        """`batch_size` lowered to the smallest max.message.bytes the destination topics
        allow, with a warning. A broker refuses a bigger batch, and kafka-python would split it
        again and again; a single record over the limit still fails, naming itself."""
        limits = {
            topic: int(found["max.message.bytes"])
            for topic, found in configs.items()
            if found.get("max.message.bytes", "").isdigit()
        }
        if not limits:
            log.info("target describes no max.message.bytes: [target].batch_size not checked")
            return target
        topic, limit = min(limits.items(), key=lambda item: item[1])
        target = dataclasses.replace(target, max_batch_bytes=min(target.max_batch_bytes, limit))
        if target.batch_size <= limit:
            return target
        log.warning(
            "[target].batch_size %d exceeds max.message.bytes %d of destination topic %s: "
            "producing batches of at most %d bytes",
            target.batch_size,
            limit,
            topic,
            limit,
        )
        return dataclasses.replace(target, batch_size=limit)

    def call(self, side: str, fn: Callable[[], T], where: str | None = None) -> T:
        """`fn` with start-up retries on retriable errors; one clear error at the end."""
        policy = policy_for(self.cfg, side).bounded()
        if where is None and side == "source":
            where = "source " + self.pool.describe_all()
        elif where is None:
            where = describe(self.cfg.need_target().cluster)
        try:
            for attempt in retrying(lambda _: policy, is_retriable, self.stop, self.metrics):
                with attempt:
                    return fn()
        except KtmError:
            raise
        except Exception as exc:
            if is_retriable(exc):
                tries = policy.max_retries + 1
                raise KafkaSetupError(
                    f"{where}: unreachable after {tries} attempt{'s' if tries > 1 else ''}: {exc}"
                ) from exc
            raise KafkaSetupError(f"{where}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True
