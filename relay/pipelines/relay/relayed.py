"""What the relay's chores (relay.pipelines.relay.group_sync, acl_sync, config_sync) read of the
running relay: the active source node, the partitions relayed, and the progress the runner
showed at its last tick (relay.engine.pipeline.Progress).

The pipeline keeps it up to date from the driver's thread; the chores only read it, from their
own threads (each field is replaced whole, never changed in place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from relay.config import ClusterConfig, TopicRoute
from relay.engine.pipeline import Progress
from relay.spec import PartitionRoute, SourcePartition


class ActiveSource(Protocol):
    @property
    def active(self) -> ClusterConfig:
        """The source node records come from now (relay.pipelines.source_pool)."""
        ...


@dataclass(frozen=True)
class FixedSource:
    active: ClusterConfig


class Relayed:
    def __init__(self, pool: ActiveSource):
        self.pool = pool
        self.routes: list[PartitionRoute] = []
        self.held: tuple[TopicRoute, ...] = ()  # dry run: routes whose destination is missing
        self.progress = Progress({}, None)

    @classmethod
    def fixed(
        cls,
        source: ClusterConfig,
        routes: Sequence[PartitionRoute],
        progress: Mapping[SourcePartition, int] | None = None,
    ) -> Relayed:
        """A relay of `routes` from one node whose process owns them all (it syncs), at the
        acknowledged next offsets `progress`: a chore run alone (the tests, the bench)."""
        relayed = cls(FixedSource(source))
        relayed.routes = list(routes)
        relayed.progress = Progress(dict(progress or {}), frozenset(r.key for r in routes))
        return relayed

    @property
    def source(self) -> ClusterConfig:
        return self.pool.active

    def topic_pairs(self) -> list[tuple[str, str]]:
        """(source topic, destination topic) of what is relayed, and (dry run) of what would
        be once its destination is created."""
        pairs = {(r.topic, r.target_topic) for r in self.routes}
        return sorted(pairs | {(r.source, r.target) for r in self.held})

    def may_sync(self) -> bool:
        """One process of the group syncs: the one that owns the first partition (none while
        it has no assignment yet)."""
        owned, routes = self.progress.owned, self.routes
        return owned is not None and bool(routes) and min(r.key for r in routes) in owned
