"""The relay pipeline: Kafka to Kafka, resumed from the destination's provenance headers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from relay.clients import admin
from relay.config import Config
from relay.engine.pipeline import REPORT_INTERVAL, Plan
from relay.pipelines.mirror.executor import RelaySides
from relay.pipelines.sources import FromSources
from relay.resume import Delivered, delivered, destination_next_offsets
from relay.spec import ChannelAddress, GroupTask, PartitionRoute, PartitionWork, SourcePartition

log = logging.getLogger(__name__)

COMMITTED_TIMEOUT = 2.0  # seconds to ask the source for its group's committed offsets


class RelayPipeline(FromSources):
    kind = "relay"
    sides = RelaySides

    def __init__(self, cfg: Config, **kwargs: Any):
        super().__init__(cfg, **kwargs)
        self.coordinator = cfg.need_target().cluster
        self.group_topics: Sequence[str] = sorted({r.target for r in cfg.topics})
        self.routes: list[PartitionRoute] = []
        self.target = cfg.need_target()  # with batch_size fitted to the destination at plan

    def plan(
        self, stop_at_end: bool, on_routes: Callable[[list[PartitionRoute]], None] | None
    ) -> Plan:
        plan = self.startup.plan(stop_at_end, on_routes)
        self.routes = plan.routes
        self.target = self.startup.fitted_target({r.target_topic for r in plan.routes})
        return plan

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
            target=self.target,
            partitions=works,
            group_id=self.cfg.app.group_id,
            channel=channel,
            report_interval=REPORT_INTERVAL,
            filters=self.filters,
        )

    def last_delivered(self) -> dict[SourcePartition, Delivered]:
        return delivered(self.cfg.need_target().cluster, self.routes, self.timeout)

    def tick(self) -> None:
        pass
