"""One source partition compared with the records ktm wrote for it, in one pass of each.

The copy is read in its own order; each of its records names the source offset it copies
(relay.pipelines.verify.records). A `Checker` per source partition takes those claims as they
come and reads the source alongside, only as far as the highest offset claimed so far: the
source records read but not yet claimed wait in `pending` (a record claimed later is out of
order; one never claimed is missing). So memory holds the records between the source's read
position and the copy's, not the partition.

A destination batch that copied a source batch whole is compared whole: every record but the
last as one run of bytes (the records part up to the last record), the last one as a record
(it carries the provenance header). Anything else, record by record.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator

from relay.batches.records import last_record_start, parse_at
from relay.pipelines.verify.records import (
    BatchClaim,
    Expected,
    Whole,
    copy_of,
    differing_field,
)
from relay.pipelines.verify.spec import (
    Copy,
    Feeder,
    FeederState,
    Finding,
    PartitionReport,
    Scope,
)

# Claimed offsets remembered to tell a second copy (duplicated) from a record no source explains
# (unexpected): a copy further back than this many claims is reported as unexpected.
RECENT = 100_000
# Source records read ahead of their claim; past this the oldest is reported missing (a
# destination this far out of order is not a copy anyone would call exact).
MAX_PENDING = 500_000


class NotVerified(Exception):
    """A source record could not be judged (a filter raised on it): the partition is reported
    as not verified, never as exact."""


class ClaimedRuns:
    """The source offsets claimed lately, as runs (claims mostly come in order, so a few runs
    hold many offsets): a claim of one of them again is a duplicate."""

    def __init__(self, runs: Iterable[tuple[int, int]] = ()):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._total = 0
        for first, last in runs:
            self._starts.append(first)
            self._ends.append(last)
            self._total += last - first + 1

    def add(self, offset: int) -> None:
        if self._ends and offset == self._ends[-1] + 1:
            self._ends[-1] = offset
        else:  # a gap, or out of order: a run of its own where it belongs
            at = bisect.bisect(self._starts, offset)
            self._starts.insert(at, offset)
            self._ends.insert(at, offset)
        self._total += 1
        self._trim()

    def _trim(self) -> None:
        while self._total > RECENT and len(self._starts) > 1:
            self._total -= self._ends[0] - self._starts.pop(0) + 1
            self._ends.pop(0)

    def add_run(self, first: int, last: int) -> None:
        """Offsets first..last, claimed in order after every offset claimed so far."""
        if self._ends and first == self._ends[-1] + 1:
            self._ends[-1] = last
        else:
            self._starts.append(first)
            self._ends.append(last)
        self._total += last - first + 1
        self._trim()

    def __contains__(self, offset: int) -> bool:
        at = bisect.bisect(self._starts, offset) - 1
        return at >= 0 and offset <= self._ends[at]

    def runs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._starts, self._ends, strict=True))


class Checker:
    """One source partition's check over [start, end): `claim` each destination record that
    names it, in destination order, then `finish` (the whole range is read). A check spread
    over passes hands its `state` from one to the next, `settle`d at the end of each."""

    def __init__(
        self,
        feeder: Feeder,
        dest: tuple[str, int],
        source: Iterator[Expected],
        scope: Scope,
        state: FeederState | None = None,
    ):
        self.feeder, self.dest, self.scope = feeder, dest, scope
        self._source = source
        self._held: Whole | None = None  # a whole source batch read and not taken yet
        self._cursor = feeder.start if state is None else state.cursor  # next offset not read
        self._pending: dict[int, Copy | None] = {}  # read, not claimed yet (in offset order)
        self._recent = ClaimedRuns()
        self._highest = -1
        self._below = (-1, 0)  # claims below the source's log start: (lowest offset, how many)
        self.compared = self.equal = 0
        self.counts: Counter[str] = Counter()
        self.first: dict[str, Finding] = {}
        self.not_verified = ""
        if state is not None:
            self._resume(state)

    def _resume(self, state: FeederState) -> None:
        r = state.report
        self._pending = dict(state.pending)
        self._recent = ClaimedRuns(state.recent)
        self._highest = state.highest
        self._below = state.below
        self.compared, self.equal, self.not_verified = r.compared, r.equal, r.not_verified
        self.counts = Counter(dict(r.counts))
        self.first = {f.kind: f for f in r.first}

    def claim(self, source_offset: int, dest_offset: int, got: Copy, where: str = "") -> None:
        if source_offset < self.feeder.start:  # older than the source's log: cannot be checked
            lowest, claims = self._below
            lowest = source_offset if lowest < 0 else min(lowest, source_offset)
            self._below = (lowest, claims + 1)
            return
        if self.not_verified or source_offset >= self.feeder.end:
            return  # outside the range checked (newer than the source's end read at start)
        if not self.scope.picked(self.feeder.key, source_offset):
            return  # --sample: a block of offsets not checked
        if not self._read_through(source_offset):
            return
        if source_offset not in self._pending:
            self.compared += 1
            kind = "duplicated" if source_offset in self._recent else "unexpected"
            self._found(kind, source_offset, dest_offset, where)
            return
        wanted = self._pending.pop(source_offset)
        if wanted is None:
            return  # outside the time window: not checked
        self.compared += 1
        self._recent.add(source_offset)
        if source_offset < self._highest:
            self._found("out_of_order", source_offset, dest_offset, where)
            return
        self._highest = source_offset
        differs = differing_field(wanted, got)
        if differs is not None:
            self._found(f"different:{differs}", source_offset, dest_offset, where)
        else:
            self.equal += 1

    def claim_whole(self, claim: BatchClaim) -> int | None:
        """A destination batch naming source offsets first..last, one per record: when the
        source batch of exactly those offsets comes next and the destination's records part
        holds its bytes up to its last record (a batch copied whole), all those records are
        equal; the last one is left to `claim`: returns where it starts in the destination's
        records part. None: compare it record by record."""
        first, last = claim.provenance.first, claim.provenance.last
        if self.not_verified or self._pending or self._cursor != first:
            return None
        if first < self.feeder.start or last >= self.feeder.end:
            return None
        item = self._held if self._held is not None else next(self._source, None)
        self._held = None
        if not isinstance(item, Whole):
            if item is not None:
                self._pending[item[0]] = item[1]
                self._cursor = item[0] + 1
            return None
        start = last_record_start(item.part, item.record_count)
        same = (item.first, item.last, item.first_timestamp, item.record_count) == (
            first,
            last,
            claim.first_timestamp,
            claim.record_count,
        ) and claim.part[:start] == item.part[:start]
        if not same:
            self._held = item
            return None
        self.compared += item.record_count - 1
        self.equal += item.record_count - 1
        if item.record_count > 1:
            self._recent.add_run(first, last - 1)
        self._highest = last - 1
        at = parse_at(item.part, start)
        self._pending[last] = copy_of(item.part, at, item.first_timestamp + at.timestamp_delta)
        self._cursor = last + 1
        return start

    def finish(self) -> PartitionReport:
        """Every source record never claimed is missing."""
        if self._read_through(self.feeder.end - 1):
            self._missing(self.feeder.end)
        return self.report()

    def settle(self, margin: int) -> FeederState:
        """The end of a pass: source records more than `margin` offsets below the highest one
        claimed are missing (a copy writes a partition in order; a later claim of one would
        be out of order); the rest, and where the source read stands, go to the next pass."""
        if not self.not_verified:
            self._missing(self._highest - margin)
        ahead = [o for o in self._pending if o > self._highest]
        cursor = ahead[0] if ahead else self._cursor  # re-read what lies past the highest claim
        for offset in ahead:
            del self._pending[offset]
        self._cursor = cursor
        return FeederState(
            self.report(),
            cursor,
            self._highest,
            tuple(self._pending.items()),
            self._recent.runs(),
            self._below,
        )

    @property
    def verified_next(self) -> int:
        """The first source offset not judged yet."""
        return next(iter(self._pending)) if self._pending else self._cursor

    def report(self) -> PartitionReport:
        return PartitionReport(
            self.feeder.key,
            self.dest,
            self.feeder.start,
            self.feeder.end,
            self.compared,
            self.equal,
            tuple(sorted(self.counts.items())),
            tuple(sorted(self.first.values(), key=lambda f: f.kind)),
            self.not_verified,
            deleted=self.deleted,
        )

    @property
    def deleted(self) -> int:
        """Offsets between the copy's oldest claim below the source's log start and that start
        which the copy lacks: retention deleted them at the source before they were copied (a
        copy holding the older ones would have copied these next). Offsets with no record
        (compaction, transaction markers) count too: the source no longer says which."""
        lowest, claims = self._below
        return 0 if lowest < 0 else max(0, self.feeder.start - lowest - claims)

    def _missing(self, before: int) -> None:
        for offset in [o for o in self._pending if o < before]:
            if self._pending.pop(offset) is not None:
                self._found("missing", offset, -1)

    def _read_through(self, offset: int) -> bool:
        """Read the source up to `offset` (included); False once the partition cannot be
        verified."""
        try:
            while self._cursor <= offset:
                found = self._held if self._held is not None else next(self._source, None)
                self._held = None
                if found is None:
                    self._cursor = max(self._cursor, min(offset + 1, self.feeder.end))
                    break
                for key, copy in found.records() if isinstance(found, Whole) else (found,):
                    self._take(key, copy)
        except NotVerified as exc:
            self.not_verified = str(exc)
        return not self.not_verified

    def _take(self, offset: int, copy: Copy | None) -> None:
        self._pending[offset] = copy
        self._cursor = offset + 1
        if len(self._pending) > MAX_PENDING:
            oldest = next(iter(self._pending))
            if self._pending.pop(oldest) is not None:
                self._found("missing", oldest, -1)

    def _found(self, kind: str, source_offset: int, dest_offset: int, where: str = "") -> None:
        self.counts[kind] += 1
        self.first.setdefault(kind, Finding(kind, source_offset, dest_offset, where))
