"""What a restore task is given: the store to read and the target to write to."""

from __future__ import annotations

from dataclasses import dataclass

from relay.config import StoreConfig, TargetConfig
from relay.refusals import Rules
from relay.spec import TaskSpec

# A restore start for a partition whose store held no segment when the run was planned and
# that the destination holds nothing of: the partition begins where its first segment does.
FROM_FIRST_SEGMENT = -1


@dataclass(frozen=True, kw_only=True)
class RestoreTask(TaskSpec):
    """A group of stored partitions to write into the target, in offset order."""

    store: StoreConfig
    target: TargetConfig
    follow: bool = False  # keep restoring segments as they land
    from_time: int | None = None  # milliseconds since the epoch, inclusive
    until_time: int | None = None  # exclusive
    rules: Rules = ()  # what the destination topics refuse for good (relay.refusals)
