"""The relay pipeline: Kafka to Kafka, resumed from the destination's provenance headers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from relay.clients import admin
from relay.config import Config
from relay.driver.failover import Decision, SourcePool
from relay.driver.metrics import Metrics
from relay.driver.pipeline import Plan
from relay.driver.setup import Startup
from relay.filters import FilterSpec
from relay.resume import check_continuity, delivered, destination_next_offsets
from relay.spec import ChannelAddress, GroupTask, PartitionRoute, PartitionWork, SourcePartition

log = logging.getLogger(__name__)

REPORT_INTERVAL = 0.5  # seconds between a task's progress reports
COMMITTED_TIMEOUT = 2.0  # seconds to ask the source for its group's committed offsets


class RelayPipeline:
    kind = "relay"

    def __init__(
        self,
        cfg: Config,
        *,
        stop_event: threading.Event,
        metrics: Metrics,
        filters: tuple[FilterSpec, ...],
        failover: bool,
    ):
        self.cfg = cfg
        self.filters = filters
        self.pool = SourcePool(cfg.sources, cfg.source_pool, metrics, failover)
        self.startup = Startup(cfg, self.pool, stop_event, metrics)
        self.timeout = self.startup.timeout
        self.coordinator = cfg.need_target().cluster
        self.group_topics: Sequence[str] = sorted({r.target for r in cfg.topics})
        self.routes: list[PartitionRoute] = []

    def plan(
        self, stop_at_end: bool, on_routes: Callable[[list[PartitionRoute]], None] | None
    ) -> Plan:
        plan = self.startup.plan(stop_at_end, on_routes)
        self.routes = plan.routes
        return plan

    def active_source(self) -> str:
        return self.pool.active.name

    def where(self, routes: Sequence[PartitionRoute]) -> dict[SourcePartition, int]:
        """The destination's provenance tail, or the group's committed offset when that is
        later (the last records may have been filtered out by whoever relayed them).

        The committed offset only saves reading filtered records again (they would be dropped
        again), so a source that does not answer just goes without it."""
        found = destination_next_offsets(self.cfg.need_target().cluster, routes, self.timeout)
        keys = [r.key for r in routes]
        try:
            committed = admin.committed_offsets(
                self.pool.active, self.cfg.app.group_id, keys, COMMITTED_TIMEOUT
            )
        except Exception as exc:  # noqa: BLE001 - an optimisation, see above
            log.debug("committed offsets unavailable: %s", exc)
            return found
        for key, offset in committed.items():
            if offset is not None and offset > found.get(key, -1):
                found[key] = offset
        return found

    def adopt(self, routes: Sequence[PartitionRoute]) -> None:
        pass

    def task(
        self,
        round_id: int,
        task_id: int,
        works: tuple[PartitionWork, ...],
        channel: ChannelAddress,
    ) -> GroupTask:
        return GroupTask(
            round_id=round_id,
            task_id=task_id,
            source=self.pool.active,
            target=self.cfg.need_target(),
            partitions=works,
            group_id=self.cfg.app.group_id,
            channel=channel,
            report_interval=REPORT_INTERVAL,
            filters=self.filters,
        )

    def fail_over(self, nexts: dict[SourcePartition, int], urgent: bool) -> bool:
        decision = self.pool.next_switch(nexts, urgent=urgent)
        if decision is not None:
            self._switch(decision)
        return decision is not None

    def wants_switch(self, nexts: dict[SourcePartition, int]) -> bool:
        try:
            return self.pool.next_switch(nexts, urgent=False) is not None
        except ConnectionError:
            return True  # the active node is down and none can serve: end, then retry

    def _switch(self, decision: Decision) -> None:
        """Move to another node after checking that its record at the last relayed offset is
        the one relayed (the caller then resumes from the destination's provenance)."""
        new = self.pool.node(decision.node)
        at_destination = delivered(self.cfg.need_target().cluster, self.routes, self.timeout)
        check_continuity(new, at_destination, self.cfg.source_pool.on_mismatch, self.timeout)
        log.warning(
            "failover from=%s to=%s reason=%s", self.pool.active.name, new.name, decision.reason
        )
        self.pool.switch(decision)

    def views(self) -> list[Any]:
        return self.pool.views()

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self.pool.close()
