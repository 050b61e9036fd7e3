"""What a verify task is given (the destination partitions it reads, and for each the source
partitions that feed it), and what it answers (ktm verify is a batch job)."""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field

from relay.config import ClusterConfig, StoreConfig
from relay.filters import FilterSpec
from relay.provenance.header import origin_topic
from relay.spec import SourcePartition

KINDS = ("missing", "duplicated", "different", "out_of_order", "unexpected")
SAMPLE_BLOCK = 1000  # --sample picks blocks of this many source offsets


@dataclass(frozen=True)
class Scope:
    """Which source records are checked: a deterministic fraction of blocks of offsets
    (`--sample`; the same blocks on every run) and a window of record timestamps
    (`--from-time`, `--until-time`: [from, until) in ms). Records outside are read, not
    checked, and claims of them are ignored."""

    sample: float = 1.0
    from_time: int | None = None
    until_time: int | None = None

    @property
    def everything(self) -> bool:
        return self.sample >= 1.0 and self.from_time is None and self.until_time is None

    def picked(self, key: SourcePartition, offset: int) -> bool:
        return self.sample >= 1.0 or _block_picked(key, offset // SAMPLE_BLOCK, self.sample)

    def picks_any(self, key: SourcePartition, first: int, next_offset: int) -> bool:
        """Whether any offset in [first, next_offset) is in a picked block."""
        if self.sample >= 1.0:
            return True
        blocks = range(first // SAMPLE_BLOCK, (next_offset - 1) // SAMPLE_BLOCK + 1)
        return any(_block_picked(key, block, self.sample) for block in blocks)

    def covers(self, topic: str, partition: int, offset: int, timestamp: int) -> bool:
        if self.from_time is not None and timestamp < self.from_time:
            return False
        if self.until_time is not None and timestamp >= self.until_time:
            return False
        return self.picked((topic, partition), offset)

    def describe(self) -> str:
        """What every output line says when not everything is checked ("" when it is)."""
        parts = []
        if self.sample < 1.0:
            parts.append(f"sampled {self.sample:.2%} of blocks of {SAMPLE_BLOCK} offsets")
        if self.from_time is not None or self.until_time is not None:
            parts.append(f"timestamps in [{self.from_time or '-'}, {self.until_time or '-'})")
        return ", ".join(parts)


@functools.lru_cache(maxsize=4096)
def _block_picked(key: SourcePartition, block: int, fraction: float) -> bool:
    """A block is picked by a hash of its partition and number (crc32: the same in every
    process, unlike hash())."""
    digest = zlib.crc32(f"{key[0]}/{key[1]}/{block}".encode())
    return digest < fraction * 2**32


OPEN = 2**62  # the end of a range that has none (--follow: up to what is there at each pass)
# A record as compared (relay.pipelines.verify.compare): its key, value and headers as framed,
# its timestamp (None: a LogAppendTime destination's, the broker's own time, not compared) and
# its timestamp type (-1: not compared).
Copy = tuple[bytes, int | None, int]


@dataclass(frozen=True)
class Feeder:
    """One source partition feeding a destination partition, checked over [start, end)."""

    key: SourcePartition
    start: int
    end: int
    incarnation: int = 0  # of the source topic (relay.provenance.header): its copies checked

    @property
    def origin(self) -> SourcePartition:
        """The feeder as its copies' provenance names it."""
        return origin_topic(self.key[0], self.incarnation), self.key[1]


@dataclass(frozen=True)
class DestWork:
    """One destination partition, read whole: from its log start to its end offset at
    start-up (OPEN with --follow: to its end at each pass)."""

    topic: str
    partition: int
    start: int
    end: int
    feeders: tuple[Feeder, ...]


@dataclass(frozen=True)
class VerifyTask:
    """One pass over some destination partitions, each from where its state says the last
    pass left it (None: from the start). Either side is a cluster or a store (`--store`: a
    backup's segments are the destination; `--from-store`: a restore's store is the
    source)."""

    source: ClusterConfig | StoreConfig
    target: ClusterConfig | StoreConfig
    clusters: tuple[str, ...]  # the names provenance may give the source (failover nodes)
    works: tuple[DestWork, ...]
    states: tuple[WorkState | None, ...]  # one per work
    filters: tuple[FilterSpec, ...] = ()
    timeout: float = 30.0  # seconds for one fetch, its retries included
    scope: Scope = Scope()
    budget: float = 0.0  # seconds a pass reads for before it hands its state back (0: no limit)
    follow: bool = False  # a running copy: settle each pass, never finish


@dataclass(frozen=True)
class Finding:
    """The first record of one kind of fault: its source offset and where the destination
    holds it (-1 where it holds none: a missing record)."""

    kind: str  # one of KINDS, "different" as "different:<field>"
    source_offset: int
    dest_offset: int
    where: str = ""  # in a store: the segment that holds it


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
    notes: tuple[str, ...] = ()  # a store's breaks in its chain of segments, said in words
    # source offsets below `start` the copy lacks though it holds older ones: deleted at the
    # source (retention) before they were copied. Not a fault of the copy: nothing can copy
    # them any more (see docs/verify.md)
    deleted: int = 0
    # destination records copying an earlier incarnation of the source topic (deleted and
    # created again at the source, and followed: relay.provenance.header); not compared,
    # that topic is gone
    earlier: int = 0

    @property
    def exact(self) -> bool:
        return not self.not_verified and not self.counts


@dataclass(frozen=True)
class FeederState:
    """Where one source partition's check stands between two passes: the source's read
    position, the records read and not claimed yet, the claims remembered to tell a second
    copy (runs of offsets), and the counts so far."""

    report: PartitionReport
    cursor: int  # the next source offset not read yet
    highest: int = -1  # the highest source offset claimed in order
    pending: tuple[tuple[int, Copy | None], ...] = ()
    recent: tuple[tuple[int, int], ...] = ()
    # claims of offsets below the source's log start: (the lowest offset, how many)
    below: tuple[int, int] = (-1, 0)


@dataclass(frozen=True)
class WorkState:
    """Where one destination partition's read stands between two passes."""

    dest_next: int  # the next destination offset to read (in a store: the next stored offset)
    feeders: tuple[FeederState, ...]  # in the order of DestWork.feeders
    stray: int = 0  # records naming no feeder
    first_stray: int = -1
    done: bool = False  # read to its end (never with --follow)

    def reports(self, work: DestWork) -> list[PartitionReport]:
        out = [f.report for f in self.feeders]
        if self.stray:
            first = Finding("unexpected", -1, self.first_stray)
            out.append(
                PartitionReport(
                    None,
                    (work.topic, work.partition),
                    0,
                    0,
                    self.stray,
                    0,
                    (("unexpected", self.stray),),
                    (first,),
                )
            )
        return out


@dataclass(frozen=True)
class VerifyResult:
    states: tuple[WorkState, ...] = field(default=())  # one per work of the task
    read: int = 0  # destination records read in this pass
