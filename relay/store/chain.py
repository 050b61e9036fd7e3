"""Which segments of a partition a restore replays, and which runs a compaction merges.

Pure functions over ChainLinks (a segment's name plus the offsets its metadata records).

A partition's segments form a chain: each one's start (the first offset it accounts for, at or
before its first record) is the previous one's next_offset. Offsets skipped *inside* a segment
(next_offset > last + 1: compaction of the source log, transaction
markers) are legal and never reported. Compaction merges a run of level-N segments into one
level-N+1 segment and then deletes the inputs; a crash in between leaves both, so a segment
contained in another one is superseded: the container is replayed, the contained one skipped,
and no record is replayed twice. Anything else that does not chain is a ChainProblem: a hole
(offsets no segment holds) or an overlap that containment does not explain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from relay.errors import KtmError
from relay.store.layout import SegmentRef
from relay.store.records import SegmentMeta


@dataclass(frozen=True)
class ChainLink:
    """One segment as the chain sees it; ``ref`` carries the store's ref through, if any."""

    key: str
    level: int
    first: int
    last: int
    next_offset: int
    count: int
    size: int | None = None
    modified: float | None = None  # Unix seconds
    ref: SegmentRef | None = field(default=None, compare=False, repr=False)
    start: int = -1  # -1: the same as first (see SegmentMeta.start)

    def __post_init__(self) -> None:
        if self.start == -1:
            object.__setattr__(self, "start", self.first)

    @classmethod
    def of(cls, ref: SegmentRef, meta: SegmentMeta) -> ChainLink:
        """A link from a listed ref and its metadata (store.read_meta(ref))."""
        return cls(
            ref.path,
            meta.level,
            meta.first,
            meta.last,
            meta.next_offset,
            meta.count,
            ref.size,
            ref.modified,
            ref,
            meta.start,
        )


@dataclass(frozen=True)
class ChainProblem:
    """A break in the chain: ``kind`` "hole" or "overlap", the offsets concerned, the keys."""

    kind: str
    first: int
    last: int
    keys: tuple[str, ...]

    def __str__(self) -> str:
        if self.kind == "hole" and len(self.keys) == 1:
            return f"offsets {self.first}-{self.last} are missing before {self.keys[0]}"
        if self.kind == "hole":
            return f"offsets {self.first}-{self.last} are missing between {' and '.join(self.keys)}"
        return (
            f"{' and '.join(self.keys)} both cover offsets {self.first}-{self.last} "
            "and neither contains the other"
        )


class ChainError(KtmError):
    """The segments of a partition do not chain: restoring would lose or repeat records."""

    def __init__(self, problems: Sequence[ChainProblem]):
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        super().__init__(f"broken segment chain: {problems[0]}{more}")
        self.problems = tuple(problems)


@dataclass(frozen=True)
class ChainPlan:
    links: tuple[ChainLink, ...]  # to replay, in offset order
    superseded: tuple[ChainLink, ...]  # contained in a link: leftovers of a crashed compaction
    problems: tuple[ChainProblem, ...]


def plan_chain(links: Iterable[ChainLink], *, start: int | None = None) -> ChainPlan:
    """The links to replay from ``start`` (default: the first segment's first offset) on.

    Never raises: problems are returned, so a check command can print all of them.
    """
    kept, superseded = _drop_contained(links)
    if start is not None:
        kept = [link for link in kept if link.next_offset > start]
    problems: list[ChainProblem] = []
    if kept and start is not None and kept[0].start > start:
        problems.append(ChainProblem("hole", start, kept[0].start - 1, (kept[0].key,)))
    for previous, link in pairwise(kept):
        keys = (previous.key, link.key)
        if link.start > previous.next_offset:
            problems.append(ChainProblem("hole", previous.next_offset, link.start - 1, keys))
        elif link.start < previous.next_offset:
            # Starts inside the previous segment's range (or its skipped offsets), ends after it.
            overlap_end = min(previous.next_offset - 1, link.last)
            problems.append(ChainProblem("overlap", link.start, overlap_end, keys))
    return ChainPlan(tuple(kept), tuple(superseded), tuple(problems))


