"""The binary search that translates a source offset to a destination offset, on simulated
destinations: fan-in from several source partitions, batches, offsets the source never had."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from relay.translation import search

Copy = tuple[int, str, int]  # destination offset, source partition, source offset


def destination(feeds: dict[str, list[int]], batch: int, seed: int) -> list[list[Copy]]:
    """Batches of copies from several source partitions interleaved at random, each feed in
    its own order (one writer per source partition); destination offsets from 100."""
    rng = random.Random(seed)
    queues = {name: list(offsets) for name, offsets in feeds.items()}
    batches, offset = [], 100
    while any(queues.values()):
        name = rng.choice([n for n, q in queues.items() if q])
        size = min(len(queues[name]), rng.randint(1, batch))
        batches.append([(offset + i, name, queues[name].pop(0)) for i in range(size)])
        offset += size
    return batches


def next_copies_of(batches: list[list[Copy]], source: str):
    def next_copies(lower: int, upper: int) -> list[tuple[int, int]]:
        for batch in batches:
            found = [(d, s) for d, name, s in batch if name == source and lower <= d < upper]
            if found:
                return found
        return []

    return next_copies


def expected(batches: list[list[Copy]], source: str, offset: int, end: int) -> int:
    copies = [(d, s) for b in batches for d, name, s in b if name == source]
    return next((d for d, s in copies if s >= offset), end)


@pytest.mark.parametrize("seed", range(20))
def test_the_search_finds_the_first_copy_at_or_after_the_offset(seed: int) -> None:
    rng = random.Random(seed)
    # source offsets with gaps (filtered records, compaction, transaction markers)
    feeds = {
        name: sorted(rng.sample(range(1000), rng.randint(0, 120))) for name in ("p0", "p1", "p2")
    }
    batches = destination(feeds, batch=rng.choice([1, 5, 40]), seed=seed)
    end = 100 + sum(len(b) for b in batches)
    for source in feeds:
        for offset in [0, 1, 500, 999, 1000, *rng.sample(range(1000), 15)]:
            got = search(100, end, offset, next_copies_of(batches, source))
            assert got == expected(batches, source, offset, end), (source, offset)


def test_an_empty_destination_translates_to_its_end() -> None:
    assert search(7, 7, 3, next_copies_of([], "p0")) == 7


def test_many_searches_run_together_in_as_many_rounds_as_the_deepest_one(monkeypatch) -> None:
    """relay.translation.Translator.first_copies: every search of one round shares a fetch;
    each destination partition holds record-form copies (a ktm.src header on each record)."""
    from relay import translation
    from relay.batches import split_batches
    from tests.support.batches import Rec, make_batch

    dests = {("d", n): [(100 + i, o) for i, o in enumerate(range(0, 3000, 2))] for n in range(20)}
    batches = {}
    for dest, copies in dests.items():
        records = [Rec(d, 1, b"k", b"v", [("ktm.src", b"src/t/%d/%d" % (dest[1], o))])
                   for d, o in copies]  # fmt: skip
        data = b"".join(make_batch(records[i : i + 50]) for i in range(0, len(records), 50))
        batches[dest] = split_batches(data)[0]
    rounds: list[dict[Any, Any]] = []

    def fetch_ranges(fetcher: Any, ranges: dict[Any, tuple[int, int]], timeout: float) -> Any:
        rounds.append(ranges)
        return {k: [b for b in batches[k] if b.next_offset > lo and b.base_offset < hi]
                for k, (lo, hi) in ranges.items()}  # fmt: skip

    monkeypatch.setattr(translation, "fetch_ranges", fetch_ranges)
    monkeypatch.setattr(translation, "BatchFetcher", lambda *a: SimpleNamespace(close=lambda: 0))
    translator = translation.Translator(SimpleNamespace(), 1.0)  # type: ignore[arg-type]
    end = 100 + 1500
    asks = [
        (dest, ("t", dest[1]), offset, (100, end))
        for dest in dests
        for offset in (1, 777, 2999, 5000)
    ]
    found = translator.first_copies(asks)
    expect = [next((d for d, o in dests[dest] if o >= offset), end) for dest, _, offset, _ in asks]
    assert found == expect
    deepest = 0
    for ask in asks:
        rounds.clear()
        translation.Translator(SimpleNamespace(), 1.0).first_copies([ask])  # type: ignore[arg-type]
        deepest = max(deepest, len(rounds))
    rounds.clear()
    translation.Translator(SimpleNamespace(), 1.0).first_copies(asks)  # type: ignore[arg-type]
    # the four searches of a partition may queue for its one window a round; not 80 in a row
    assert len(rounds) <= 4 * deepest < len(asks)
