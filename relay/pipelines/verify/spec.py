"""What a verify task is given (the destination partitions it reads, and for each the source
partitions that feed it), and what it answers (ktm verify is a batch job)."""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.config import ClusterConfig
from relay.filters import FilterSpec
from relay.spec import SourcePartition

KINDS = ("missing", "duplicated", "different", "out_of_order", "unexpected")


@dataclass(frozen=True)
class Feeder:
    """One source partition feeding a destination partition, checked over [start, end)."""

    key: SourcePartition
    start: int
    end: int


@dataclass(frozen=True)
class DestWork:
    """One destination partition, read whole: from its log start to its end offset at
    start-up."""

    topic: str
    partition: int
    start: int
    end: int
    feeders: tuple[Feeder, ...]


@dataclass(frozen=True)
class VerifyTask:
    source: ClusterConfig
    target: ClusterConfig
    clusters: tuple[str, ...]  # the names provenance may give the source (failover nodes)
    works: tuple[DestWork, ...]
    filters: tuple[FilterSpec, ...] = ()
    timeout: float = 30.0  # seconds for one fetch, its retries included


@dataclass(frozen=True)
class Finding:
    """The first record of one kind of fault: its source offset and where the destination
    holds it (-1 where it holds none: a missing record)."""

    kind: str  # one of KINDS, "different" as "different:<field>"
    source_offset: int
    dest_offset: int


@dataclass(frozen=True)
class PartitionReport:
    """One source partition (or, with `key` None, a destination partition's records that
    name no source partition of the config)."""

    key: SourcePartition | None
    dest: tuple[str, int]
    start: int
    end: int
    compared: int = 0  # destination records claiming a source offset in [start, end)
    equal: int = 0
    counts: tuple[tuple[str, int], ...] = ()  # (kind, records), kinds with none left out
    first: tuple[Finding, ...] = ()  # the first of each kind
    not_verified: str = ""  # why the partition could not be checked ("": it was)

    @property
    def exact(self) -> bool:
        return not self.not_verified and not self.counts


@dataclass(frozen=True)
class VerifyResult:
    reports: tuple[PartitionReport, ...] = field(default=())
