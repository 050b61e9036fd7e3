"""What a backup task is given: where to read (a source node) and the store to write to."""

from __future__ import annotations

from dataclasses import dataclass

from relay.clients.seed import Seed
from relay.config import ClusterConfig, FetchConfig, StoreConfig
from relay.spec import TaskSpec


@dataclass(frozen=True, kw_only=True)
class BackupTask(TaskSpec):
    """A task's source partitions to back up into the store (the relay's reading side)."""

    source: ClusterConfig
    store: StoreConfig
    group_id: str
    fetch: FetchConfig = FetchConfig()
    seed: Seed | None = None  # the driver's metadata of the source (relay.clients.seed)