def restore_chain(links: Iterable[ChainLink], *, start: int | None = None) -> list[ChainLink]:
    """The links to replay in offset order; ChainError naming every hole and overlap."""
    plan = plan_chain(links, start=start)
    if plan.problems:
        raise ChainError(plan.problems)
    return list(plan.links)


def _drop_contained(links: Iterable[ChainLink]) -> tuple[list[ChainLink], list[ChainLink]]:
    """Split links into (kept, superseded): a link inside another one's range is superseded.

    Ranges are [start, next_offset). Sorted by start, widest first, highest level first on a
    tie, a link is contained in an earlier one exactly when it ends no later than the last kept
    link, whose end is the furthest seen so far.
    """
    ordered = sorted(links, key=lambda link: (link.start, -link.next_offset, -link.level))
    kept: list[ChainLink] = []
    superseded: list[ChainLink] = []
    for link in ordered:
        if kept and link.next_offset <= kept[-1].next_offset:
            superseded.append(link)
        else:
            kept.append(link)
    return kept, superseded


def compaction_plan(
    links: Iterable[ChainLink],
    *,
    level: int,
    max_bytes: int | None = None,
    max_records: int | None = None,
    min_age: float = 0.0,
    now: float | None = None,
) -> list[list[ChainLink]]:
    """Runs of consecutive, contiguous level-``level`` links to merge into one level+1 segment.

    A run's total size stays <= ``max_bytes`` and its record count <= ``max_records`` (give at
    least one); only links at least ``min_age`` seconds old (by ``modified``; unknown counts as
    old) join a run; a run of one link is not worth merging and is left out. Superseded links
    never join: they are deleted, not merged.
    """
    if max_bytes is None and max_records is None:
        raise ValueError("compaction_plan needs max_bytes or max_records")
    plan = plan_chain(links)
    runs: list[list[ChainLink]] = []
    run: list[ChainLink] = []
    for link in plan.links:
        eligible = link.level == level and _old_enough(link, min_age, now)
        joins = eligible and run and run[-1].next_offset == link.start
        if joins and _fits(run + [link], max_bytes, max_records):
            run.append(link)
            continue
        if len(run) > 1:
            runs.append(run)
        run = [link] if eligible else []
    if len(run) > 1:
        runs.append(run)
    return runs


def _old_enough(link: ChainLink, min_age: float, now: float | None) -> bool:
    if min_age <= 0 or link.modified is None or now is None:
        return True
    return now - link.modified >= min_age


def _fits(run: list[ChainLink], max_bytes: int | None, max_records: int | None) -> bool:
    if max_records is not None and sum(link.count for link in run) > max_records:
        return False
    return max_bytes is None or sum(link.size or 0 for link in run) <= max_bytes


def merged_meta(metas: Sequence[SegmentMeta], *, level: int | None = None) -> SegmentMeta:
    """The metadata of the segment merging ``metas`` (a contiguous run, in order).

    ``level`` defaults to one above the inputs' level. ValueError if the inputs do not chain.
    """
    if not metas:
        raise ValueError("nothing to merge")
    head, tail = metas[0], metas[-1]
    source = (head.cluster, head.topic, head.partition)
    for previous, meta in pairwise(metas):
        if (meta.cluster, meta.topic, meta.partition) != source or (
            meta.start != previous.next_offset
        ):
            raise ValueError(
                f"segment {meta.first}-{meta.last} (start {meta.start}) does not follow "
                f"{previous.first}-{previous.last} (next offset {previous.next_offset}) of the "
                "same partition"
            )
    return SegmentMeta(
        cluster=head.cluster,
        topic=head.topic,
        partition=head.partition,
        level=head.level + 1 if level is None else level,
        first=head.first,
        last=tail.last,
        next_offset=tail.next_offset,
        count=sum(meta.count for meta in metas),
        min_timestamp=min(meta.min_timestamp for meta in metas),
        max_timestamp=max(meta.max_timestamp for meta in metas),
        start=head.start,
    )
