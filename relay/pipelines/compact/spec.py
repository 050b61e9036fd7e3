"""What a compaction task is given, and what it answers (ktm compact is a batch job)."""

from __future__ import annotations

from dataclasses import dataclass

from relay.config import StoreConfig
from relay.spec import SourcePartition


@dataclass(frozen=True)
class CompactTask:
    """Merge the level-`level` segments of these partitions."""

    store: StoreConfig
    partitions: tuple[SourcePartition, ...]
    level: int
    min_age: float  # seconds: younger segments are left alone (backup may still add next to them)
    target_bytes: int  # a merged segment holds about this much
    delete: bool  # delete the inputs once the merged segment is verified


@dataclass(frozen=True)
class CompactResult:
    merged: int = 0  # segments written (level + 1)
    inputs: int = 0  # segments they replace
    deleted: int = 0  # segments deleted (inputs, and leftovers of a crashed compaction)
    records: int = 0
    errors: tuple[str, ...] = ()  # one line per partition that failed
