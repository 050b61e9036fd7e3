"""What the pipelines that read `[[sources]]` (relay, backup) share: the source pool, and
failing over to another node after checking it holds what was already copied."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TypedDict, Unpack

from relay.clients.seed import Seed
from relay.config import ClusterConfig, Config, FetchConfig
from relay.engine.metrics import Metrics
from relay.engine.pipeline import NodeView, Pipeline
from relay.filters import FilterSpec
from relay.pipelines.calls import Calls
from relay.pipelines.recreated import RecreatedTopics
from relay.pipelines.source_plan import SourcePlan
from relay.pipelines.source_pool import SourcePool
from relay.provenance.resume import Delivered, check_continuity
from relay.spec import PartitionWork, Rates, SourcePartition

log = logging.getLogger(__name__)


class SourceArgs(TypedDict):
    """What a pipeline reading `[[sources]]` is made with, beside its config."""

    stop_event: threading.Event
    metrics: Metrics
    filters: tuple[FilterSpec, ...]
    failover: bool  # N identical nodes (else one)


class SourceFields(TypedDict):
    """What the specs of relay and backup tasks say of the source (`FromSources.source_fields`)."""

    source: ClusterConfig
    group_id: str
    filters: tuple[FilterSpec, ...]
    fetch: FetchConfig
    on_loss: str
    seed: Seed | None  # the driver's metadata of the source node (relay.clients.seed)


class FromSources(Pipeline):
    """Relay and backup: a source pool (one node, or N identical ones in failover mode)."""

    def __init__(self, cfg: Config, **sources: Unpack[SourceArgs]):
        self.cfg, self.filters, metrics = cfg, sources["filters"], sources["metrics"]
        stop_event, failover = sources["stop_event"], sources["failover"]
        self.pool = SourcePool(cfg.sources, cfg.source_pool, metrics, failover)
        self.calls = Calls(cfg, stop_event, metrics, self.pool.describe_all)
        self.planner = SourcePlan(cfg, self.pool, self.calls)
        self.timeout = self.calls.timeout
        self.recreations = RecreatedTopics(cfg.source_pool.healthcheck_interval, self.timeout)

    def last_delivered(self) -> dict[SourcePartition, Delivered]:
        """The last record already copied of each partition (where a new node must agree)."""
        raise NotImplementedError

    def source_fields(self, rates: Rates, works: Iterable[PartitionWork]) -> SourceFields:
        """What the specs of relay and backup tasks say of the source: the active node, the
        source group, the filters, the fetch settings within the task's share of [limits], and
        what the driver knows of the node's metadata for the task's topics (`works`')."""
        fetch = self.cfg.source_pool.fetch.within(rates.records_per_second, rates.bytes_per_second)
        return SourceFields(
            source=self.pool.active,
            group_id=self.cfg.app.group_id,
            filters=self.filters,
            fetch=fetch,
            on_loss=self.cfg.source_pool.on_loss,
            seed=self.planner.seed_for({w.route.topic for w in works}),
        )

    @property
    def source_node(self) -> ClusterConfig:
        """The source node records come from now."""
        return self.pool.active

    def active_source(self) -> str:
        return self.pool.active.name

    def fail_over(self, nexts: dict[SourcePartition, int], urgent: bool) -> bool:
        """Move to another node if needed, after checking that its record at the last copied
        offset is the one copied (the caller then resumes from where things stand)."""
        decision = self.pool.next_switch(nexts, urgent=urgent)
        if decision is None:
            return False
        new = self.pool.node(decision.node)
        on_mismatch = self.cfg.source_pool.on_mismatch
        check_continuity(new, self.last_delivered(), on_mismatch, self.timeout)
        log.warning(
            "failover from=%s to=%s reason=%s", self.pool.active.name, new.name, decision.reason
        )
        self.pool.switch(decision)
        return True

    def look_again(self) -> int:
        return self.recreations.look_soon()

    def looked(self) -> int:
        return self.recreations.done

    def recreated(self) -> list[tuple[str, str]]:
        routes = getattr(self, "routes", [])
        if not routes:
            return []
        # the topics are read only when a look starts: a set of 10,000 routes' topics a tick
        topics = (route.topic for route in routes)
        return self.recreations.check(self.pool.active, topics, len(routes))

    def wants_switch(self, nexts: dict[SourcePartition, int]) -> bool:
        try:
            return self.pool.next_switch(nexts, urgent=False) is not None
        except ConnectionError:
            return True  # the active node is down and none can serve: end, then retry

    def views(self) -> list[NodeView]:
        return self.pool.views()

    def head_start(self) -> None:
        """The source's offset readers (relay.clients.admin.offset_readers), opened while the
        partitions are counted: `resume` then reads the source's bounds at once (a second
        sooner across a 240 ms link). With `[topics]` and one source node only: otherwise
        which topics, or which node, is not known yet."""
        if not self.cfg.discover.include and len(self.cfg.sources) == 1:
            self.planner.head_start({r.source for r in self.cfg.topics})

    def close(self) -> None:
        self.planner.close()
        self.recreations.close()
        self.pool.close()
