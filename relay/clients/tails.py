"""Reading ranges and tails of many partitions as record batches, all partitions at once.

Start-up reads the tail of every destination partition (where each source partition resumes),
and the group sync probes destination ranges. Read one partition after another, 2,000
partitions cost 2,000 round trips: 8 minutes over a 240 ms link. Here every partition still to
read is named in one fetch per leader, round after round, so the cost grows with the rounds
(the tail windows: a few), not with the partitions.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from relay.batches import SourceBatch, drop_aborted, split_batches
from relay.clients import admin
from relay.clients.batch_fetch import TP, BatchFetcher, Fetched
from relay.clients.kept import kept
from relay.config import ClusterConfig

RETRY_PAUSE = 0.05  # seconds: a leader moving or metadata refreshing, bounded by the deadline


def fetch_ranges(
    fetcher: BatchFetcher, ranges: Mapping[TP, tuple[int, int]], timeout: float
) -> dict[TP, list[SourceBatch]]:
    """For each partition, the whole batches holding its offsets in [lower, upper), in order
    (the first may begin before `lower`: a fetch starts at the batch holding its offset)."""
    out: dict[TP, list[SourceBatch]] = {key: [] for key in ranges}
    position = {key: lower for key, (lower, upper) in ranges.items() if lower < upper}
    deadline = time.monotonic() + timeout
    while position:
        if time.monotonic() > deadline:
            key = min(position)
            lower, upper = ranges[key]
            raise TimeoutError(f"reading {key[0]}[{key[1]}] {lower}..{upper} timed out")
        answers = fetcher.fetch(position, max(0.001, deadline - time.monotonic()))
        retry = False
        for key, fetched in answers.items():
            if fetched.error is not None:
                _retry_or_raise(fetched.error)
                retry = True
                continue
            position[key] = _take(fetched, position[key], ranges[key][1], out[key])
            if position[key] >= ranges[key][1]:
                del position[key]
        if retry:
            time.sleep(RETRY_PAUSE)
    return out


def stream_range(
    fetcher: BatchFetcher, key: TP, lower: int, upper: int, timeout: float
) -> Iterator[list[SourceBatch]]:
    """The whole batches holding offsets in [lower, upper), one fetch's worth at a time: a
    reader of a whole partition holds one fetch in memory, not the partition. `timeout`
    bounds each fetch (its retries included), not the whole read."""
    position = lower
    while position < upper:
        deadline = time.monotonic() + timeout
        while True:
            fetched = fetcher.fetch({key: position}, max(0.001, deadline - time.monotonic()))[key]
            if fetched.error is None:
                break
            _retry_or_raise(fetched.error)
            if time.monotonic() > deadline:
                raise fetched.error
            time.sleep(RETRY_PAUSE)
        got: list[SourceBatch] = []
        position = _take(fetched, position, upper, got)
        if got:
            yield got


def _take(fetched: Fetched, position: int, upper: int, out: list[SourceBatch]) -> int:
    """The batches of one answer from `position` on, below `upper`, into `out` (less those of
    aborted transactions under read_committed); returns the next position (`upper` once the
    range is read, or when what may be read ends before it)."""
    batches, _ = split_batches(fetched.data)
    for batch in drop_aborted(batches, fetched.aborted):
        if batch.base_offset >= upper:
            return upper
        if batch.next_offset > position:
            out.append(batch)
            position = batch.next_offset
    if batches:  # past the aborted batches at the end of the answer too
        return min(upper, max(position, batches[-1].next_offset))
    if position >= fetched.end:
        return upper  # nothing more to read (the end moved back, or an open transaction)
    return position


def _retry_or_raise(error: BaseException) -> None:
    if not getattr(error, "retriable", False):
        raise error


def fetch_range(
    fetcher: BatchFetcher, key: TP, lower: int, upper: int, timeout: float
) -> list[SourceBatch]:
    """`fetch_ranges` for one partition."""
    return fetch_ranges(fetcher, {key: (lower, upper)}, timeout)[key]


@dataclass
class _Tail:
    """A partition's tail read so far: `batches` hold the offsets from `upper` up to its end."""

    upper: int
    window: int
    batches: list[SourceBatch] = field(default_factory=list)


def read_tails(
    cluster: ClusterConfig,
    tps: list[TP],
    satisfied: Callable[[TP, list[SourceBatch]], bool],
    timeout: float,
    first_window: int = 500,
    max_records: int = 200_000,
) -> dict[TP, list[SourceBatch]]:
    """The tail of each partition as record batches, read backwards in growing windows until
    `satisfied(tp, batches)` says enough, the log start is reached, or `max_records` offsets
    were read; every partition still reading shares each round's fetches. What a leader
    appended and has not committed yet is waited for (relay.clients.committed): the tail
    decides where a copy resumes."""
    begin, end = admin.offset_bounds(cluster, tps, timeout, settled=True)
    tails = {key: _Tail(end[key], first_window) for key in tps}
    reading = {key for key in tps if end[key] > begin[key]}
    make = functools.partial(BatchFetcher, cluster, timeout)
    with kept(("fetcher", cluster, timeout), make, BatchFetcher.close) as fetcher:
        while reading:
            ranges = {
                k: (max(begin[k], tails[k].upper - tails[k].window), tails[k].upper)
                for k in reading
            }
            older = fetch_ranges(fetcher, ranges, timeout)
            for key in list(reading):
                tail, lower = tails[key], ranges[key][0]
                got = older[key]
                if tail.batches and got and got[-1].next_offset > tail.batches[0].base_offset:
                    got.pop()  # the batch holding `upper` was read with the later window
                tail.batches = got + tail.batches
                if satisfied(key, tail.batches) or end[key] - lower >= max_records:
                    reading.discard(key)
                tail.upper, tail.window = lower, tail.window * 4
                if lower <= begin[key]:
                    reading.discard(key)
    return {key: tail.batches for key, tail in tails.items()}
