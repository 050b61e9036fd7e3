"""What a relay task is given: where to read (a source node) and write (the target)."""

from __future__ import annotations

from dataclasses import dataclass

from relay.clients.seed import Seed
from relay.config import ClusterConfig, FetchConfig, TargetConfig
from relay.refusals import Rules
from relay.spec import TaskSpec


@dataclass(frozen=True, kw_only=True)
class RelayTask(TaskSpec):
    """A task's source partitions to relay to the target."""

    source: ClusterConfig
    target: TargetConfig
    group_id: str  # the source consumer group offsets are committed to
    fetch: FetchConfig = FetchConfig()
    seed: Seed | None = None  # the driver's metadata of the source (relay.clients.seed)
    rules: Rules = ()  # what the destination topics refuse for good (relay.refusals)
