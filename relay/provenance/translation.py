"""Source offsets to destination offsets, exactly, through provenance (`relay.provenance.copies`
has the rule of what a destination batch holds, in either header form).

A consumer group's committed source offset c translates to the destination offset of the first
record copied from a source offset >= c (the partition's end when there is none yet): a consumer
that resumes there reads no record twice and skips none. One writer per source partition keeps
its copies in source-offset order at the destination, even when several source partitions
share one destination partition (`dest:N`), so the search is a binary search over destination
batches: a few small fetches, not a scan. MirrorMaker 2 translates through sparse offset syncs
instead and may land before that point.

A compacted destination's log cleaner may remove the record that named a batch's source offsets
(`relay.provenance.copies`: the batch lost its provenance), and keeps the batch's survivors. The
search finds the first copy still named; the batches between it and the last named copy before
the offset are then looked at: where some lost their provenance, their survivors may be copies
of offsets at or after it, and the translation is the first of them (the consumer may read a few
records again, never skips one), unless it can be proved exactly: the destination partition has
one source partition, no other batch lies between, and the destination offsets between the two
named copies are as many as the source offsets between them (the cleaner keeps offsets), so each
destination offset there held the next source offset in turn.

Used by `ktm restore --groups` and by the relay's group sync (relay.pipelines.relay.group_sync).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import dataclass, field

from relay.batches import SourceBatch
from relay.batches.records import record_offsets
from relay.clients import admin
from relay.clients.batch_fetch import TP, BatchFetcher
from relay.clients.tails import fetch_ranges
from relay.config import ClusterConfig
from relay.provenance.copies import Pair, copies_in, provenance_lost
from relay.spec import SourcePartition

SCAN_WINDOW = 1000  # destination offsets read per fetch while looking for a source's next copy


def first_copy_at_or_after(
    cluster: ClusterConfig,
    dest: TP,
    source: SourcePartition,
    offset: int,
    timeout: float,
    sole: bool = False,
) -> int:
    """The destination offset in `dest` of the first copy of a record of `source` whose source
    offset is >= `offset`; the partition's end if there is none. `sole`: `source` is the only
    source partition copied into `dest`."""
    with closing(Translator(cluster, timeout, frozenset({dest} if sole else ()))) as translator:
        bounds = translator.bounds([dest])
        return translator.first_copy(dest, source, offset, bounds[dest])


# One search: the destination partition, the source partition, the committed source offset,
# and the destination's (beginning, end) to search within.
Ask = tuple[TP, SourcePartition, int, tuple[int, int]]
# A window one step of a search needs read: (destination partition, lower, upper offset)
Window = tuple[TP, int, int]


class Translator:
    """Many searches over one connection, run together: each step, every search that needs a
    destination window gets it in one fetch per leader with the others' (relay.clients.tails),
    so 2,000 searches cost the rounds of the deepest one, not 2,000 round trips. A window read
    once serves every search that needs it (many groups' searches of one partition start at
    the same middles)."""

    def __init__(self, cluster: ClusterConfig, timeout: float, sole: frozenset[TP] = frozenset()):
        """`sole`: the destination partitions one source partition alone is copied into."""
        self.cluster, self.timeout, self.sole = cluster, timeout, sole
        self._fetcher = BatchFetcher(cluster, timeout)
        self._windows: dict[Window, list[SourceBatch]] = {}

    def bounds(self, dests: list[TP]) -> dict[TP, tuple[int, int]]:
        """(beginning, end) of each destination partition, read now."""
        begin, end = admin.offset_bounds(self.cluster, dests, self.timeout)
        return {dest: (begin[dest], end[dest]) for dest in dests}

    def first_copy(
        self, dest: TP, source: SourcePartition, offset: int, bounds: tuple[int, int]
    ) -> int:
        """As `first_copy_at_or_after`, within `bounds`: `bounds[1]` when no copy lies there."""
        return self.first_copies([(dest, source, offset, bounds)])[0]

    def first_copies(self, asks: Sequence[Ask]) -> list[int]:
        """`first_copy` for each ask, the searches run together."""
        results: dict[int, int] = {}
        waiting: dict[int, tuple[SearchSteps, Window]] = {}
        for index, (dest, source, offset, (low, high)) in enumerate(asks):
            steps = search_steps(low, high, offset, source, dest, dest in self.sole)
            _advance(index, steps, None, waiting, results)
        while waiting:
            wanted: dict[TP, tuple[int, int]] = {}
            for _, (dest, lower, upper) in waiting.values():
                if (dest, lower, upper) not in self._windows:
                    wanted.setdefault(dest, (lower, upper))  # one window per partition a round
            fetched = fetch_ranges(self._fetcher, wanted, self.timeout) if wanted else {}
            for dest, (lower, upper) in wanted.items():
                self._windows[(dest, lower, upper)] = fetched[dest]
            for index, (steps, window) in list(waiting.items()):
                if window in self._windows:
                    _advance(index, steps, self._windows[window], waiting, results)
        return [results[index] for index in range(len(asks))]

    def close(self) -> None:
        self._fetcher.close()


SearchSteps = Generator[Window, list[SourceBatch], int]


def _advance(
    index: int,
    steps: SearchSteps,
    answer: list[SourceBatch] | None,
    waiting: dict[int, tuple[SearchSteps, Window]],
    results: dict[int, int],
) -> None:
    """Give a search the window it asked for (None: start it); note what it needs next, or its
    result."""
    try:
        window = steps.send(answer) if answer is not None else next(steps)
    except StopIteration as done:
        waiting.pop(index, None)
        results[index] = done.value
        return
    waiting[index] = (steps, window)


def search_steps(
    low: int, high: int, offset: int, source: SourcePartition, dest: TP, sole: bool = False
) -> SearchSteps:
    """`search` as steps: yields each destination window it needs read, is sent its batches,
    returns the destination offset. Then the batches before the copy found, back to the last
    copy of an earlier offset, for those that lost their provenance (see above)."""
    windows = _Windows(dest, low)

    def next_copies(lower: int, upper: int) -> Generator[Window, list[SourceBatch], list[Pair]]:
        position = lower
        while position < upper:
            window = min(upper, position + SCAN_WINDOW)
            batches = yield from windows.read(position, window)
            for batch in batches:
                found = [(d, s) for d, s in copies_in(batch, source) if lower <= d < upper]
                if found:
                    return found
            position = max(window, batches[-1].next_offset) if batches else window
        return []

    found, settled = yield from _search(low, high, offset, next_copies)
    at = found[0] if found else high
    if settled:
        return at
    gap = yield from _walk_back(at, low, offset, source, windows.below)
    return gap.settle(found, at, offset, sole)


class _Windows:
    """The windows one search of a destination partition read, each with every batch holding
    an offset of its range."""

    def __init__(self, dest: TP, low: int):
        self.dest, self.low = dest, low
        self.seen: list[tuple[int, int, list[SourceBatch]]] = []

    def read(
        self, lower: int, upper: int
    ) -> Generator[Window, list[SourceBatch], list[SourceBatch]]:
        batches = yield (self.dest, lower, upper)
        self.seen.append((lower, upper, batches))
        return batches

    def below(self, position: int) -> Generator[Window, list[SourceBatch], Below]:
        """The batches of a range just below `position` (and its lower offset): from a window
        read already, else read now."""
        for lower, upper, batches in self.seen:
            ends = max([upper] + [b.next_offset for b in batches[-1:]])
            if lower < position <= ends:
                return lower, [b for b in batches if b.base_offset < position]
        lower = max(self.low, position - SCAN_WINDOW)
        return lower, (yield from self.read(lower, position))


Below = tuple[int, list[SourceBatch]]  # a range's lower offset, and its batches below a point


def search(low: int, high: int, offset: int, next_copies: Callable[[int, int], list[Pair]]) -> int:
    """The binary search of `first_copy_at_or_after` over destination offsets [low, high):
    `next_copies(lower, upper)` gives the (destination, source) offsets of the copies in the
    first batch at or after `lower` that holds any, in order. Records of other sources may lie
    between the copies (`dest:N`), so a half without copies says nothing of the other."""

    def probe(lower: int, upper: int) -> Generator[Window, list[SourceBatch], list[Pair]]:
        return next_copies(lower, upper)
        yield  # a generator that asks for nothing: the callback answers at once

    steps = _search(low, high, offset, probe)
    try:
        next(steps)
    except StopIteration as done:
        found, _ = done.value
        return int(found[0]) if found else high
    raise AssertionError("a search by callback asked for a window")  # pragma: no cover


def _search(
    low: int,
    high: int,
    offset: int,
    next_copies: Callable[[int, int], Generator[Window, list[SourceBatch], list[Pair]]],
) -> Generator[Window, list[SourceBatch], tuple[Pair | None, bool]]:
    """The first named copy of `offset` or later (None: none), and whether the copy before it
    was found in the same batch (nothing can lie between them)."""
    best: Pair | None = None  # the first copy known to hold `offset` or later
    while low < high:
        middle = (low + high) // 2
        found = yield from next_copies(middle, high)
        if found and found[0][1] < offset:
            later = [(d, s) for d, s in found if s >= offset]
            if later:
                return later[0], True  # the copies before it all hold earlier source offsets
            low = found[-1][0] + 1  # every copy up to here holds an earlier source offset
            continue
        if found:
            best = found[0]  # no copy lies in [middle, found[0][0])
        high = middle
    return best, False


@dataclass
class Gap:
    """What lies between the last named copy of an earlier offset (`before`; None: none) and
    the one a search found: the batches that lost their provenance, in order, and whether any
    other batch lies there."""

    before: Pair | None = None
    lost: list[SourceBatch] = field(default_factory=list)
    other: bool = False

    def settle(self, found: Pair | None, at: int, offset: int, sole: bool) -> int:
        """The translation (`at`: the found copy's destination offset, or the end)."""
        survivors = [d for batch in self.lost for d in record_offsets(batch)]
        if not survivors:
            return at
        exact = self._exactly(found, at, offset) if sole else None
        return survivors[0] if exact is None else exact

    def _exactly(self, found: Pair | None, at: int, offset: int) -> int | None:
        """The first survivor copying `offset` or later, when the destination offsets between
        the two named copies match the source offsets between them one for one (every record
        between was a copy, in turn: none was filtered, nobody else wrote there); else
        None."""
        if self.other or self.before is None or found is None:
            return None
        (last, last_source), (first, first_source) = self.before, found
        if first - last != first_source - last_source:
            return None
        for batch in self.lost:
            for dest in record_offsets(batch):
                if last_source + dest - last >= offset:
                    return dest
        return at


def _walk_back(
    at: int,
    low: int,
    offset: int,
    source: SourcePartition,
    below: Callable[[int], Generator[Window, list[SourceBatch], Below]],
) -> Generator[Window, list[SourceBatch], Gap]:
    """The batches below destination offset `at`, newest first, back to one holding a named
    copy of `source` earlier than `offset` (or to `low`)."""
    gap, position = Gap(), at
    while position > low:
        lower, batches = yield from below(position)
        position = lower if not batches else position  # nothing there: a gap the cleaner left
        for batch in reversed(batches):
            earlier = [(d, s) for d, s in copies_in(batch, source) if d < at and s < offset]
            if earlier:
                gap.before = earlier[-1]
                gap.lost.reverse()
                return gap
            if batch.next_offset > at:
                pass  # the found copy's own batch, whose records before it are no copies
            elif provenance_lost(batch):
                gap.lost.append(batch)
            elif not batch.is_control:
                gap.other = True
            position = min(position, batch.base_offset)
    gap.lost.reverse()
    return gap
